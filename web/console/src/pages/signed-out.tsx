import { startAuthentication } from '@simplewebauthn/browser';
import { useEffect, useState } from 'preact/hooks';
import { api, ApiProblem, asJson, ok, type Schemas } from '../api';
import { fragmentToken, Link, navigate } from '../router';
import { useSession } from '../session';
import { CopyButton, Field, formValues, ProblemText, Submit, useAction } from '../ui';

/**
 * Where a sign-in or a registration returns to (a page that asked for it: an invitation link, a
 * re-sign-in). Kept in memory only, with the page's fragment (an invitation's token): it survives the
 * console's own navigation, never the address bar or the history.
 */
let returnTo: string | undefined;
/** The address a registration form starts with (the one an invitation was sent to). */
let registerEmail: string | undefined;
export function signInThenReturn(): void {
  returnTo = location.pathname + location.hash;
  navigate('/sign-in');
}
function registerThenReturn(email: string): void {
  returnTo = location.pathname + location.hash;
  registerEmail = email;
  navigate('/register');
}

export function SignIn() {
  const session = useSession();
  const password = useAction();
  const passkey = useAction();
  const [identifier, setIdentifier] = useState('');
  const done = async (token: string) => {
    const user = await session.adopt(token);
    const to = returnTo ?? '/keys';
    returnTo = undefined;
    navigate(to, true);
    return `Signed in as ${user.username}.`;
  };
  return (
    <>
      <h1>Sign in</h1>
      {session.user && returnTo && <p class="warning">Your sign-in is too old for that action: sign in again to go on.</p>}
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void password.run(async () => done((await ok(api.POST('/auth/login', { body: { identifier: v.identifier, password: v.password } }))).session.token));
        }}
      >
        <Field
          label="Username or email"
          name="identifier"
          autocomplete="username webauthn"
          required
          maxLength={254}
          value={identifier}
          onInput={(e) => setIdentifier(e.currentTarget.value)}
          action={password}
        />
        <Field label="Password" name="password" type="password" autocomplete="current-password" required maxLength={256} action={password} />
        <Submit action={password}>Sign in</Submit>
        <ProblemText action={password} />
      </form>
      <p>
        <button
          type="button"
          class="secondary"
          disabled={passkey.busy}
          onClick={() =>
            passkey.run(async () => {
              const begun = await ok(api.POST('/auth/passkeys/login/begin', { body: identifier.trim() ? { username: identifier.trim() } : {} }));
              // The API's schema names transports as strings; the library's type narrows them to its known names.
              const credential = await startAuthentication({ optionsJSON: begun.options as Parameters<typeof startAuthentication>[0]['optionsJSON'] });
              const finished = await ok(
                api.POST('/auth/passkeys/login/complete', { body: { challenge_id: begun.challenge_id, credential: asJson(credential) } }),
              );
              return done(finished.session.token);
            })
          }
        >
          Sign in with a passkey
        </button>
      </p>
      <ProblemText action={passkey} />
      <p>
        <Link href="/forgot-password">Forgot your password?</Link> · <Link href="/register">Register a partner account</Link> ·{' '}
        <Link href="/contact">Contact us</Link>
      </p>
    </>
  );
}

