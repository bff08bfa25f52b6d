import { z } from 'zod';
import { route } from '../route';

const Check = z.enum(['up', 'down']);

/** Liveness is implied by any answer; readiness is the status code: 503 while Postgres or Redis is down. */
export default [
  route({
    method: 'get',
    path: '/health',
    summary: 'Health: 200 when the API and its dependencies (Postgres, Redis) answer, 503 otherwise',
    tags: ['Monitoring'],
    access: 'public',
    responses: {
      200: { description: 'Ready', schema: z.object({ status: z.enum(['ok', 'degraded']), checks: z.object({ postgres: Check, redis: Check }), uptime_seconds: z.number() }) },
      503: { description: 'A dependency is down', schema: z.object({ status: z.enum(['ok', 'degraded']), checks: z.object({ postgres: Check, redis: Check }), uptime_seconds: z.number() }) },
    },
    async handler({ c }) {
      const within = <T>(p: Promise<T>) => Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('timeout')), 2000).unref())]);
      const [postgres, redis] = await Promise.all([
        within(c.db.raw('select 1')).then(() => 'up' as const, () => 'down' as const),
        within(c.redis.ping()).then(() => 'up' as const, () => 'down' as const),
      ]);
      const ok = postgres === 'up' && redis === 'up';
      return {
        status: ok ? 200 : 503,
        headers: { 'Cache-Control': 'no-store' },
        body: { status: ok ? 'ok' : 'degraded', checks: { postgres, redis }, uptime_seconds: Math.round(process.uptime()) },
      };
    },
  }),
];
