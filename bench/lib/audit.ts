import { randomUUID } from 'node:crypto';
import { Agent } from 'node:http';
import { recordAudit } from '../../db/audit';
import { createDb, type Db } from '../../db/knex';
import { rowDigest } from '../../lib/audit-chain';
import { Api } from './client';
import { percentile, timedRequest, type CpuReader } from './latency';
import { rotateAll, timedRotations, type Bench, type RotatedKey, type Timing } from './sections';
import { serviceCpuReader, verdict } from './util';

/**
 * What the audit chain (migration 023) costs the service, measured against the same service without it in
 * one run: rotations per second, and an audit-heavy request load (settings changes that each write an audit
 * row, beside GET /audit-logs lists). Rounds alternate without and with the chain in the order off, on, on,
 * off, off, on… so that neither side is always the later one (the tables grow, the host's noise drifts), and
 * each round starts from the same state: the audit tables emptied (for the lists, a fixed history written back), vacuumed.
 * Each figure is printed as a rate (wall time: on a shared host, mostly what the neighbours left) and as CPU per
 * rotation or request of the service's processes and of the Postgres backends of its database (steadier: what
 * the chain itself adds).
 *
 * "Without" is the bench's own database with the chain's two triggers disabled (setChain): the insert as it
 * was before the chain. recordAudit still computes each row's digest in Node then, so that part of the cost
 * is measured apart, in this process (digestCost).
 */

/** Accounts whose keys are rotated and whose audit trails are read. */
const ACCOUNTS = 4;
/** Keys per account rotated all at once, ACCOUNTS × this per batch (as the scheduler's sweep enqueues every due key). */
const ROTATED_KEYS = 10;
/** Batches of rotations in one round. */
const ROTATION_BATCHES = 10;
/** Untimed rotations first: V8 compiles the rotation path for about this long (bench/README.md, `rotation`). */
const ROTATION_WARMUP_MS = 10_000;
/** Clients of the request load, closed loop; each changes the settings of a key of its own. */
const LOAD_CLIENTS = 16;
const LOAD_SECONDS = 6;
const LOAD_WARMUP_SECONDS = 3;
/** Audit rows each account holds at the start of a round (its list's total grows from there). */
const HISTORY_ROWS = 1000;
/** The rounds each side gets at least (`--runs` more). */
const MIN_ROUNDS = 5;

/** The target: with the chain at least this fraction of the rate without it. */
const WITHIN = 0.9;

type Side = 'without' | 'with';

const progress = (line: string) => console.error(`[bench] audit: ${line}`);

/**
 * The chain on or off on this database. Off: its two triggers disabled and the digest optional (an insert as
 * it was before the chain), and constant defaults for `sequence` and `hash`, so that rows written meanwhile
 * read back as chained ones do (GET /audit-logs answers both); a constant default costs an insert nothing.
 */
export async function setChain(db: Db, on: boolean): Promise<void> {
  for (const t of ['audit_logs_digest', 'audit_logs_chain']) await db.raw(`ALTER TABLE audit_logs ${on ? 'ENABLE' : 'DISABLE'} TRIGGER ${t}`);
  await db.raw(`ALTER TABLE audit_logs ALTER COLUMN digest ${on ? 'SET' : 'DROP'} NOT NULL`);
  await db.raw(
    on
      ? 'ALTER TABLE audit_logs ALTER COLUMN sequence DROP DEFAULT, ALTER COLUMN hash DROP DEFAULT'
      : `ALTER TABLE audit_logs ALTER COLUMN sequence SET DEFAULT 0, ALTER COLUMN hash SET DEFAULT '${'0'.repeat(64)}'`,
  );
}

/** An audit row as the service writes many: an encryption's, with a job id and counts. */
export const sampleEntry = (userId: string, i: number) => ({
  user_id: userId,
  action: 'keys.encrypt' as const,
  status: 'success' as const,
  target: 'a'.repeat(40),
  ip: '203.0.113.7',
  request_id: randomUUID(),
  details: { job_id: randomUUID(), files: 1, bytes: 1_048_576 + i, recipient: 'stored' },
});

interface Account {
  api: Api;
  userId: string;
}

/** One client of the request load: its account and a key whose settings it flips. */
interface LoadClient {
  account: Account;
  fingerprint: string;
  /** The key's min_decryption_generation now: the client sets the other of 1 and 2. */
  min: number;
}