export function Register() {
  const session = useSession();
  const action = useAction();
  const [issued, setIssued] = useState<{ api_key: string; expires_at: string }>();
  const [email] = useState(() => registerEmail);
  const back = returnTo;
  if (issued) {
    return (
      <>
        <h1>Your partner API key</h1>
        <p class="warning" role="alert">
          This is the only time the key is shown. Copy it now and keep it somewhere safe: anyone holding it can use your account's keys.
        </p>
        <p class="secret" id="partner-key">
          {issued.api_key}
        </p>
        <p class="actions">
          <CopyButton text={issued.api_key} label="Copy the key" />
          <button
            type="button"
            onClick={() => {
              returnTo = registerEmail = undefined;
              navigate(back ?? '/keys');
            }}
          >
            {back ? 'I stored it: go back to the invitation' : 'I stored it: go to my keys'}
          </button>
        </p>
        <p class="muted">It expires {new Date(issued.expires_at).toLocaleDateString()}; rotate it from Credentials.</p>
      </>
    );
  }
  return (
    <>
      <h1>Register a partner account</h1>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            const made = await ok(
              api.POST('/partners/register', { body: { username: v.username, email: v.email, password: v.password, company_name: v.company_name || null } }),
            );
            await session.adopt(made.session.token);
            setIssued(made.partner_api_key);
          });
        }}
      >
        <Field label="Username" name="username" autocomplete="username" required minLength={3} maxLength={64} action={action} />
        <Field label="Email" name="email" type="email" autocomplete="email" required defaultValue={email} action={action} />
        <Field
          label="Password"
          name="password"
          type="password"
          autocomplete="new-password"
          required
          minLength={12}
          maxLength={256}
          hint="At least 12 characters."
          action={action}
        />
        <Field label="Company (optional)" name="company_name" autocomplete="organization" maxLength={200} action={action} />
        <Submit action={action}>Register</Submit>
        <ProblemText action={action} />
      </form>
      <p>
        <Link href="/sign-in">Already registered? Sign in</Link>
      </p>
    </>
  );
}

/** What a password reset ends (lib/accounts/user-accounts.ts resetPassword), said before it happens. */
function ResetWarning() {
  return (
    <p class="warning reset-warning">
      A password reset revokes your partner API key and every managed API key (their share links stop working), deactivates your passkeys and signs out every
      session. Clients using those keys stop working until you give them new ones; access you gave others shortly before is undone for you to review.
    </p>
  );
}

export function ForgotPassword() {
  const action = useAction();
  return (
    <>
      <h1>Forgot your password?</h1>
      <p>We email a link to set a new password to the account's address.</p>
      <ResetWarning />
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => (await ok(api.POST('/auth/forgot-password', { body: { email: v.email } }))).message);
        }}
      >
        <Field label="Email" name="email" type="email" autocomplete="email" required action={action} />
        <Submit action={action}>Send the reset email</Submit>
        <ProblemText action={action} />
      </form>
      <p>
        <Link href="/sign-in">Back to sign in</Link>
      </p>
    </>
  );
}

/** A page an emailed link opens: without a token in the fragment it says so instead of a form. */
function MissingToken({ what }: { what: string }) {
  return <p class="error">This page needs the {what} link from your email, with its token after the # sign. Open the link again, or copy it whole.</p>;
}

export function ResetPassword() {
  const action = useAction();
  const [token] = useState(fragmentToken);
  const [done, setDone] = useState(false);
  useEffect(() => {
    // The token stays in memory only: off the address bar, out of the history.
    if (token) history.replaceState(null, '', location.pathname);
  }, [token]);
  if (!token)
    return (
      <>
        <h1>Set a new password</h1>
        <MissingToken what="password reset" />
      </>
    );
  return (
    <>
      <h1>Set a new password</h1>
      {done ? (
        <p class="notice" role="status">
          Your password was changed and every session signed out. <Link href="/sign-in">Sign in with the new password</Link>.
        </p>
      ) : (
        <form
          onSubmit={(e) => {
            const v = formValues(e);
            void action.run(async () => {
              await ok(api.POST('/auth/reset-password', { body: { token, new_password: v.new_password } }));
              setDone(true);
            });
          }}
        >
          <ResetWarning />
          <Field
            label="New password"
            name="new_password"
            type="password"
            autocomplete="new-password"
            required
            minLength={12}
            maxLength={256}
            hint="At least 12 characters."
            action={action}
          />
          <Submit action={action}>Set the password</Submit>
          <ProblemText action={action} />
        </form>
      )}
    </>
  );
}

export function ConfirmEmail() {
  const session = useSession();
  const action = useAction();
  const [token] = useState(fragmentToken);
  useEffect(() => {
    if (!token) return;
    history.replaceState(null, '', location.pathname);
    void action.run(async () => {
      const user = await ok(api.POST('/profile/confirm-email', { body: { token } }));
      if (session.user) await session.refresh();
      return `Confirmed: your email address is ${user.email}.`;
    });
  }, [token]);
  return (
    <>
      <h1>Confirm your email address</h1>
      {!token ? <MissingToken what="confirmation" /> : action.busy ? <p role="status">Confirming…</p> : <ProblemText action={action} />}
      <p>
        <Link href={session.user ? '/profile' : '/sign-in'}>{session.user ? 'Back to your profile' : 'Sign in'}</Link>
      </p>
    </>
  );
}

