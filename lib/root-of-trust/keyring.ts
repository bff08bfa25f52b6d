import { randomBytes } from 'node:crypto';
import type { Knex } from 'knex';
import type { SealingKeys } from '../sealer';
import { envRootKey, parseKeySpec, RootKeyError, type RootKey } from './root-key';
import { openPkcs11Root } from './pkcs11-root';
import { parsePkcs11Uri, pkcs11RootId } from './pkcs11-uri';

/**
 * The keyring: the data keys that seal stored values and MAC rows, kept in Postgres (`keyring`), each
 * wrapped by a root key. A process unwraps them once when it loads the keyring and again only for keys
 * added since (it reloads every KEYRING_REFRESH_MS), so sealing never calls the root key's provider.
 *
 * The current key is the live key with the latest `current_from` in the past. A rotation adds a key
 * whose `current_from` lies two refresh intervals ahead, so every process knows it before any seals
 * under it; a retired key keeps its row without its material, so what it sealed is named, not opened.
 */
export interface KeyringRow {
  kid: string;
  wrapped: string | null;
  root_id: string;
  current_from: Date | null;
  created_at: Date;
  retired_at: Date | null;
}

/** A root key the configuration names, opened on first use (a previous root only when a row needs it). */
interface RootCandidate {
  id: string;
  open(): RootKey;
}

/** The configured roots: the current one wraps; the previous ones only unwrap, until `rewrap` moves the keyring off them. */
export class Roots {
  private readonly opened = new Map<string, RootKey>();

  constructor(
    private readonly currentRoot: RootCandidate,
    private readonly previous: RootCandidate[],
  ) {}

  get currentId(): string {
    return this.currentRoot.id;
  }

  get(id: string): RootKey | undefined {
    let root = this.opened.get(id);
    if (root) return root;
    const candidate = [this.currentRoot, ...this.previous].find((c) => c.id === id);
    if (!candidate) return undefined;
    root = candidate.open();
    this.opened.set(id, root);
    return root;
  }

  current(): RootKey {
    return this.get(this.currentRoot.id)!;
  }

  async unwrap(row: Pick<KeyringRow, 'kid' | 'root_id' | 'wrapped'>): Promise<Buffer> {
    const root = this.get(row.root_id);
    if (!root)
      throw new RootKeyError(
        `the keyring's data key "${row.kid}" is wrapped by the root key ${row.root_id}, which is not configured (MASTER_KEY, MASTER_KEYS_PREVIOUS, MASTER_KEY_URI or MASTER_KEY_URI_PREVIOUS)`,
      );
    const key = await root.unwrap(row.kid, row.wrapped!);
    if (key.length !== 32) throw new RootKeyError(`the keyring's data key "${row.kid}" is not 32 bytes`);
    return key;
  }

  async close(): Promise<void> {
    for (const root of this.opened.values()) await root.close();
    this.opened.clear();
  }
}

const envCandidate = (spec: string): RootCandidate => ({ id: `master-key:${parseKeySpec(spec)[0]}`, open: () => envRootKey(spec) });
const tokenCandidate = (uri: string): RootCandidate => ({ id: pkcs11RootId(parsePkcs11Uri(uri)), open: () => openPkcs11Root(uri) });

export interface RootSettings {
  current: string | undefined;
  previous: string[];
  uri?: string;
  previousUri?: string;
}

/** MASTER_KEY_URI when set, else MASTER_KEY, wraps; MASTER_KEY beside a URI, MASTER_KEYS_PREVIOUS and MASTER_KEY_URI_PREVIOUS only unwrap. */
export function rootsOf(s: RootSettings): Roots {
  const env = [...(s.current ? [s.current] : []), ...s.previous].map(envCandidate);
  if (s.uri) return new Roots(tokenCandidate(s.uri), [...env, ...(s.previousUri ? [tokenCandidate(s.previousUri)] : [])]);
  const [current, ...previous] = env;
  if (!current) throw new RootKeyError('MASTER_KEY or MASTER_KEY_URI must be set');
  return new Roots(current, [...previous, ...(s.previousUri ? [tokenCandidate(s.previousUri)] : [])]);
}

