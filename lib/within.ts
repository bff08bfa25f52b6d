/** `work`, or a rejection once `ms` have passed without its answer (a dependency that stopped answering). */
export const within = <T>(work: Promise<T>, ms: number): Promise<T> =>
  Promise.race([work, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms).unref())]);
