import type { Container } from '../container';
import { AppError } from '../errors';
import { spendThenCheck } from '../auth/limiters';
import { unlockLineage } from './keys';
import type { UnlockKey } from '../lineage';
import { recordAudit, type RequestMeta } from '../../db/audit';
import type { KeyView } from '../../db/keys';

/**
 * The one check of a key passphrase (decrypt, rotate with a passphrase change, and any later use): a
 * point of the key's guessing budget is spent before argon2 runs, so parallel guesses never get more
 * tries than the limit (10 per key per 15 minutes); a right passphrase gets its point back. A wrong
 * one is audited under the caller's action and answered 422 `wrong_passphrase`; past the budget, 429.
 */
export async function verifyKeyPassphrase(
  c: Container,
  input: { userId: string; view: KeyView; passphrase: string; action: 'keys.decrypt' | 'keys.rotate'; meta: RequestMeta },
): Promise<UnlockKey> {
  const { view, meta } = input;
  let wrong: AppError | undefined;
  const unlock = await spendThenCheck(
    [{ limiter: c.limiters.passphrase, key: view.lineage.id }],
    'Too many wrong passphrases for this key; wait before trying again.',
    () =>
      unlockLineage(c, view.lineage, input.passphrase).catch((err: unknown) => {
        if (!(err instanceof AppError && err.code === 'wrong_passphrase')) throw err;
        wrong = err;
        return null;
      }),
    (opened) => opened !== null,
  );
  if (unlock) return unlock;
  await recordAudit(c.db, { user_id: input.userId, action: input.action, status: 'failure', target: view.named.fingerprint, ip: meta.ip, request_id: meta.requestId, details: { reason: 'wrong_passphrase' } });
  throw wrong!;
}