interface LoadRound {
  requests: number;
  ms: number;
  /** Latencies of each kind of request (ms). */
  samples: Record<string, number[]>;
  errors: number;
  /** CPU milliseconds per request of each process. */
  cpuMs: Record<string, number>;
}

interface AuditChainCost {
  rounds: number;
  rotationWorkers: number;
  rotations: Record<Side, Timing[]>;
  /** Audit rows the service wrote per rotation (counted after a round). */
  rowsPerRotation: number;
  load: Record<Side, LoadRound[]>;
  /** recordAudit's digest (JCS + SHA-256) of a typical row, in this process. */
  digestUs: number;
}

/** The `audit` section: both measurements, printed. */
export async function auditSection(b: Bench): Promise<Record<string, never>> {
  for (const line of auditChainLines(await measureAuditChain(b))) console.log(line);
  return {};
}

async function measureAuditChain(b: Bench): Promise<AuditChainCost> {
  const db = createDb(b.service.databaseUrl, { max: 4 });
  try {
    if (b.service.workerCount('rotation') === 0) await b.service.addWorker('rotation=4');
    const accounts: Account[] = [];
    for (let i = 0; i < ACCOUNTS; i++) {
      const api = new Api(b.service.baseUrl);
      await api.register();
      const me = (await (await fetch(`${b.service.baseUrl}/api/v1/auth/me`, { headers: api.auth() })).json()) as { user_id: string };
      accounts.push({ api, userId: me.user_id });
    }
    const rotated: RotatedKey[] = [];
    const clients: LoadClient[] = [];
    for (const [i, account] of accounts.entries()) {
      for (let k = 0; k < ROTATED_KEYS; k++) rotated.push({ api: account.api, fingerprint: await account.api.generateKey(b.passphrase) });
      for (let k = i; k < LOAD_CLIENTS; k += ACCOUNTS) clients.push({ account, fingerprint: await account.api.generateKey(b.passphrase), min: 1 });
    }
    // A second generation, so that min_decryption_generation can move between 1 and 2.
    await rotateAll(
      b,
      clients.map((c) => ({ api: c.account.api, fingerprint: c.fingerprint })),
    );

    const rounds = Math.max(MIN_ROUNDS, b.runs);
    const order = Array.from({ length: 2 * rounds }, (_, i): Side => (Math.floor((i + 1) / 2) % 2 === 0 ? 'without' : 'with'));
    /** The same start for every round: the chain as `side` says, the audit tables emptied (the history written back for the lists), vacuumed. */
    const prepare = async (side: Side, history: boolean) => {
      await db.raw('TRUNCATE audit_logs, audit_chains');
      await setChain(db, side === 'with');
      if (!history) return b.service.vacuum();
      // The history without its audit_logs.recorded events: thousands at one commit would queue the API's relay
      // (a query each) for the first seconds of the round.
      await db.raw('ALTER TABLE audit_logs DISABLE TRIGGER audit_logs_notify');
      for (const a of accounts)
        await db.transaction(async (trx) => {
          for (let i = 0; i < HISTORY_ROWS; i++) await recordAudit(trx, sampleEntry(a.userId, i));
        });
      await db.raw('ALTER TABLE audit_logs ENABLE TRIGGER audit_logs_notify');
      await b.service.vacuum();
    };

    const rotations: Record<Side, Timing[]> = { without: [], with: [] };
    let rowsPerRotation = 0;
    for (const until = Date.now() + ROTATION_WARMUP_MS; Date.now() < until;) await rotateAll(b, rotated);
    for (const [i, side] of order.entries()) {
      progress(`rotations, round ${i + 1} of ${order.length}: ${side} the chain`);
      await prepare(side, false);
      const t = await timedRotations(b, () => rotateAll(b, rotated), ROTATION_BATCHES);
      rotations[side].push(t);
      const [{ n }] = (await db('audit_logs')
        .whereIn(
          'user_id',
          accounts.map((a) => a.userId),
        )
        .count({ n: '*' })) as [{ n: number }];
      rowsPerRotation = n / t.bytes;
    }

    const load: Record<Side, LoadRound[]> = { without: [], with: [] };
    const agent = new Agent({ keepAlive: true, maxSockets: LOAD_CLIENTS });
    try {
      await requestLoad(b.service.baseUrl, agent, clients, LOAD_WARMUP_SECONDS);
      for (const [i, side] of order.entries()) {
        progress(`request load, round ${i + 1} of ${order.length}: ${side} the chain`);
        await prepare(side, true);
        const round = await requestLoad(b.service.baseUrl, agent, clients, LOAD_SECONDS, serviceCpuReader(b.service));
        load[side].push(round);
      }
    } finally {
      agent.destroy();
    }
    return { rounds, rotationWorkers: b.service.workerCount('rotation'), rotations, rowsPerRotation, load, digestUs: digestCost() };
  } finally {
    await setChain(db, true).catch(() => undefined);
    await db.destroy();
  }
}

