import { createHash } from 'node:crypto';
import { oncePerRequest } from './once-per-request';
import type { Container } from '../container';
import { AppError } from '../errors';
import { spendThenCheck } from '../auth/limiters';
import { requireKey, unlockLineage } from './keys';
import type { UnlockKey } from '../lineage';
import { recordAudit, type RequestMeta } from '../../db/audit';
import type { KeyView } from '../../db/keys';

export type PassphraseAction = 'keys.decrypt' | 'keys.rotate';

/**
 * The one check of a key passphrase (decrypt, rotate, and any later use): a point of the key's guessing
 * budget (`limiters.passphrase`, per lineage: 10 per 15 minutes) is spent before argon2 runs, so
 * parallel guesses never get more checks than the budget; a right passphrase gets its point back. A
 * wrong one is audited under the caller's action (reason `wrong_passphrase`) and answered 422
 * `wrong_passphrase`; past the budget, 429 `rate_limited` with Retry-After, without a check.
 */
export async function verifyKeyPassphrase(
  c: Container,
  input: { userId: string; view: KeyView; passphrase: string; action: PassphraseAction; meta: RequestMeta },
): Promise<UnlockKey> {
  const { view, meta } = input;
  const audit = (reason: 'wrong_passphrase' | 'rate_limited') =>
    recordAudit(c.db, { user_id: input.userId, action: input.action, status: 'failure', target: view.named.fingerprint, ip: meta.ip, request_id: meta.requestId, details: { reason } });
  let wrong: AppError | undefined;
  let unlock: UnlockKey | null;
  try {
    unlock = await spendThenCheck(
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
  } catch (err) {
    // Refused without a check: the key's budget is spent (audited: a denied attempt).
    if (err instanceof AppError && err.code === 'rate_limited') await audit('rate_limited');
    throw err;
  }
  if (unlock) return unlock;
  await audit('wrong_passphrase');
  throw wrong!;
}

/**
 * The caller's key, found by any generation's fingerprint (404 otherwise), once `passphrase` has opened
 * it through verifyKeyPassphrase; at most one check per request for the same key and passphrase.
 */
export function requireKeyWithPassphrase(c: Container, input: { userId: string; fingerprint: string; passphrase: string; action: PassphraseAction; meta: RequestMeta }): Promise<KeyView> {
  // One check per request (decrypt's pre-upload check and its handler): one point spent, argon2 run once.
  const id = createHash('sha256').update(JSON.stringify(['passphrase', input.userId, input.fingerprint.toLowerCase(), input.passphrase, input.action])).digest('base64url');
  return oncePerRequest(input.meta, id, async () => {
    const view = await requireKey(c, input.userId, input.fingerprint, input.meta, input.action === 'keys.decrypt' ? 'decrypt' : 'manage');
    await verifyKeyPassphrase(c, { userId: input.userId, view, passphrase: input.passphrase, action: input.action, meta: input.meta });
    return view;
  });
}