type InvitationPreview = Schemas['OrganizationInvitationPreview'];

/** Who invited whom into which organization, as the lookup answers it (null: unknown, used, revoked or expired). */
function useInvitation(token: string | undefined) {
  const [preview, setPreview] = useState<InvitationPreview | null>();
  const [problem, setProblem] = useState<string>();
  useEffect(() => {
    if (!token) return;
    ok(api.POST('/organization/invitations/lookup', { body: { token } })).then(setPreview, (err: unknown) => {
      if (err instanceof ApiProblem && err.status === 404) setPreview(null);
      else setProblem(err instanceof Error ? err.message : String(err));
    });
  }, [token]);
  return { preview, problem };
}

export function AcceptInvitation() {
  const session = useSession();
  const action = useAction();
  const [token] = useState(fragmentToken);
  const { preview, problem } = useInvitation(token);
  if (!token)
    return (
      <>
        <h1>Accept an invitation</h1>
        <MissingToken what="invitation" />
      </>
    );
  if (preview === null)
    return (
      <>
        <h1>Accept an invitation</h1>
        <p class="error" role="alert">
          This invitation is not valid: it may have expired, been used or been revoked. Ask whoever invited you for a new one.
        </p>
      </>
    );
  return (
    <>
      <h1>Accept an invitation</h1>
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      {preview === undefined && !problem && <p role="status">Looking up the invitation…</p>}
      {preview && (
        <p>
          {preview.invited_by ? <strong>{preview.invited_by.username}</strong> : 'Someone'} invited <strong>{preview.email}</strong> to join the organization{' '}
          <strong>{preview.organization_name}</strong> as {preview.role}. The invitation expires{' '}
          <time dateTime={preview.expires_at}>{new Date(preview.expires_at).toLocaleString()}</time>.
        </p>
      )}
      {!session.user ? (
        <>
          <p>Accept it from an account with the invited email address: sign in to yours, or register one. You come back here afterwards.</p>
          <p class="actions">
            <button type="button" onClick={signInThenReturn}>
              Sign in to accept
            </button>
            <button type="button" class="secondary" onClick={() => registerThenReturn(preview?.email ?? '')}>
              Register to accept
            </button>
          </p>
        </>
      ) : (
        <>
          <p>
            Joining moves your account <strong>{session.user.username}</strong> into the inviting organization.
          </p>
          <button
            type="button"
            disabled={action.busy || Boolean(action.notice)}
            onClick={() =>
              action.run(async () => {
                const org = await ok(api.POST('/organization/invitations/accept', { body: { token } }));
                return `You joined "${org.name}" as ${org.role}.`;
              })
            }
          >
            Accept the invitation
          </button>
          <ProblemText action={action} />
          {action.notice && <Link href="/team">Go to your team</Link>}
        </>
      )}
    </>
  );
}

export function Contact() {
  const action = useAction();
  return (
    <>
      <h1>Contact us</h1>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            const r = await ok(api.POST('/auth/contact', { body: { name: v.name, email: v.email, subject: v.subject, message: v.message } }));
            (e.target as HTMLFormElement).reset();
            return `Thank you: your request reached support (reference ${r.reference}).`;
          });
        }}
      >
        <Field label="Your name" name="name" autocomplete="name" required maxLength={200} action={action} />
        <Field label="Email" name="email" type="email" autocomplete="email" required action={action} />
        <Field label="Subject" name="subject" required maxLength={200} action={action} />
        <label>
          Message
          <textarea name="message" required maxLength={10000} rows={6} aria-invalid={action.fields.message ? 'true' : undefined} />
          {action.fields.message && <span class="field-error">{action.fields.message}</span>}
        </label>
        <Submit action={action}>Send</Submit>
        <ProblemText action={action} />
      </form>
    </>
  );
}
