import { Agent, request } from 'node:http';
import { randomId } from './util';

/** Latency of one credential kind at a fixed request rate (open loop: requests leave on schedule). */
export interface AuthLatency {
  credential: string;
  requests: number;
  p50: number;
  p99: number;
  /** Answers other than the expected status (should be 0). */
  errors: number;
}

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;

async function call(base: string, method: string, path: string, body: unknown, token?: string): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${base}/api/v1${path}`, {
    method,
    headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

/**
 * What authenticating a request costs per credential kind: `GET /auth/me` (one user lookup) at `rate`
 * requests per second over keep-alive connections, with a session JWT, the partner key and a managed API
 * key (and a managed key with a bad checksum, refused before any query). The kinds take turns in
 * `rounds` slices of `seconds`, so a noisy neighbour hits them alike.
 */
export async function measureAuthOverhead(base: string, opts: { rate: number; seconds: number; rounds: number }): Promise<AuthLatency[]> {
  const id = randomId();
  const reg = await call(base, 'POST', '/partners/register', { username: `auth_${id}`, email: `auth-${id}@example.com`, password: `bench-password-${id}`, company_name: 'KMS bench' });
  if (reg.status !== 201) throw new Error(`register answered ${reg.status}`);
  const jwt = (reg.json.session as { token: string }).token;
  const partner = (reg.json.partner_api_key as { api_key: string }).api_key;
  // One managed key per bench run: its per-key budget must not be what is measured.
  const made = await call(base, 'POST', '/api-keys/generate', { name: 'bench', scopes: ['account:read'] }, jwt);
  if (made.status !== 201) throw new Error(`api-keys/generate answered ${made.status}: ${JSON.stringify(made.json)}`);
  const managed = made.json.value as string;
  const mistyped = managed.slice(0, -1) + (managed.endsWith('A') ? 'B' : 'A');
  const kinds = [
    { credential: 'session JWT', token: jwt, expect: 200 },
    { credential: 'partner key', token: partner, expect: 200 },
    { credential: 'managed API key', token: managed, expect: 200 },
    { credential: 'mistyped managed key (401)', token: mistyped, expect: 401 },
  ];
  const samples = new Map<string, number[]>(kinds.map((k) => [k.credential, []]));
  const errors = new Map<string, number>(kinds.map((k) => [k.credential, 0]));
  const agent = new Agent({ keepAlive: true, maxSockets: 32 });
  const url = new URL(`${base}/api/v1/auth/me`);
  const one = (token: string, expect: number) =>
    new Promise<{ ms: number; ok: boolean }>((resolve) => {
      const started = performance.now();
      const req = request({ host: url.hostname, port: url.port, path: url.pathname, agent, headers: { authorization: `Bearer ${token}` } }, (res) => {
        res.resume();
        res.on('end', () => resolve({ ms: performance.now() - started, ok: res.statusCode === expect }));
      });
      req.on('error', () => resolve({ ms: performance.now() - started, ok: false }));
      req.end();
    });

  try {
    for (let round = 0; round < opts.rounds; round++) {
      for (const kind of kinds) {
        const total = Math.round(opts.rate * opts.seconds);
        const start = performance.now();
        const inFlight: Promise<void>[] = [];
        for (let i = 0; i < total; i++) {
          const due = start + (i * 1000) / opts.rate;
          const wait = due - performance.now();
          if (wait > 1) await new Promise((r) => setTimeout(r, wait));
          inFlight.push(
            one(kind.token, kind.expect).then(({ ms, ok }) => {
              samples.get(kind.credential)!.push(ms);
              if (!ok) errors.set(kind.credential, errors.get(kind.credential)! + 1);
            }),
          );
        }
        await Promise.all(inFlight);
      }
    }
  } finally {
    agent.destroy();
  }
  return kinds.map(({ credential }) => {
    const sorted = [...samples.get(credential)!].sort((a, b) => a - b);
    return { credential, requests: sorted.length, p50: percentile(sorted, 50), p99: percentile(sorted, 99), errors: errors.get(credential)! };
  });
}

export function authOverheadLines(rows: AuthLatency[], rate: number): string[] {
  const jwt = rows[0]!;
  return [
    `authentication cost per request, GET /auth/me at ${rate} requests/s (open loop, kinds taking turns):`,
    ...rows.map((r) => `  ${r.credential.padEnd(28)} p50 ${r.p50.toFixed(2)} ms · p99 ${r.p99.toFixed(2)} ms · vs JWT p50 ${(r.p50 - jwt.p50 >= 0 ? '+' : '')}${(r.p50 - jwt.p50).toFixed(2)} ms · ${r.requests} requests, ${r.errors} unexpected answers`),
  ];
}