/**
 * The request load: each client in a loop changes its key's settings (one audit row, in the change's
 * transaction) and reads its account's audit trail twice (the first page, and the key actions), for
 * `seconds`. Closed loop: the rate is what the service sustains.
 */
async function requestLoad(base: string, agent: Agent, clients: LoadClient[], seconds: number, cpu?: CpuReader): Promise<LoadRound> {
  const samples: Record<string, number[]> = { 'PATCH settings': [], 'GET /audit-logs': [], 'GET /audit-logs?action=keys.*': [] };
  let errors = 0;
  const timed = async (kind: string, send: Promise<{ ms: number; ok: boolean }>) => {
    const { ms, ok } = await send;
    samples[kind].push(ms);
    if (!ok) errors++;
  };
  const before = cpu?.();
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(
    clients.map(async (c) => {
      const auth = c.account.api.auth();
      while (performance.now() < deadline) {
        c.min = 3 - c.min;
        await timed(
          'PATCH settings',
          timedRequest(agent, 'PATCH', new URL(`${base}/api/v1/keys/${c.fingerprint}/settings`), auth, { min_decryption_generation: c.min }),
        );
        await timed('GET /audit-logs', timedRequest(agent, 'GET', new URL(`${base}/api/v1/audit-logs`), auth));
        await timed('GET /audit-logs?action=keys.*', timedRequest(agent, 'GET', new URL(`${base}/api/v1/audit-logs?action=keys.*`), auth));
      }
    }),
  );
  const ms = performance.now() - started;
  const after = cpu?.();
  const requests = Object.values(samples).reduce((n, s) => n + s.length, 0);
  const cpuMs = before && after ? Object.fromEntries(Object.entries(after).map(([k, v]) => [k, ((v - (before[k] ?? 0)) * 1000) / requests])) : {};
  return { requests, ms, samples, errors, cpuMs };
}

