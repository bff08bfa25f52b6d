import type { Container } from '../container';
import { recordAudit, type AuditEntry, type RequestMeta } from '../../db/audit';
import { currentAuditAction } from '../event-names';

/**
 * The audit rows of refusals an outsider can repeat at will against someone else's account: a login (by
 * password or passkey) refused by the lockout, a password-reset mail refused by the account's budget, a
 * session token or managed API key presented after it was revoked, rotated out or expired (whoever kept a
 * stolen one after the owner's recovery).
 * Each episode of them writes two rows to the account's chain whatever the number of requests: its first
 * refusal's own row, and when the episode ends, one summary row with the count
 * (docs/auth-and-credentials.md, "Refusals are counted"). Rows without an account go to the system
 * chain, whose episode is shared by every unknown name.
 */
export type RefusalKind = 'lockout' | 'reset-mail' | 'stale-credential';

/** What the account's next password or passkey check that runs ends: its sign-in is the owner acting again. */
export const SIGN_IN_ENDS: readonly RefusalKind[] = ['lockout', 'stale-credential'];

const chainOf = (userId: string | null) => userId ?? 'system';

/** Audits one refusal: `entry` (with `details.reason`) is written when it opens an episode, otherwise only counted. */
export async function auditRefusal(c: Container, kind: RefusalKind, entry: AuditEntry & { details: { reason: string } }, meta: RequestMeta): Promise<void> {
  const place = await c.limiters.refusals
    .note(kind, chainOf(entry.user_id), { action: entry.action, reason: entry.details.reason }, c.clock.now())
    .catch((err: unknown) => {
      // Not counted, so in no summary: its own row keeps the evidence.
      c.log.warn({ err: (err as Error).message, kind }, 'refusal tally unavailable; the refusal is audited on its own');
      return 1;
    });
  if (place === 1) await recordAudit(c.db, entry, meta);
}

/**
 * Ends the open episode of `kind` on the account's chain, if any, with its summary row: the first
 * refusal's action and reason, and `refused` (every refusal of the episode, the first included) between
 * `first_refused_at` and `last_refused_at`. Written by what ended it: its request's address and ids.
 */
export async function endRefusals(c: Container, kinds: RefusalKind | readonly RefusalKind[], userId: string | null, meta: RequestMeta): Promise<void> {
  for (const kind of typeof kinds === 'string' ? [kinds] : kinds) await endEpisode(c, kind, userId, meta);
}

async function endEpisode(c: Container, kind: RefusalKind, userId: string | null, meta: RequestMeta): Promise<void> {
  const tally = await c.limiters.refusals.end(kind, chainOf(userId)).catch((err: unknown) => {
    // The tally stays in Redis: the next event that ends it writes the summary.
    c.log.warn({ err: (err as Error).message, kind }, 'refusal tally unavailable; its summary waits for the next event');
    return null;
  });
  if (!tally) return;
  const { action, reason, ...counts } = tally;
  // A tally opened before the names' scheme carries its legacy name.
  await recordAudit(c.db, { user_id: userId, action: currentAuditAction(action), status: 'failure', details: { reason, ...counts } }, meta);
}
