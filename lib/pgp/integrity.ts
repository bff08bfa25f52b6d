import { AppError, invalid } from '../errors';

/**
 * The one answer for a message whose decryption has begun and then failed. SEIPDv1 data is authenticated
 * only by its MDC at the end, so until then every decrypted octet may be an attacker's change; an answer
 * that depended on those octets (which inner packet, which length, whether it decompresses, how long it
 * takes) would tell whoever submits changed ciphertexts something about the plaintext, one query at a
 * time. So whatever failed once the session key was recovered (the MDC, a missing MDC, the inner packets
 * and their lengths, decompression and its size limit, truncation, a parser that stalls), the caller gets
 * this error, with nothing of the reason: the reason derives from unverified plaintext. A session key
 * packet that fails its own integrity check (a modified ECDH key wrap) answers it too.
 */
export function integrityFailure(): AppError {
  return invalid(
    'integrity_check_failed',
    'The message failed its integrity check: it was modified or damaged, or could not be read to its end within the limits.',
  );
}

/**
 * What the caller sees of `err`, raised once decryption has begun: the caller's own stop (`signal`'s
 * reason) and an error of the input stream itself (`inputError`, not an AppError: a storage error, which is
 * retried) come out unchanged; anything else is `integrityFailure()`.
 */
export function afterDecryption(err: unknown, passOn: { signal?: AbortSignal; inputError?: unknown } = {}): Error {
  const { signal, inputError } = passOn;
  if (signal?.aborted && err === signal.reason && err instanceof Error) return err;
  if (inputError !== undefined && err === inputError && err instanceof Error && !(err instanceof AppError)) return err;
  return integrityFailure();
}
