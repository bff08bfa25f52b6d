import type { Config } from '../config';
import { prepareDatabase } from '../main';
import { createContainer, type Container } from '../container';
import { RootKeyError } from './root-key';
import { initPkcs11Root } from './pkcs11-root';
import { keyUsage, KeyringRefusal, resealProgress, retireDataKey, rewrapKeyring, rotateDataKey, totalUses } from './operations';
import type { KeyringRow } from './keyring';
import { QUEUES } from '../../jobs/define';

export const MASTER_KEY_USAGE = 'npm run admin -- master-key init | status [--json] | rotate | reseal | retire <kid> | rewrap';

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
export async function keyringStatus(c: Container) {
  const [rows, usage, reseal] = await Promise.all([c.db<KeyringRow>('keyring').orderBy('created_at'), keyUsage(c.db), resealProgress(c.db)]);
  const current = c.keyring.current().kid;
  return {
    root_id: c.keyring.roots.currentId,
    current_kid: current,
    keys: rows.map((r) => ({ kid: r.kid, root_id: r.root_id, current: r.kid === current, current_from: r.current_from, retired_at: r.retired_at, uses: totalUses(usage, r.kid), uses_by_column: usage[r.kid] ?? {} })),
    reseal: reseal ?? null,
  };
}

/**
 * `master-key init` creates the root key in the token MASTER_KEY_URI names when missing; `rotate` adds
 * a data key and enqueues the re-seal; `reseal` enqueues an unfinished run again; `retire <kid>` retires
 * a key nothing uses; `rewrap` moves the keyring under the current root key. Answers the exit code.
 */
export async function masterKeyCommand(args: string[], config: Config): Promise<number> {
  const [command, arg] = args;
  const say = (text: string) => console.log(text);
  try {
    if (command === 'init') {
      if (!config.masterKeys.uri) {
        say('MASTER_KEY is the root key: there is nothing to create (set MASTER_KEY_URI to use a PKCS#11 token).');
        return 0;
      }
      const made = initPkcs11Root(config.masterKeys.uri);
      say(made === 'created' ? 'Created the root key in the token.' : 'The token already holds the root key.');
      return 0;
    }
    if (!['status', 'rotate', 'reseal', 'retire', 'rewrap'].includes(command ?? '') || (command === 'retire' && !arg)) {
      console.error(`usage: ${MASTER_KEY_USAGE}`);
      return 2;
    }
    await prepareDatabase(config);
    const c = await createContainer(config);
    try {
      if (command === 'status') {
        const status = await keyringStatus(c);
        if (arg === '--json') say(JSON.stringify(status, null, 2));
        else {
          say(`root key ${status.root_id}; current data key ${status.current_kid}`);
          for (const k of status.keys) say(`${k.kid}\t${k.retired_at ? 'retired' : k.current ? 'current' : 'live'}\t${k.uses} use(s)\twrapped by ${k.root_id}`);
          if (status.reseal) say(`re-seal to ${status.reseal.target_kid}: ${status.reseal.resealed} moved, ${status.reseal.skipped} left, ${status.reseal.finished_at ? 'finished' : 'running'}`);
        }
      } else if (command === 'rotate') {
        const graceMs = 2 * config.masterKeys.refreshMs;
        const { kid, current_from } = await rotateDataKey(c.db, c.keyring.roots, graceMs);
        await c.jobs.enqueue('reseal-keyring', { target_kid: kid }, { jobId: `reseal-${kid}`, delay: graceMs + 1000 });
        say(`Data key ${kid} is current from ${current_from.toISOString()}; the re-seal job starts then (progress: GET /status, master-key status).`);
      } else if (command === 'reseal') {
        const run = await resealProgress(c.db);
        if (!run || run.finished_at) say('No re-seal run is unfinished.');
        else {
          await c.jobs.enqueue('reseal-keyring', { target_kid: run.target_kid }, { jobId: `reseal-${run.target_kid}-${Date.now()}` });
          say(`Enqueued the re-seal to ${run.target_kid} again; it resumes where it stopped.`);
        }
      } else if (command === 'retire') {
        await retireDataKey(c.db, arg!, c.keyring.current().kid, (kid) => queuedSeals(c, kid));
        say(`Data key ${arg} is retired: its material is gone from the database (backups from before still hold it).`);
      } else {
        const n = await rewrapKeyring(c.db, c.keyring.roots);
        say(`Re-wrapped ${n} data key(s) under ${c.keyring.roots.currentId}.`);
      }
      return 0;
    } finally {
      await c.close();
    }
  } catch (err) {
    if (!(err instanceof RootKeyError || err instanceof KeyringRefusal)) throw err;
    console.error(err.message);
    return 1;
  }
}