/** Microseconds per row of recordAudit's digest (JCS + SHA-256 of the row's content), over about half a second. */
function digestCost(): number {
  const entry = sampleEntry(randomUUID(), 1);
  const content = { action: entry.action, status: entry.status, target: entry.target, ip: entry.ip, request_id: entry.request_id, details: entry.details };
  for (let i = 0; i < 2000; i++) rowDigest(content);
  let n = 0;
  const started = performance.now();
  while (performance.now() - started < 500) for (let i = 0; i < 1000; i++, n++) rowDigest(content);
  return ((performance.now() - started) * 1000) / n;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const rotationRate = (t: Timing) => t.bytes / (t.ms / 1000);
const loadRate = (r: LoadRound) => r.requests / (r.ms / 1000);
/** CPU ms per unit of each process, the median over rounds. */
const medianCpu = (perRound: Record<string, number>[]) =>
  Object.fromEntries([...new Set(perRound.flatMap(Object.keys))].map((k) => [k, median(perRound.map((c) => c[k] ?? 0))]));
/** The service's processes and Postgres, the bench client left out. */
const serviceTotal = (cpu: Record<string, number>) => Object.entries(cpu).reduce((n, [k, v]) => n + (k === 'bench' ? 0 : v), 0);
/** The rate ratio CPU alone would give: without's CPU per unit ÷ with's. */
const cpuRatio = (without: Record<string, number>, withChain: Record<string, number>) => serviceTotal(without) / serviceTotal(withChain);
const cpuLine = (without: Record<string, number>, withChain: Record<string, number>) =>
  Object.keys({ ...without, ...withChain })
    .filter((k) => (without[k] ?? 0) >= 0.005 || (withChain[k] ?? 0) >= 0.005)
    .map((k) => `${k} ${(without[k] ?? 0).toFixed(2)} → ${(withChain[k] ?? 0).toFixed(2)}`)
    .join(' · ') +
  ` · service and Postgres together ${serviceTotal(without).toFixed(2)} → ${serviceTotal(withChain).toFixed(2)} (×${(serviceTotal(withChain) / serviceTotal(without)).toFixed(2)})`;

function auditChainLines(r: AuditChainCost): string[] {
  const rot = { without: r.rotations.without.map(rotationRate), with: r.rotations.with.map(rotationRate) };
  const load = { without: r.load.without.map(loadRate), with: r.load.with.map(loadRate) };
  const ratio = (x: Record<Side, number[]>) => median(x.with) / median(x.without);
  const best = (x: Record<Side, number[]>) =>
    `best ${Math.max(...x.without).toFixed(0)} → ${Math.max(...x.with).toFixed(0)} (${(Math.max(...x.with) / Math.max(...x.without)).toFixed(2)})`;
  const rounds = (x: number[]) => x.map((v) => v.toFixed(0)).join(', ');
  const rotCpu = (side: Side) =>
    medianCpu(r.rotations[side].map((t) => Object.fromEntries(Object.entries(t.cpu ?? {}).map(([k, s]) => [k, (s * 1000) / t.bytes]))));
  const loadCpu = (side: Side) => medianCpu(r.load[side].map((l) => l.cpuMs));
  const latency = (side: Side, kind: string) => {
    const all = r.load[side].flatMap((l) => l.samples[kind] ?? []).sort((a, b) => a - b);
    return `${percentile(all, 50).toFixed(1)}/${percentile(all, 99).toFixed(1)}`;
  };
  const kinds = Object.keys(r.load.with[0]?.samples ?? {});
  const errors = [...r.load.without, ...r.load.with].reduce((n, l) => n + l.errors, 0);
  const rotationCpuMs = serviceTotal(rotCpu('with'));
  return [
    `audit chain, without and with: ${r.rounds} rounds each, alternating (off, on, on, off, …), each on emptied audit tables (the load's with ${HISTORY_ROWS} rows per account written back), vacuumed; medians of the rounds, [each round]`,
    `  rotations (${ACCOUNTS} accounts × ${ROTATED_KEYS} keys rotated at once, ${ROTATION_BATCHES} batches a round, ${r.rotationWorkers} rotation worker(s) at rotation=4, ${r.rowsPerRotation.toFixed(1)} audit rows per rotation): without ${median(rot.without).toFixed(0)}/s [${rounds(rot.without)}] · with ${median(rot.with).toFixed(0)}/s [${rounds(rot.with)}] · with ÷ without ${ratio(rot).toFixed(2)} ${verdict(ratio(rot), '≥', WITHIN)} · ${best(rot)}`,
    `    CPU ms per rotation without → with: ${cpuLine(rotCpu('without'), rotCpu('with'))} · at this CPU, with ÷ without ${cpuRatio(rotCpu('without'), rotCpu('with')).toFixed(2)} ${verdict(cpuRatio(rotCpu('without'), rotCpu('with')), '≥', WITHIN)}`,
    `  audit-heavy load (${LOAD_CLIENTS} clients in a closed loop over ${ACCOUNTS} accounts, each: PATCH /keys/{fp}/settings (one audit row), GET /audit-logs, GET /audit-logs?action=keys.*; ${LOAD_SECONDS} s a round): without ${median(load.without).toFixed(0)} requests/s [${rounds(load.without)}] · with ${median(load.with).toFixed(0)}/s [${rounds(load.with)}] · with ÷ without ${ratio(load).toFixed(2)} ${verdict(ratio(load), '≥', WITHIN)} · ${best(load)} · ${errors} unexpected answers`,
    `    p50/p99 ms over all rounds without → with: ${kinds.map((k) => `${k} ${latency('without', k)} → ${latency('with', k)}`).join(' · ')}`,
    `    CPU ms per request without → with: ${cpuLine(loadCpu('without'), loadCpu('with'))} · at this CPU, with ÷ without ${cpuRatio(loadCpu('without'), loadCpu('with')).toFixed(2)} ${verdict(cpuRatio(loadCpu('without'), loadCpu('with')), '≥', WITHIN)}`,
    `  in both: recordAudit's digest in Node (JCS + SHA-256 of a row's content) ${r.digestUs.toFixed(1)} µs a row in this process (${Math.round(1e6 / r.digestUs)}/s), ${((r.digestUs * r.rowsPerRotation) / (rotationCpuMs * 10)).toFixed(2)} % of a rotation's ${rotationCpuMs.toFixed(1)} CPU ms (service and Postgres)`,
  ];
}
