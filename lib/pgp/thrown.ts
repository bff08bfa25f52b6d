/** A thrown value as an Error: the value itself when it is one (so identity comparisons still hold). */
export function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}

/** A thrown value's message, for a log line or a problem's detail. */
export function errMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
