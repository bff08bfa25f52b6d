import type { Knex } from 'knex';
import type { Config } from '../config';
import { prepareDatabase } from '../main';
import { openDatabase } from '../../db/knex';
import { recordAudit, type AuditStatus } from '../../db/audit';
import { parsePkcs11Uri, pkcs11RootId } from './pkcs11-uri';
import { createContainer, type Container } from '../container';
import { RootKeyError } from './root-key';
import { initPkcs11Root } from './pkcs11-root';
import { behindText, keyUsage, KeyringRefusal, processKeyrings, resealProgress, retireDataKey, rewrapKeyring, rotateDataKey, totalUses } from './operations';
import { liveProcesses, processName, takingQueue } from '../heartbeats';
import type { KeyringRow } from './keyring';
import { QUEUES } from '../../jobs/define';

export const MASTER_KEY_USAGE = 'npm run admin -- master-key init | status [--json] | rotate [--force] | reseal [--force] | retire <kid> | rewrap';

/** The flags each command takes. */
const FLAGS: Record<string, string[]> = { status: ['--json'], rotate: ['--force'], reseal: ['--force'] };

/**
 * Jobs not yet run (or being retried) whose payload carries a value sealed under `kid`: job payloads
 * live in Redis only and are not re-sealed, so the key stays until they have run.
 */
async function queuedSeals(c: Container, kid: string): Promise<number> {
  let n = 0;
  for (const name of QUEUES) {
    const jobs = await c.jobs.queue(name).getJobs(['waiting', 'delayed', 'active', 'prioritized', 'waiting-children']);
    n += jobs.filter((job) => JSON.stringify(job.data).includes(`s1.${kid}.`)).length;
  }
  return n;
}

/** The state of the keyring as `master-key status` prints it (and GET /status summarises it). */
async function keyringStatus(c: Container) {
  const [rows, usage, reseal, beats] = await Promise.all([
    c.db<KeyringRow>('keyring').orderBy('created_at'),
    keyUsage(c.db),
    resealProgress(c.db),
    liveProcesses(c.redis, c.config.redisPrefix),
  ]);
  const current = c.keyring.current().kid;
  return {
    root_id: c.keyring.roots.currentId,
    current_kid: current,
    keys: rows.map((r) => ({
      kid: r.kid,
      root_id: r.root_id,
      current: r.kid === current,
      current_from: r.current_from,
      retired_at: r.retired_at,
      uses: totalUses(usage, r.kid),
      uses_by_column: usage[r.kid] ?? {},
    })),
    reseal: reseal ?? null,
    processes: processKeyrings(beats, current),
  };
}

/**
 * Refuses to enqueue a re-seal where no live worker takes the `maintenance` queue on this Redis and
 * prefix (the job would wait there unseen, its run at 0 for ever), unless `force`: then it warns on
 * stderr. Answers whether it goes on without one.
 */
async function requireMaintenanceWorker(c: Container, force: boolean): Promise<boolean> {
  if (takingQueue(await liveProcesses(c.redis, c.config.redisPrefix), 'maintenance').length) return false;
  const what = `no live worker takes the "maintenance" queue on this Redis (REDIS_PREFIX "${c.config.redisPrefix}"), so the re-seal job would wait and never start`;
  if (!force)
    throw new KeyringRefusal(
      `${what}: start a worker with maintenance in WORKER_QUEUES on the same Redis, then run this again (or pass --force and start it later)`,
    );
  console.error(`WARNING: ${what}. Going on (--force): start a worker with maintenance in WORKER_QUEUES, or the re-seal never runs.`);
  return true;
}

/** The master-key commands, each audited as `master_keys.<command>` (`known` below checked the command before it runs). */
type MasterKeyCommand = 'init' | 'status' | 'reseal' | 'retire' | 'rewrap' | 'rotate';

/**
 * The audit row of one master-key command, on the system chain (no account): the key ids and root ids
 * involved, never key material. A change and its row commit together.
 */
const auditCommand = (db: Knex, command: MasterKeyCommand, status: AuditStatus, target: string | null, details: Record<string, unknown>) =>
  recordAudit(db, { user_id: null, action: `master_keys.${command}`, status, target, details: { via: 'admin-cli', ...details } });

/**
 * `master-key init` creates the root key in the token MASTER_KEY_URI names when missing; `rotate` adds
 * a data key and enqueues the re-seal; `reseal` enqueues an unfinished run again; `retire <kid>` retires
 * a key nothing uses; `rewrap` moves the keyring under the current root key. Each but `status` writes an
 * audit row (a refusal too, as a failure). Answers the exit code.
 */
