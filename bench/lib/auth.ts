import { Agent } from 'node:http';
import { benchAccount, call, openLoop, summarise, timedGet, type Latency } from './latency';

/** Latency of one credential kind at a fixed request rate. */
export interface AuthLatency extends Latency {
  credential: string;
}

/**
 * What authenticating a request costs per credential kind: `GET /auth/me` (one user lookup) at `rate`
 * requests per second over keep-alive connections, with a session JWT, the partner key and a managed API
 * key (and a managed key with a bad checksum, refused before any query). The kinds take turns in
 * `rounds` slices of `seconds`, so a noisy neighbour hits them alike.
 */
export async function measureAuthOverhead(base: string, opts: { rate: number; seconds: number; rounds: number }): Promise<AuthLatency[]> {
  const { token: jwt, partnerKey } = await benchAccount(base, 'auth');
  // One managed key per bench run: its per-key budget must not be what is measured.
  const made = await call(base, 'POST', '/api-keys/generate', { name: 'bench', scopes: ['account:read'] }, jwt);
  if (made.status !== 201) throw new Error(`api-keys/generate answered ${made.status}: ${JSON.stringify(made.json)}`);
  const managed = made.json.value as string;
  const mistyped = managed.slice(0, -1) + (managed.endsWith('A') ? 'B' : 'A');
  const kinds = [
    { credential: 'session JWT', token: jwt, expect: 200 },
    { credential: 'partner key', token: partnerKey, expect: 200 },
    { credential: 'managed API key', token: managed, expect: 200 },
    { credential: 'mistyped managed key (401)', token: mistyped, expect: 401 },
  ];
  const acc = new Map(kinds.map((k) => [k.credential, { samples: [] as number[], errors: 0 }]));
  const agent = new Agent({ keepAlive: true, maxSockets: 32 });
  const url = new URL(`${base}/api/v1/auth/me`);
  try {
    for (let round = 0; round < opts.rounds; round++) {
      for (const kind of kinds)
        await openLoop(opts.rate, opts.seconds, () => timedGet(agent, url, { authorization: `Bearer ${kind.token}` }, kind.expect), acc.get(kind.credential)!);
    }
  } finally {
    agent.destroy();
  }
  return kinds.map(({ credential }) => ({ credential, ...summarise(acc.get(credential)!.samples, acc.get(credential)!.errors) }));
}

export function authOverheadLines(rows: AuthLatency[], rate: number): string[] {
  const jwt = rows[0];
  return [
    `authentication cost per request, GET /auth/me at ${rate} requests/s (open loop, kinds taking turns):`,
    ...rows.map(
      (r) =>
        `  ${r.credential.padEnd(28)} p50 ${r.p50.toFixed(2)} ms · p99 ${r.p99.toFixed(2)} ms · vs JWT p50 ${r.p50 - jwt.p50 >= 0 ? '+' : ''}${(r.p50 - jwt.p50).toFixed(2)} ms · ${r.requests} requests, ${r.errors} unexpected answers`,
    ),
  ];
}