/** A new data key id: sortable by creation, never one a MASTER_KEY spec would use by accident. */
export const newKid = () => `dk-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;

const LOCK = `hashtext('kms/keyring')`;

/**
 * Gives an empty keyring its first keys, once (an advisory lock serialises processes starting together):
 * the configured MASTER_KEY and MASTER_KEYS_PREVIOUS themselves, under their own ids, so what they sealed
 * before the keyring existed keeps opening; MASTER_KEY is current. With none (a token from the start),
 * one random key. Answers the key ids it added.
 */
export async function ensureKeyring(db: Knex, roots: Roots, legacy: string[]): Promise<string[]> {
  return db.transaction(async (trx) => {
    await trx.raw(`SELECT pg_advisory_xact_lock(${LOCK})`);
    if ((await trx('keyring').first('kid')) !== undefined) return [];
    const root = roots.current();
    const keys = legacy.length ? legacy.map(parseKeySpec) : [[newKid(), randomBytes(32)] as [string, Buffer]];
    const rows = [];
    for (const [i, [kid, key]] of keys.entries())
      rows.push({ kid, wrapped: await root.wrap(kid, key), root_id: root.id, current_from: i === 0 ? new Date(0) : null });
    await trx('keyring').insert(rows);
    return rows.map((r) => r.kid);
  });
}

/** What a process says of its keyring (in its heartbeat, /readyz, GET /status): no key material. */
export interface KeyringState {
  /** The data key this process seals and MACs under now; null if it has none current. */
  current_kid: string | null;
  /** The end of the latest load that succeeded. */
  loaded_at: string | null;
  /** Why the latest reload failed, while it keeps failing (the keys known are kept meanwhile). */
  reload_error: string | null;
}

/** The data keys in memory, kept in step with the `keyring` table. */
export class Keyring implements SealingKeys {
  private readonly live = new Map<string, { key: Buffer; currentFrom: number | null }>();
  private readonly retired = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private loadedAt: Date | undefined;
  private failure: string | undefined;
  /** Fires when a known key's `current_from` arrives, so that listeners hear of the switch when it happens. */
  private switchTimer: NodeJS.Timeout | undefined;
  private readonly listeners: ((state: KeyringState) => void)[] = [];
  private told = '';

  constructor(
    private readonly db: Knex,
    readonly roots: Roots,
  ) {}

  current(): { kid: string; key: Buffer } {
    const now = Date.now();
    let best: { kid: string; key: Buffer; at: number } | undefined;
    for (const [kid, e] of this.live)
      if (e.currentFrom !== null && e.currentFrom <= now && (!best || e.currentFrom > best.at)) best = { kid, key: e.key, at: e.currentFrom };
    if (!best) throw new Error('the keyring has no current data key');
    return { kid: best.kid, key: best.key };
  }

  get(kid: string): Buffer | undefined {
    return this.live.get(kid)?.key;
  }

  isRetired(kid: string): boolean {
    return this.retired.has(kid);
  }

  state(): KeyringState {
    let current_kid: string | null = null;
    try {
      current_kid = this.current().kid;
    } catch {
      // No key is current: said as null.
    }
    return { current_kid, loaded_at: this.loadedAt?.toISOString() ?? null, reload_error: this.failure ?? null };
  }

  /** Calls `listener` whenever the key this process seals under or its reload failure changes. */
  onChange(listener: (state: KeyringState) => void): void {
    this.listeners.push(listener);
  }

  /** Reads the keyring: unwraps keys new to this process, drops retired ones, follows `current_from`. */
  async load(): Promise<void> {
    try {
      const rows = await this.db<KeyringRow>('keyring').select('kid', 'wrapped', 'root_id', 'current_from', 'retired_at');
      for (const row of rows) {
        if (row.retired_at || !row.wrapped) {
          this.live.get(row.kid)?.key.fill(0);
          this.live.delete(row.kid);
          this.retired.add(row.kid);
          continue;
        }
        const currentFrom = row.current_from ? row.current_from.getTime() : null;
        const known = this.live.get(row.kid);
        if (known) known.currentFrom = currentFrom;
        else this.live.set(row.kid, { key: await this.roots.unwrap(row), currentFrom });
      }
      this.loadedAt = new Date();
      this.failure = undefined;
    } catch (err) {
      this.failure = (err as Error).message;
      throw err;
    } finally {
      this.scheduleSwitch();
      this.tell();
    }
  }

  private scheduleSwitch(): void {
    clearTimeout(this.switchTimer);
    const now = Date.now();
    const next = Math.min(...[...this.live.values()].map((e) => (e.currentFrom !== null && e.currentFrom > now ? e.currentFrom : Infinity)));
    if (next === Infinity) return;
    this.switchTimer = setTimeout(() => this.tell(), Math.min(next - now + 1, 2 ** 31 - 1));
    this.switchTimer.unref();
  }

  private tell(): void {
    const state = this.state();
    const said = `${state.current_kid}\n${state.reload_error}`;
    if (said === this.told) return;
    this.told = said;
    for (const listener of this.listeners) listener(state);
  }

  /** Reloads every `ms` until `close`; a failed reload keeps the keys known and is reported. */
  start(ms: number, onError: (err: Error) => void): void {
    this.timer = setInterval(() => void this.load().catch(onError), ms);
    this.timer.unref();
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    clearTimeout(this.switchTimer);
    for (const e of this.live.values()) e.key.fill(0);
    this.live.clear();
    await this.roots.close();
  }
}
