import { Agent, request } from 'node:http';
import { randomId, verdict } from './util';

export interface Latency {
  requests: number;
  p50: number;
  p99: number;
  /** Answers other than the expected status (should be 0), shed ones aside. */
  errors: number;
  /** Answered 503 `overloaded` at once (load shedding, DB_WAITING_LIMIT): not in the percentiles, which are of served requests. */
  shed?: number;
  /** CPU milliseconds per request of each process (the service's, Postgres, the bench), when measured. */
  cpuMs?: Record<string, number>;
  /** Median milliseconds of each step of a request, when it has steps (small jobs: see measureSmallJobs). */
  steps?: Record<string, number>;
}

/** CPU seconds so far of each process that serves the load (and of the bench that sends it). */
export type CpuReader = () => Record<string, number>;

export const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;

export function summarise(samples: number[], errors: number, shed = 0): Latency {
  const sorted = [...samples].sort((a, b) => a - b);
  return { requests: sorted.length, p50: percentile(sorted, 50), p99: percentile(sorted, 99), errors, ...(shed ? { shed } : {}) };
}

interface Answer {
  ms: number;
  ok: boolean;
  /** 503: the service shed the request (over capacity). */
  shed?: boolean;
}

/** CPU milliseconds each process spent per request between two readings. */
const cpuMsPer = (before: Record<string, number>, after: Record<string, number>, requests: number) =>
  Object.fromEntries(Object.entries(after).map(([k, v]) => [k, ((v - (before[k] ?? 0)) * 1000) / requests]));

/** A keep-alive GET as the load generators send it: resolves with its latency and whether the status was `expect`. */
export const timedGet = (agent: Agent, url: URL, headers: Record<string, string>, expect = 200): Promise<Answer> =>
  timedRequest(agent, 'GET', url, headers, undefined, expect);

/** timedGet for any method; `json`, when given, is the request's body. */
export function timedRequest(agent: Agent, method: string, url: URL, headers: Record<string, string>, json?: unknown, expect = 200): Promise<Answer> {
  const body = json === undefined ? undefined : JSON.stringify(json);
  const allHeaders = body === undefined ? headers : { ...headers, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) };
  return new Promise((resolve) => {
    const started = performance.now();
    const req = request({ method, host: url.hostname, port: url.port, path: url.pathname + url.search, agent, headers: allHeaders }, (res) => {
      res.resume();
      res.on('end', () => resolve({ ms: performance.now() - started, ok: res.statusCode === expect, shed: res.statusCode === 503 }));
    });
    req.on('error', () => resolve({ ms: performance.now() - started, ok: false }));
    req.end(body);
  });
}

/**
 * Open-loop load: `rate` requests per second for `seconds`, each leaving on schedule whether or not
 * the earlier ones have answered (a closed loop would slow down with the server and hide its queueing).
 */
export async function openLoop(
  rate: number,
  seconds: number,
  send: () => Promise<Answer>,
  into: { samples: number[]; errors: number; shed?: number },
): Promise<void> {
  const total = Math.round(rate * seconds);
  const start = performance.now();
  const inFlight: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const wait = start + (i * 1000) / rate - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    inFlight.push(
      send().then(({ ms, ok, shed }) => {
        if (shed) into.shed = (into.shed ?? 0) + 1;
        else {
          into.samples.push(ms);
          if (!ok) into.errors++;
        }
      }),
    );
  }
  await Promise.all(inFlight);
}

