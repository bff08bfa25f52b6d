import type { RequestMeta } from '../../db/audit';

/**
 * Work done once per request: a multipart route checks before its upload (precheck) and again in its
 * handler, and both must see one lookup, one audit row, one spent point. Keyed by the request's `meta`
 * object and by what was asked (`id`): the same request asking about something else is answered anew.
 */
const done = new WeakMap<RequestMeta, Map<string, Promise<unknown>>>();

export function oncePerRequest<T>(meta: RequestMeta, id: string, work: () => Promise<T>): Promise<T> {
  let asked = done.get(meta);
  if (!asked) done.set(meta, (asked = new Map()));
  let answer = asked.get(id) as Promise<T> | undefined;
  if (!answer) asked.set(id, (answer = work()));
  return answer;
}
