import { request } from 'node:http';
import { Redis } from 'ioredis';
import { publishEvents } from '../../lib/event-stream';
import { randomId } from './util';

export interface EventLatency {
  clients: number;
  events: number;
  /** Milliseconds from XADD (the publish of lib/events.ts) to the frame arriving at an SSE client. */
  p50: number;
  p99: number;
  max: number;
  /** Frames that did not arrive within the wait (should be 0). */
  lost: number;
  /** Redis connections the API process opened for its live clients (connected_clients after − before). */
  redisConnections: number;
}

const connectedClients = async (redis: Redis) => Number(/connected_clients:(\d+)/.exec(await redis.info('clients'))?.[1]);

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;

/**
 * Event delivery latency with many live clients: `clients` SSE connections to one API process on one
 * account, then `events` events published `intervalMs` apart the way the service publishes them. Each
 * frame's latency is its arrival minus its publish, both on this process's clock.
 */
export async function measureEventLatency(
  base: string,
  redisPrefix: string,
  opts: { clients: number; events: number; intervalMs: number },
): Promise<EventLatency> {
  const id = randomId();
  const register = await fetch(`${base}/api/v1/partners/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: `events_${id}`, email: `events-${id}@example.com`, password: `bench-password-${id}`, company_name: 'KMS bench' }),
  });
  if (register.status !== 201) throw new Error(`register answered ${register.status}: ${await register.text()}`);
  const { user, session } = (await register.json()) as { user: { user_id: string }; session: { token: string } };

  const redis = new Redis('redis://127.0.0.1:6379');
  const connectionsBefore = await connectedClients(redis);
  const sentAt = new Map<number, number>();
  const latencies: number[] = [];
  let ready = 0;
  const streams = Array.from({ length: opts.clients }, () => {
    const req = request(
      `${base}/api/v1/events?types=keys.generated`,
      { headers: { authorization: `Bearer ${session.token}`, accept: 'text/event-stream' }, agent: false },
      (res) => {
        let buffered = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          const now = performance.now();
          buffered += chunk;
          let cut;
          while ((cut = buffered.indexOf('\n\n')) >= 0) {
            const frame = buffered.slice(0, cut);
            buffered = buffered.slice(cut + 2);
            if (frame.startsWith('retry:')) ready++;
            const data = /^data: (.*)$/m.exec(frame)?.[1];
            if (!data) continue;
            const seq = (JSON.parse(data) as { data: { seq: number } }).data.seq;
            latencies.push(now - sentAt.get(seq)!);
          }
        });
      },
    );
    req.end();
    return req;
  });
  const deadline = Date.now() + 30_000;
  while (ready < opts.clients) {
    if (Date.now() > deadline) throw new Error(`only ${ready} of ${opts.clients} SSE clients connected`);
    await new Promise((r) => setTimeout(r, 20));
  }
  // The live loop starts after the replay: give every stream a moment to reach XREAD BLOCK.
  await new Promise((r) => setTimeout(r, 500));
  const redisConnections = (await connectedClients(redis)) - connectionsBefore;

  try {
    for (let seq = 0; seq < opts.events; seq++) {
      sentAt.set(seq, performance.now());
      await publishEvents(redis, redisPrefix, user.user_id, [{ type: 'keys.generated', data: { seq } }], new Date());
      await new Promise((r) => setTimeout(r, opts.intervalMs));
    }
    const expected = opts.clients * opts.events;
    const until = Date.now() + 10_000;
    while (latencies.length < expected && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    const sorted = [...latencies].sort((a, b) => a - b);
    return {
      clients: opts.clients,
      events: opts.events,
      p50: percentile(sorted, 50),
      p99: percentile(sorted, 99),
      max: sorted.at(-1) ?? NaN,
      lost: expected - latencies.length,
      redisConnections,
    };
  } finally {
    redis.disconnect();
    for (const s of streams) s.destroy();
  }
}

export const eventLatencyLine = (r: EventLatency) =>
  `event delivery (publish → SSE client), ${r.clients} clients × ${r.events} events: p50 ${r.p50.toFixed(1)} ms · p99 ${r.p99.toFixed(1)} ms · max ${r.max.toFixed(1)} ms · lost ${r.lost} · Redis connections for them ${r.redisConnections}`;
