import type { ParameterizedContext } from 'koa';
import type { Container } from '../lib/container';
import type { Logger } from '../lib/logger';
import type { Scope } from '../lib/auth/scopes';

/** Who may call a route (api/route.ts): anyone, any credential, a browser session, or an administrator. */
export type Access = 'public' | 'auth' | 'session' | 'admin';

export interface AuthUser {
  id: string;
  username: string;
  email: string;
  role: 'user' | 'admin';
  /** How the caller proved who it is: a session token, the partner API key, or a managed API key. */
  via: 'jwt' | 'partner_key' | 'api_key';
  /** With `via: 'api_key'`: which managed key, and what it may do (route() checks the route's scope). */
  apiKey?: { id: string; scopes: readonly Scope[] };
  /** With `via: 'jwt'`: when the user signed in (password or passkey) to get the session. */
  signedInAt?: Date;
}

export interface AppState {
  /** The service's own id of the request (logs, problem bodies, audit rows, jobs). */
  requestId: string;
  /** The client's X-Request-Id when it is plain and short (api/middleware/request-context.ts), recorded beside ours. */
  clientRequestId?: string;
  log: Logger;
  user?: AuthUser;
  /** The job this request recorded: a problem answered after that names it, so the client can follow it. */
  jobId?: string;
}
export type AppContext = ParameterizedContext<AppState> & { container: Container };
