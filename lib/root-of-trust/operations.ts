import { randomBytes } from 'node:crypto';
import type { Knex } from 'knex';
import type { Sealer } from '../sealer';
import { newKid, type Keyring, type KeyringRow, type Roots } from './keyring';
import { holdsSeal, kidSql, STORED_SEALS, type SealedRow } from './stored-seals';
import { processName, type ProcessBeat } from '../heartbeats';

/** Per key id, how many stored values and row MACs use it, by `table.column`. */
export type KeyUsage = Record<string, Record<string, number>>;

export async function keyUsage(db: Knex): Promise<KeyUsage> {
  const usage: KeyUsage = {};
  for (const { table, column } of STORED_SEALS) {
    const rows = await db(table)
      .whereRaw(holdsSeal(column))
      .select(db.raw(`${kidSql(column)} AS kid`))
      .count('* as n')
      .groupByRaw(kidSql(column));
    for (const r of rows as unknown as { kid: string; n: string }[]) (usage[r.kid] ??= {})[`${table}.${column}`] = Number(r.n);
  }
  return usage;
}

export const totalUses = (usage: KeyUsage, kid: string) => Object.values(usage[kid] ?? {}).reduce((a, b) => a + b, 0);

/**
 * Adds a new data key, wrapped by the current root, current from `graceMs` ahead (two keyring refreshes:
 * by then every process has loaded it, so none meets a value under a key it does not know).
 */
export async function rotateDataKey(db: Knex, roots: Roots, graceMs: number): Promise<{ kid: string; current_from: Date }> {
  const kid = newKid();
  const root = roots.current();
  const current_from = new Date(Date.now() + graceMs);
  await db('keyring').insert({ kid, wrapped: await root.wrap(kid, randomBytes(32)), root_id: root.id, current_from });
  await db('keyring_reseals').insert({ target_kid: kid, position: JSON.stringify({ seal: 0, after: null }) });
  return { kid, current_from };
}

export class KeyringRefusal extends Error {}

/** The data key the keyring table makes current now (as each process's keyring does): the live key with the latest `current_from` in the past. */
export async function currentDataKey(db: Knex): Promise<string | null> {
  const row = await db<KeyringRow>('keyring')
    .whereNull('retired_at')
    .whereNotNull('wrapped')
    .where('current_from', '<=', db.fn.now())
    .orderBy('current_from', 'desc')
    .first('kid');
  return row?.kid ?? null;
}

/** A live process (by its heartbeat) and the data key it seals under. */
export interface ProcessKeyring {
  process_id: string;
  host: string;
  pid: number;
  roles: string[];
  /** Null when it does not say. */
  current_kid: string | null;
  reload_error: string | null;
  /**
   * Not sealing under `current`: a process whose reload fails keeps sealing under the key it knows, and
   * one that does not say which key it seals under may too.
   */
  behind: boolean;
}

export const processKeyrings = (beats: ProcessBeat[], current: string | null): ProcessKeyring[] =>
  beats.map((b) => ({
    process_id: b.id,
    host: b.host,
    pid: b.pid,
    roles: b.roles,
    current_kid: b.keyring?.current_kid ?? null,
    reload_error: b.keyring?.reload_error ?? null,
    behind: !b.keyring || b.keyring.current_kid !== current,
  }));

/** A process that is behind, as an operator reads it. */
export const behindText = (p: ProcessKeyring): string =>
  `${processName(p)} ${p.current_kid === null ? 'does not say which data key it seals under' : `seals under "${p.current_kid}"`}${p.reload_error ? ` (its keyring reload fails: ${p.reload_error})` : ''}`;

/**
 * Retires a data key: refused while it is current, while a live process (`processes`) has not loaded the
 * current key (it may still seal under this one), while a re-seal run is unfinished, while a stored value
 * or row MAC uses it, or while a job not yet run carries a value sealed under it (`queuedUses`). Its
 * material is deleted from the row; the row stays, so a value that still names it is reported as under
 * a retired key. A backup from before still holds the wrapped material.
 */
export async function retireDataKey(
  db: Knex,
  kid: string,
  current: string,
  checks: { processes: () => Promise<ProcessKeyring[]>; queuedUses: (kid: string) => Promise<number> },
): Promise<void> {
  const row = await db<KeyringRow>('keyring').where({ kid }).first();
  if (!row) throw new KeyringRefusal(`there is no data key "${kid}"`);
  if (row.retired_at) throw new KeyringRefusal(`data key "${kid}" is retired already`);
  if (kid === current) throw new KeyringRefusal(`data key "${kid}" is the current key; rotate first`);
  const behind = (await checks.processes()).filter((p) => p.behind);
  if (behind.length)
    throw new KeyringRefusal(
      `${behind.length} live process(es) have not loaded the current data key "${current}", so may still seal under "${kid}": ${behind.map(behindText).join('; ')}. Give each the root key configuration and restart it (or wait for its next keyring reload), then retire`,
    );
  const running = await db<ResealRow>('keyring_reseals').whereNull('finished_at').first('target_kid');
  if (running) throw new KeyringRefusal(`the re-seal to "${running.target_kid}" has not finished`);
  const uses = totalUses(await keyUsage(db), kid);
  if (uses > 0) throw new KeyringRefusal(`data key "${kid}" still seals ${uses} stored value(s) or row MAC(s)`);
  const queued = await checks.queuedUses(kid);
  if (queued > 0) throw new KeyringRefusal(`data key "${kid}" still seals values in ${queued} job(s) waiting in the queues; retire it once they have run`);
  await db('keyring').where({ kid }).whereNull('retired_at').update({ wrapped: null, retired_at: db.fn.now() });
}