export async function masterKeyCommand(args: string[], config: Config): Promise<number> {
  const [command, ...rest] = args;
  const flags = rest.filter((a) => a.startsWith('--'));
  const [arg, ...extra] = rest.filter((a) => !a.startsWith('--'));
  const say = (text: string) => console.log(text);
  try {
    if (command === 'init') {
      if (!config.masterKeys.uri) {
        say('MASTER_KEY is the root key: there is nothing to create (set MASTER_KEY_URI to use a PKCS#11 token).');
        return 0;
      }
      const made = initPkcs11Root(config.masterKeys.uri);
      await prepareDatabase(config);
      const db = openDatabase(config, { max: 1 });
      try {
        const root_id = pkcs11RootId(parsePkcs11Uri(config.masterKeys.uri));
        await auditCommand(db, 'init', 'success', root_id, { root_id, created: made === 'created' });
      } finally {
        await db.destroy();
      }
      say(made === 'created' ? 'Created the root key in the token.' : 'The token already holds the root key.');
      return 0;
    }
    const known = ['status', 'rotate', 'reseal', 'retire', 'rewrap'].includes(command ?? '');
    if (!known || (command === 'retire') !== Boolean(arg) || extra.length || flags.some((f) => !(FLAGS[command] ?? []).includes(f))) {
      console.error(`usage: ${MASTER_KEY_USAGE}`);
      return 2;
    }
    await prepareDatabase(config);
    const c = await createContainer(config);
    try {
      return await keyringCommand(c, command, { arg, json: flags.includes('--json'), force: flags.includes('--force') }, say);
    } catch (err) {
      if (err instanceof KeyringRefusal)
        await auditCommand(c.db, command as MasterKeyCommand, 'failure', arg ?? null, { ...(arg ? { kid: arg } : {}), refusal: err.message });
      throw err;
    } finally {
      await c.close();
    }
  } catch (err) {
    if (!(err instanceof RootKeyError || err instanceof KeyringRefusal)) throw err;
    console.error(err.message);
    return 1;
  }
}

/** The commands on an opened keyring. */
async function keyringCommand(
  c: Container,
  command: string,
  { arg, json, force }: { arg?: string; json: boolean; force: boolean },
  say: (text: string) => void,
): Promise<number> {
  const root_id = c.keyring.roots.currentId;
  if (command === 'status') {
    const status = await keyringStatus(c);
    if (json) say(JSON.stringify(status, null, 2));
    else {
      say(`root key ${status.root_id}; current data key ${status.current_kid}`);
      for (const k of status.keys) say(`${k.kid}\t${k.retired_at ? 'retired' : k.current ? 'current' : 'live'}\t${k.uses} use(s)\twrapped by ${k.root_id}`);
      if (status.reseal)
        say(
          `re-seal to ${status.reseal.target_kid}: ${status.reseal.resealed} moved, ${status.reseal.skipped} left, ${status.reseal.finished_at ? 'finished' : 'running'}`,
        );
      for (const p of status.processes) say(p.behind ? `behind: ${behindText(p)}` : `${processName(p)} seals under "${p.current_kid}"`);
    }
  } else if (command === 'rotate') {
    const unserved = await requireMaintenanceWorker(c, force);
    const graceMs = 2 * c.config.masterKeys.refreshMs;
    const previous = c.keyring.current().kid;
    const { kid, current_from } = await c.db.transaction(async (trx) => {
      const made = await rotateDataKey(trx, c.keyring.roots, graceMs);
      await auditCommand(trx, 'rotate', 'success', made.kid, {
        kid: made.kid,
        previous_kid: previous,
        root_id,
        current_from: made.current_from.toISOString(),
        ...(unserved ? { without_maintenance_worker: true } : {}),
      });
      return made;
    });
    await c.jobs.enqueue('reseal-keyring', { target_kid: kid }, { jobId: `reseal-${kid}`, delay: graceMs + 1000 });
    say(`Data key ${kid} is current from ${current_from.toISOString()}; the re-seal job starts then (progress: GET /status, master-key status).`);
  } else if (command === 'reseal') {
    const run = await resealProgress(c.db);
    if (!run || run.finished_at) {
      await auditCommand(c.db, 'reseal', 'success', null, { enqueued: false });
      say('No re-seal run is unfinished.');
    } else {
      const unserved = await requireMaintenanceWorker(c, force);
      await c.jobs.enqueue('reseal-keyring', { target_kid: run.target_kid }, { jobId: `reseal-${run.target_kid}-${Date.now()}` });
      await auditCommand(c.db, 'reseal', 'success', run.target_kid, {
        enqueued: true,
        target_kid: run.target_kid,
        resealed: run.resealed,
        skipped: run.skipped,
        ...(unserved ? { without_maintenance_worker: true } : {}),
      });
      say(`Enqueued the re-seal to ${run.target_kid} again; it resumes where it stopped.`);
    }
  } else if (command === 'retire') {
    await c.db.transaction(async (trx) => {
      const current = c.keyring.current().kid;
      await retireDataKey(trx, arg!, current, {
        processes: async () => processKeyrings(await liveProcesses(c.redis, c.config.redisPrefix), current),
        queuedUses: (kid) => queuedSeals(c, kid),
      });
      await auditCommand(trx, 'retire', 'success', arg!, { kid: arg, root_id });
    });
    say(`Data key ${arg} is retired: its material is gone from the database (backups from before still hold it).`);
  } else {
    const from = (await c.db<KeyringRow>('keyring').whereNull('retired_at').whereNot({ root_id }).select('kid', 'root_id')).map((r) => ({
      kid: r.kid,
      root_id: r.root_id,
    }));
    const n = await c.db.transaction(async (trx) => {
      const moved = await rewrapKeyring(trx, c.keyring.roots);
      await auditCommand(trx, 'rewrap', 'success', root_id, { root_id, rewrapped: moved, keys: from });
      return moved;
    });
    say(`Re-wrapped ${n} data key(s) under ${root_id}.`);
  }
  return 0;
}
