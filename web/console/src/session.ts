import { createContext } from 'preact';
import { useContext } from 'preact/hooks';
import { api, ok, type Schemas } from './api';

export type User = Schemas['User'];

export interface Session {
  /** undefined while the console asks who is signed in, null when nobody is. */
  user: User | null | undefined;
  /** Keeps a session token from a sign-in in the HttpOnly cookie; the page then forgets the token. */
  adopt(token: string): Promise<User>;
  signOut(): Promise<void>;
  /** The API asked for a fresh sign-in (403 reauthentication_required): sign in, then come back here. */
  reauthenticate(): void;
  refresh(): Promise<void>;
}

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const s = useContext(SessionContext);
  if (!s) throw new Error('useSession outside SessionContext');
  return s;
}

/** Who the cookie signs in, or null. */
export async function whoAmI(): Promise<User | null> {
  const { data, response } = await api.GET('/auth/me');
  if (response.status === 401 || response.status === 403) return null;
  if (!data) throw new Error(`GET /auth/me answered ${response.status}`);
  return data;
}

export async function adoptToken(token: string): Promise<User> {
  const { user } = await ok(api.POST('/auth/session', { headers: { authorization: `Bearer ${token}` } }));
  return user;
}

export async function dropCookie(): Promise<void> {
  await ok(api.DELETE('/auth/session'));
}