export async function call(
  base: string,
  method: string,
  path: string,
  body: unknown,
  token?: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${base}/api/v1${path}`, {
    method,
    headers: {
      ...(body instanceof FormData ? {} : { 'content-type': 'application/json' }),
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...headers,
    },
    body: body === undefined ? undefined : body instanceof FormData ? body : JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

/** A fresh account on the service: its session token, partner key and id. */
export async function benchAccount(base: string, kind: string): Promise<{ token: string; partnerKey: string }> {
  const id = randomId();
  const reg = await call(base, 'POST', '/partners/register', {
    username: `${kind}_${id}`,
    email: `${kind}-${id}@example.com`,
    password: `bench-password-${id}`,
    company_name: 'KMS bench',
  });
  if (reg.status !== 201) throw new Error(`register answered ${reg.status}`);
  return { token: (reg.json.session as { token: string }).token, partnerKey: (reg.json.partner_api_key as { api_key: string }).api_key };
}

/** `GET /keys/list` (10 keys in the account) at `rate` requests per second, after a second of warm-up. */
export async function measureListLatency(base: string, opts: { rate: number; seconds: number; cpu?: CpuReader }): Promise<Latency> {
  const { token } = await benchAccount(base, 'list');
  for (let i = 0; i < 10; i++) await generateKey(base, token);
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const acc = { samples: [] as number[], errors: 0, shed: 0 };
  const get = () => timedGet(agent, new URL(`${base}/api/v1/keys/list`), { authorization: `Bearer ${token}` });
  try {
    // Steady state: a first second at the same rate warms the JIT and the connections, and is not counted.
    await openLoop(opts.rate, 1, get, { samples: [], errors: 0 });
    const before = opts.cpu?.();
    await openLoop(opts.rate, opts.seconds, get, acc);
    const after = opts.cpu?.();
    const latency = summarise(acc.samples, acc.errors, acc.shed);
    // Per request answered, served or shed: a shed one costs a little too.
    if (before && after) latency.cpuMs = cpuMsPer(before, after, latency.requests + acc.shed);
    return latency;
  } finally {
    agent.destroy();
  }
}

async function generateKey(base: string, token: string): Promise<string> {
  const form = new FormData();
  for (const [k, v] of Object.entries({
    label: 'bench',
    name: 'KMS Bench',
    email: 'bench@example.com',
    passphrase: 'bench passphrase 0123',
    algorithm: 'curve25519',
  }))
    form.append(k, v);
  const res = await call(base, 'POST', '/keys/generate-key', form, token);
  if (res.status !== 201) throw new Error(`generate-key answered ${res.status}`);
  return res.json.fingerprint as string;
}

/** One timed series of small jobs; `cold`: the first ones, before the warm-up. */
export interface SmallJobs {
  concurrency: number;
  latency: Latency;
  cold?: boolean;
}

/**
 * Small jobs: a 1 KiB file encrypted with `Prefer: wait=30`, from submit to the finished result in the
 * answer, `jobs` times at each concurrency (closed loops: each client sends its next job when one ends).
 * As rotations are (sections.ts), they are timed after `warmupSeconds` of untimed jobs: until then
 * V8 is still compiling their path (a p50 of 20–24 ms at concurrency 1 over the first 50
 * jobs, 17 ms after 600). The first `jobs` at concurrency 1 are timed on their own, before the warm-up.
 */
export async function measureSmallJobs(
  base: string,
  opts: { concurrency: number[]; jobs: number; warmupSeconds: number; cpu?: CpuReader },
): Promise<SmallJobs[]> {
  const { token } = await benchAccount(base, 'small');
  const fingerprint = await generateKey(base, token);
  const data = new Blob([new Uint8Array(1024).fill(7)]);
  const one = async () => {
    const form = new FormData();
    form.append('fingerprint', fingerprint);
    form.append('files', data, 'small.bin');
    const started = performance.now();
    const sent = Date.now();
    const res = await call(base, 'POST', '/keys/encrypt', form, token, { prefer: 'wait=30' });
    const ms = performance.now() - started;
    const job = res.json as { state?: string; created_at?: string; started_at?: string; finished_at?: string };
    const ok = res.status === 200 && job.state === 'completed';
    // The service runs on the bench's host, so its clocks are the bench's: the job's timestamps split the
    // wait into its steps.
    const [created, running, finished] = [job.created_at, job.started_at, job.finished_at].map((t) => Date.parse(t ?? ''));
    const steps = ok ? { recorded: created - sent, queued: running - created, ran: finished - running, answered: sent + ms - finished } : undefined;
    return { ms, ok, steps };
  };
  /** `concurrency` clients sending jobs one after another until `more()` says no; what they measured. */
  const closedLoop = async (concurrency: number, more: () => boolean) => {
    const acc = { samples: [] as number[], errors: 0 };
    const steps: Record<string, number[]> = {};
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (more()) {
          const answer = await one();
          acc.samples.push(answer.ms);
          if (!answer.ok) acc.errors++;
          for (const [k, v] of Object.entries(answer.steps ?? {})) (steps[k] ??= []).push(v);
        }
      }),
    );
    const latency: Latency = summarise(acc.samples, acc.errors);
    latency.steps = Object.fromEntries(
      Object.entries(steps).map(([k, v]) => [
        k,
        percentile(
          [...v].sort((a, b) => a - b),
          50,
        ),
      ]),
    );
    return latency;
  };
  const timed = async (concurrency: number, cold?: boolean): Promise<SmallJobs> => {
    let left = opts.jobs;
    const before = opts.cpu?.();
    const latency = await closedLoop(concurrency, () => left-- > 0);
    const after = opts.cpu?.();
    if (before && after) latency.cpuMs = cpuMsPer(before, after, opts.jobs);
    return { concurrency, latency, ...(cold ? { cold } : {}) };
  };
  await one(); // the first job of a fresh worker (its crypto stack loads)
  const out = [await timed(1, true)];
  const until = Date.now() + opts.warmupSeconds * 1000;
  await closedLoop(Math.max(...opts.concurrency), () => Date.now() < until);
  for (const concurrency of opts.concurrency) out.push(await timed(concurrency));
  return out;
}

const fmt = (l: Latency) =>
  `p50 ${l.p50.toFixed(1)} ms · p99 ${l.p99.toFixed(1)} ms · ${l.requests} requests, ${l.errors} unexpected answers` +
  (l.shed ? `, ${l.shed} shed (503 overloaded, not in the percentiles)` : '') +
  (l.cpuMs
    ? ` · CPU ms per request: ${Object.entries(l.cpuMs)
        .map(([k, v]) => `${k} ${v.toFixed(2)}`)
        .join(' · ')}`
    : '') +
  (l.steps
    ? ` · median ms per step: ${Object.entries(l.steps)
        .map(([k, v]) => `${k} ${v.toFixed(0)}`)
        .join(' · ')}`
    : '');

/** The latency targets (docs/performance.md): `GET /keys/list` p99 ≤ 50 ms at 500 requests/s, a small job's p50 ≤ 20 ms on its own. */
const met = (value: number, goal: number) => verdict(value, '≤', goal, ' ms');

export function latencyLines(list: Latency, listRate: number, small: SmallJobs[]): string[] {
  return [
    `GET /keys/list at ${listRate} requests/s (open loop, 10 keys): ${fmt(list)}${listRate === 500 ? ` · p99 ${met(list.p99, 50)}` : ''}`,
    ...small.map((s) =>
      s.cold
        ? `1 KiB encrypt with Prefer: wait, the first ${s.latency.requests} before the warm-up, concurrency ${s.concurrency}: ${fmt(s.latency)}`
        : `1 KiB encrypt with Prefer: wait, submit → result, after the warm-up, concurrency ${s.concurrency}: ${fmt(s.latency)}${s.concurrency === 1 ? ` · p50 ${met(s.latency.p50, 20)}` : ''}`,
    ),
  ];
}
