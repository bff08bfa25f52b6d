import type { Next } from 'koa';
import { waitingForConnection } from '../../db/knex';
import { AppError } from '../../lib/errors';
import type { AppContext } from '../context';

/** Readiness must tell the truth under load: a load balancer reads it to take the process out. */
const EXEMPT = new Set(['/api/v1/health', '/health']);

/**
 * Load shedding. Past capacity, an open-loop load makes requests queue for a Postgres connection without
 * bound: each queued request holds its memory, and every one of them answers late. When `limit` queries
 * of this process already wait for a connection, a new request is answered 503 `overloaded` with
 * Retry-After before it is parsed, authenticated or queued; requests already let in go on to finish.
 * Requests that only wait (SSE streams, `Prefer: wait`) or stream bytes hold no connection meanwhile, so
 * they never count against it.
 */
export function shedLoad(limit: number) {
  return async function shedLoad(ctx: AppContext, next: Next): Promise<void> {
    if (limit > 0 && waitingForConnection(ctx.container.db) >= limit && !EXEMPT.has(ctx.path)) {
      throw new AppError(503, 'overloaded', 'The service is at capacity; retry after the delay in Retry-After.', { headers: { 'Retry-After': '1' } });
    }
    await next();
  };
}
