import { render, type ComponentType } from 'preact';
import { useEffect, useMemo, useState } from 'preact/hooks';
import type { ConsolePath } from './paths';
import { Link, navigate, usePath } from './router';
import { adoptToken, dropCookie, SessionContext, whoAmI, type Session, type User } from './session';
import { AcceptInvitation, ConfirmEmail, Contact, ForgotPassword, Register, ResetPassword, SignIn, signInThenReturn } from './pages/signed-out';
import { Keys } from './pages/keys';
import { Files } from './pages/files';
import { Activity } from './pages/activity';
import { Profile } from './pages/profile';
import { Admin } from './pages/admin';
import { Credentials } from './pages/credentials';
import { Team } from './pages/team';
import { RecoveryReview } from './pages/recovery-review';
import { labelTableCells } from './layout';

interface Page {
  title: string;
  component: ComponentType;
  /** Who may open it: anyone, a signed-in user, an administrator. */
  access: 'anyone' | 'user' | 'admin';
  /** Listed in the navigation of a signed-in user. */
  nav?: boolean;
}

/** Every page by path; api/pages.ts serves the shell at exactly CONSOLE_PATHS, which this map must cover. */
const PAGES: Record<Exclude<ConsolePath, '/'>, Page> = {
  '/sign-in': { title: 'Sign in', component: SignIn, access: 'anyone' },
  '/register': { title: 'Register', component: Register, access: 'anyone' },
  '/forgot-password': { title: 'Forgot password', component: ForgotPassword, access: 'anyone' },
  '/reset-password': { title: 'Reset password', component: ResetPassword, access: 'anyone' },
  '/confirm-email': { title: 'Confirm email', component: ConfirmEmail, access: 'anyone' },
  '/accept-invitation': { title: 'Accept invitation', component: AcceptInvitation, access: 'anyone' },
  '/contact': { title: 'Contact', component: Contact, access: 'anyone' },
  '/keys': { title: 'Keys', component: Keys, access: 'user', nav: true },
  '/files': { title: 'Files', component: Files, access: 'user', nav: true },
  '/activity': { title: 'Activity', component: Activity, access: 'user', nav: true },
  '/credentials': { title: 'Credentials', component: Credentials, access: 'user', nav: true },
  '/team': { title: 'Team and billing', component: Team, access: 'user', nav: true },
  '/profile': { title: 'Profile', component: Profile, access: 'user', nav: true },
  '/recovery-review': { title: 'Review after recovery', component: RecoveryReview, access: 'user' },
  '/admin': { title: 'Administration', component: Admin, access: 'admin', nav: true },
};

function App() {
  const path = usePath();
  const [user, setUser] = useState<User | null | undefined>(undefined);
  const session = useMemo<Session>(
    () => ({
      user,
      async adopt(token) {
        const u = await adoptToken(token);
        setUser(u);
        return u;
      },
      async signOut() {
        await dropCookie();
        setUser(null);
      },
      reauthenticate: signInThenReturn,
      async refresh() {
        setUser(await whoAmI());
      },
    }),
    [user],
  );
  useEffect(() => void session.refresh(), []);

  const page = path === '/' ? undefined : PAGES[path as keyof typeof PAGES];
  useEffect(() => {
    if (user === undefined) return;
    if (path === '/' || !page) navigate(user ? '/keys' : '/sign-in', true);
    else if (page.access !== 'anyone' && !user) navigate('/sign-in', true);
  }, [path, user]);
  useEffect(() => {
    document.title = page ? `${page.title} · KMS console` : 'KMS console';
  }, [page]);

  if (user === undefined || !page || (page.access !== 'anyone' && !user)) {
    return <p role="status">Loading the console…</p>;
  }
  const Component = page.access === 'admin' && user?.role !== 'admin' ? NotAdmin : page.component;
  return (
    <SessionContext.Provider value={session}>
      <header class="top">
        <strong>KMS</strong>
        <nav aria-label="Console">
          <ul>
            {user
              ? Object.entries(PAGES)
                  .filter(([, p]) => p.nav && (p.access !== 'admin' || user.role === 'admin'))
                  .map(([href, p]) => (
                    <li key={href}>
                      <Link href={href} current={href === path}>
                        {p.title}
                      </Link>
                    </li>
                  ))
              : [
                  <li key="in">
                    <Link href="/sign-in" current={path === '/sign-in'}>
                      Sign in
                    </Link>
                  </li>,
                  <li key="reg">
                    <Link href="/register" current={path === '/register'}>
                      Register
                    </Link>
                  </li>,
                ]}
          </ul>
        </nav>
        {user && (
          <span class="who">
            {user.username}{' '}
            <button
              type="button"
              class="secondary"
              onClick={async () => {
                await session.signOut();
                navigate('/sign-in');
              }}
            >
              Sign out
            </button>
          </span>
        )}
      </header>
      <main id="main" tabIndex={-1} class={page.access === 'anyone' ? 'narrow' : undefined}>
        <Component />
      </main>
    </SessionContext.Provider>
  );
}

function NotAdmin() {
  return <p class="error">This page is for administrators.</p>;
}

const root = document.getElementById('app')!;
labelTableCells(root);
render(<App />, root);
