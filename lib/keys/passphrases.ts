import type { Container } from '../container';
import { AppError } from '../errors';
import { emitEvent } from '../events';
import { spendThenCheck } from '../auth/limiters';
import { requireKey, requireManaged, unlockLineage, type KeyUse } from './key-catalog';
import type { UnlockKey } from '../lineage';
import { recordAudit, type RequestMeta } from '../../db/audit';
import type { KeyView } from '../../db/keys';

export type PassphraseAction = 'keys.decrypt' | 'keys.rotate' | 'keys.sign';

/**
 * The guessing budget of one caller on one key lineage: a teammate who inherits the key spends his
 * own, so no one's guesses can lock the owner (or another teammate) out of the key.
 */
export const passphraseBudgetKey = (lineageId: string, callerId: string) => `${lineageId}:${callerId}`;

/**
 * The one check of a key passphrase (decrypt, rotate, and any later use): a point of the caller's
 * guessing budget on the key (`limiters.passphrase`, per lineage and caller: 10 per 15 minutes) is
 * spent before argon2 runs, so parallel guesses never get more checks than the budget; a right
 * passphrase gets its point back. A wrong one is audited under the caller's action (reason
 * `wrong_passphrase`), reported to the key's owner (an audit row and event `keys.passphrase_failed`
 * naming the caller, never the guess) and answered 422 `wrong_passphrase`; past the budget, 429
 * `rate_limited` with Retry-After, without a check.
 */
export async function verifyKeyPassphrase(
  c: Container,
  input: { userId: string; view: KeyView; passphrase: string; action: PassphraseAction; meta: RequestMeta },
): Promise<UnlockKey> {
  const { view, meta } = input;
  requireManaged(view.lineage); // no passphrase opens a recipient key: nothing to guess, no point spent
  const audit = (reason: 'wrong_passphrase' | 'rate_limited') =>
    recordAudit(c.db, { user_id: input.userId, action: input.action, status: 'failure', target: view.named.fingerprint, details: { reason } }, meta);
  let wrong: AppError | undefined;
  let unlock: UnlockKey | null;
  try {
    unlock = await spendThenCheck(
      [{ limiter: c.limiters.passphrase, key: passphraseBudgetKey(view.lineage.id, input.userId) }],
      'Too many wrong passphrases for this key; wait before trying again.',
      () =>
        unlockLineage(c, view.lineage, input.passphrase).catch((err: unknown) => {
          if (!(err instanceof AppError && err.code === 'wrong_passphrase')) throw err;
          wrong = err;
          return null;
        }),
      (opened) => opened !== null,
    );
  } catch (err) {
    // Refused without a check: the key's budget is spent (audited: a denied attempt).
    if (err instanceof AppError && err.code === 'rate_limited') await audit('rate_limited');
    throw err;
  }
  if (unlock) return unlock;
  await audit('wrong_passphrase');
  await reportToOwner(c, input.userId, view, input.action, meta);
  throw wrong!;
}

/** A wrong passphrase on a key, told to its owner (whoever guessed, the owner included). */
async function reportToOwner(c: Container, callerId: string, view: KeyView, action: PassphraseAction, meta: RequestMeta): Promise<void> {
  const facts = { lineage_id: view.lineage.id, fingerprint: view.named.fingerprint, caller_user_id: callerId, action };
  await recordAudit(
    c.db,
    { user_id: view.lineage.user_id, action: 'keys.check_passphrase', status: 'failure', target: view.named.fingerprint, details: facts },
    meta,
  );
  await emitEvent(c, view.lineage.user_id, 'keys.passphrase_failed', facts);
}

const USES: Record<PassphraseAction, KeyUse> = { 'keys.decrypt': 'decrypt', 'keys.sign': 'sign', 'keys.rotate': 'manage' };

/**
 * The caller's key, found by any generation's fingerprint (404 otherwise), once `passphrase` has opened
 * it through verifyKeyPassphrase. Each call is a check (a point spent, argon2 run): a multipart route
 * runs it as its multipart `check`, which api/route.ts makes once per request, never checking twice.
 */
export async function requireKeyWithPassphrase(
  c: Container,
  input: { userId: string; fingerprint: string; passphrase: string; action: PassphraseAction; meta: RequestMeta },
): Promise<KeyView> {
  const view = await requireKey(c, input.userId, input.fingerprint, input.meta, USES[input.action]);
  await verifyKeyPassphrase(c, { userId: input.userId, view, passphrase: input.passphrase, action: input.action, meta: input.meta });
  return view;
}
