import { forbidden } from '../../lib/errors';
import { recordAuthDenied } from '../../lib/auth/authenticate';
import type { AppContext } from '../context';
import { requestMeta } from './request-context';

/** Admin-only resources refuse everyone else with 403, and the refusal is audited. */
export async function requireAdmin(ctx: AppContext, target: string): Promise<void> {
  if (ctx.state.user?.role === 'admin') return;
  await recordAuthDenied(ctx.container, ctx.state.user?.id ?? null, target, { reason: 'admin_required' }, requestMeta(ctx));
  throw forbidden('admin_required', 'This endpoint needs an administrator account.');
}