/** Re-wraps every live data key under the current root (the root key rotated); answers how many moved. */
export async function rewrapKeyring(db: Knex, roots: Roots): Promise<number> {
  const root = roots.current();
  let n = 0;
  for (const row of await db<KeyringRow>('keyring').whereNull('retired_at').whereNot({ root_id: root.id })) {
    const wrapped = await root.wrap(row.kid, await roots.unwrap(row));
    n += await db('keyring').where({ kid: row.kid, wrapped: row.wrapped }).update({ wrapped, root_id: root.id });
  }
  return n;
}

export interface ResealProgress {
  target_kid: string;
  position: { seal: number; after: string | null };
  resealed: number;
  skipped: number;
  started_at: Date;
  updated_at: Date;
  finished_at: Date | null;
}

/** A keyring_reseals row as Postgres answers it (bigint counts come as strings). */
interface ResealRow extends Omit<ResealProgress, 'resealed' | 'skipped'> {
  resealed: string;
  skipped: string;
}

/** A data key's row: when it is current from, and whether it is retired. */
export const dataKey = (db: Knex, kid: string): Promise<Pick<KeyringRow, 'current_from' | 'retired_at'> | undefined> =>
  db<KeyringRow>('keyring').where({ kid }).first('current_from', 'retired_at');

/** Ends the run to `target` if it is unfinished (overtaken by a later rotation, or done). */
export async function finishReseal(db: Knex, target: string): Promise<void> {
  await db('keyring_reseals').where({ target_kid: target }).whereNull('finished_at').update({ finished_at: db.fn.now() });
}

/** The run to `target`, or the latest one. */
export async function resealProgress(db: Knex, target?: string): Promise<ResealProgress | undefined> {
  const query = db<ResealRow>('keyring_reseals');
  if (target) query.where({ target_kid: target });
  else query.orderBy('started_at', 'desc');
  const row = await query.first();
  return row && { ...row, resealed: Number(row.resealed), skipped: Number(row.skipped) };
}

/**
 * Moves every stored seal and row MAC to `target` in batches. Each batch's updates and its position
 * commit together, so after a crash the run resumes where it stopped. An update is a compare-and-set on
 * the value read: a value changed meanwhile (by live traffic, under the current key) is left as it is.
 * A value that does not open or a MAC that does not verify is left too (counted as skipped, logged):
 * it keeps its key in use, so the key cannot be retired over it. `between` runs between a batch's reads
 * and its writes (tests crash or race a run there).
 */
export async function reseal(
  db: Knex,
  keyring: Keyring,
  sealer: Sealer,
  target: string,
  opts: {
    batch?: number;
    between?(step: { table: string; column: string; ids: string[] }): void | Promise<void>;
    onSkip?(where: string, err: unknown): void;
  } = {},
): Promise<ResealProgress> {
  const batch = opts.batch ?? 200;
  const run = await db<ResealRow>('keyring_reseals').where({ target_kid: target }).first();
  if (!run) throw new Error(`no re-seal run for data key "${target}"`);
  let { seal, after } = run.position;
  while (!run.finished_at && seal < STORED_SEALS.length) {
    const s = STORED_SEALS[seal];
    const key = s.key ?? { column: 'id', type: 'uuid' };
    const query = db(s.table)
      .select<SealedRow[]>({ id: key.column }, s.column, ...s.reads)
      .whereRaw(holdsSeal(s.column))
      .whereRaw(`${kidSql(s.column)} <> ?`, [target]);
    if (after) query.where(key.column, '>', after);
    const rows = await query.orderBy(key.column).limit(batch);
    if (keyring.current().kid !== target) throw new Error(`data key "${target}" is not (or no longer) current here; the re-seal waits for it`);
    const updates: { id: string; old: string; value: string }[] = [];
    let skipped = 0;
    for (const row of rows) {
      try {
        updates.push({ id: row.id, old: row[s.column] as string, value: s.renew(sealer, row) });
      } catch (err) {
        skipped++;
        opts.onSkip?.(`${s.table}.${s.column} ${row.id}`, err);
      }
    }
    await opts.between?.({ table: s.table, column: s.column, ids: updates.map((u) => u.id) });
    const last = rows.at(-1)?.id;
    const next = rows.length < batch ? { seal: seal + 1, after: null } : { seal, after: last! };
    await db.transaction(async (trx) => {
      // One compare-and-set statement for the batch: a row whose value is no longer the one read is left.
      const moved = updates.length
        ? (
            await trx.raw<{ rowCount: number }>(
              `UPDATE ?? AS t SET ?? = v.value FROM (VALUES ${updates.map(() => `(?::${key.type}, ?, ?)`).join(', ')}) AS v(id, old, value) WHERE t.?? = v.id AND t.?? = v.old`,
              [s.table, s.column, ...updates.flatMap((u) => [u.id, u.old, u.value]), key.column, s.column],
            )
          ).rowCount
        : 0;
      await trx('keyring_reseals')
        .where({ target_kid: target })
        .update({
          position: JSON.stringify(next),
          resealed: trx.raw('resealed + ?', [moved]),
          skipped: trx.raw('skipped + ?', [skipped + updates.length - moved]),
          updated_at: trx.fn.now(),
        });
    });
    ({ seal, after } = next);
  }
  await finishReseal(db, target);
  return (await resealProgress(db, target))!;
}
