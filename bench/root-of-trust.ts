/**
 * The root of trust's costs (docs/root-of-trust.md): loading the keyring at start-up with the root key
 * in a PKCS#11 token (SoftHSM2, a token made for this run) and with MASTER_KEY; sealing throughput on
 * each (the token is called only when the keyring loads, so the ratio should be ~1); and the re-seal
 * job's rate, in rows per second, over webhook secrets (one sealed column per row) in a scratch database;
 * and per-lineage token keys (LINEAGE_TOKEN_KEYS): making one, the token call that opens a private key
 * for a job (handle known, and first in a process with the token holding `LINEAGES` keys), deleting one.
 *
 *   npm run bench:root-of-trust -- [rows]     (default 20000 rows)
 */
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../lib/config';
import { openKeyring } from '../lib/container';
import { createSealer, sealerOver } from '../lib/sealer';
import { initPkcs11Root } from '../lib/root-of-trust/pkcs11-root';
import { tokenLineageKeys } from '../lib/root-of-trust/lineage-keys';
import { reseal, rotateDataKey } from '../lib/root-of-trust/operations';
import { createDb, dropDatabase, ensureDatabase } from '../db/knex';
import { migrateLatest } from '../db/migrate';
import { secretAad } from '../lib/webhooks/endpoints';

const rows = Number(process.argv[2] ?? 20_000);
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-root-'));
await mkdir(join(dir, 'tokens'));
await writeFile(join(dir, 'softhsm2.conf'), `directories.tokendir = ${join(dir, 'tokens')}\nobjectstore.backend = file\nlog.level = ERROR\n`);
await writeFile(join(dir, 'pin'), 'bench-pin\n');
process.env.SOFTHSM2_CONF = join(dir, 'softhsm2.conf');
execFileSync('softhsm2-util', ['--init-token', '--free', '--label', 'bench', '--pin', 'bench-pin', '--so-pin', 'bench-so'], { stdio: 'ignore' });
const uri = `pkcs11:token=bench;object=root?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:${join(dir, 'pin')}`;
initPkcs11Root(uri);

const base = new URL(process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres');
const dbUrl = (name: string) => Object.assign(new URL(base), { pathname: `/${name}` }).toString();
const names = { token: `kms_bench_root_${randomBytes(3).toString('hex')}`, env: `kms_bench_env_${randomBytes(3).toString('hex')}` };
const env = { NODE_ENV: 'test', LOG_LEVEL: 'silent' } as const;
const configs = {
  token: loadConfig({ ...env, DATABASE_URL: dbUrl(names.token), MASTER_KEY_URI: uri }),
  env: loadConfig({ ...env, DATABASE_URL: dbUrl(names.env), MASTER_KEY: `b1:${randomBytes(32).toString('base64')}` }),
};
const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;
const result: Record<string, unknown> = { rows };
const keyrings: Partial<Record<'token' | 'env', Awaited<ReturnType<typeof openKeyring>>>> = {};

try {
  for (const which of ['token', 'env'] as const) {
    await ensureDatabase(dbUrl(names[which]));
    const db = createDb(dbUrl(names[which]), { max: 4 });
    await migrateLatest(db);
    // Start-up: open the root and load the keyring (3 data keys, as after two rotations), as a process does.
    // The first open in a process also loads the PKCS#11 library, initialises it and logs in.
    const t = process.hrtime.bigint();
    const first = await openKeyring(configs[which], db);
    result[`first_open_ms_${which}`] = Number(ms(t).toFixed(2));
    for (let i = 0; i < 2; i++) await rotateDataKey(db, first.roots, 0);
    await first.close();
    const loads: number[] = [];
    for (let i = 0; i < 15; i++) {
      const t0 = process.hrtime.bigint();
      const k = await openKeyring(configs[which], db);
      loads.push(ms(t0));
      await k.close();
    }
    result[`startup_ms_${which}`] = Number(median(loads).toFixed(2));

    const keyring = await openKeyring(configs[which], db);
    keyrings[which] = keyring;
    const sealer = sealerOver(keyring);
    if (which === 'token') {
      // The re-seal rate: webhook secrets under the current key, moved to a new one in batches of 200.
      const userId = randomUUID();
      await db('users').insert({ id: userId, username: 'bench', email: 'bench@example.test', password_hash: 'x' });
      for (let i = 0; i < rows; i += 1000) {
        await db('webhook_endpoints').insert(
          Array.from({ length: Math.min(1000, rows - i) }, () => {
            const id = randomUUID();
            return {
              id,
              user_id: userId,
              url: 'https://example.test/hook',
              secret_sealed: sealer.seal(randomBytes(32).toString('base64'), secretAad(id, 'current')),
            };
          }),
        );
      }
      const { kid } = await rotateDataKey(db, keyring.roots, 0);
      await keyring.load();
      const t1 = process.hrtime.bigint();
      const run = await reseal(db, keyring, sealer, kid);
      const seconds = ms(t1) / 1000;
      result.reseal_rows = run.resealed;
      result.reseal_rows_per_s = Math.round(run.resealed / seconds);
    }
    await db.destroy();
  }
  // Sealing throughput, 64-byte secrets sealed and opened as the services do: rounds alternate between
  // the providers (and a fixed key, no keyring) so that the machine's other load falls on all alike.
  const sealers = { env: sealerOver(keyrings.env!), token: sealerOver(keyrings.token!), fixed: createSealer(`f1:${randomBytes(32).toString('base64')}`) };
  const best: Record<string, number> = {};
  const secret = randomBytes(64);
  for (let round = 0; round < 7; round++) {
    for (const [which, sealer] of Object.entries(sealers)) {
      const n = 20_000;
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) sealer.open(sealer.seal(secret, `aad:${i}`), `aad:${i}`);
      best[which] = Math.max(best[which] ?? 0, Math.round(n / (ms(t0) / 1000)));
    }
  }
  for (const [which, rate] of Object.entries(best)) result[`seal_open_per_s_${which}`] = rate;

  // Per-lineage keys: an armored private key is ~0.9 KiB (curve25519) to ~3.5 KiB (rsa4096).
  const LINEAGES = 200;
  const lineageKeys = tokenLineageKeys(uri);
  const lineages = Array.from({ length: LINEAGES }, () => randomUUID());
  const make: number[] = [];
  for (const id of lineages) {
    const t0 = process.hrtime.bigint();
    await lineageKeys.ensure(id);
    make.push(ms(t0));
  }
  result.lineage_key_create_ms = Number(median(make).toFixed(3));
  for (const [name, size] of [
    ['1k', 900],
    ['3k5', 3500],
  ] as const) {
    const armored = randomBytes(size).toString('base64').slice(0, size);
    const sealed = await lineageKeys.seal(lineages[0], 1, armored);
    const opens: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t0 = process.hrtime.bigint();
      await lineageKeys.open(lineages[0], 1, sealed);
      opens.push(ms(t0));
    }
    result[`lineage_open_ms_${name}`] = Number(median(opens).toFixed(3));
  }
  // First open in a process: the key is looked up by label among the token's LINEAGES + 1 objects.
  const firsts: number[] = [];
  for (const id of lineages.slice(0, 20)) {
    const sealed = await lineageKeys.seal(id, 1, 'x'.repeat(900));
    const fresh = tokenLineageKeys(uri);
    const t0 = process.hrtime.bigint();
    await fresh.open(id, 1, sealed);
    firsts.push(ms(t0));
    await fresh.close();
  }
  result.lineage_first_open_ms = Number(median(firsts).toFixed(3));
  const removes: number[] = [];
  for (const id of lineages) {
    const t0 = process.hrtime.bigint();
    await lineageKeys.remove(id);
    removes.push(ms(t0));
  }
  result.lineage_key_delete_ms = Number(median(removes).toFixed(3));
  await lineageKeys.close();
  for (const k of Object.values(keyrings)) await k.close();
  result.seal_ratio_token_over_env = Number(((result.seal_open_per_s_token as number) / (result.seal_open_per_s_env as number)).toFixed(3));
  console.log(JSON.stringify({ bench: 'root-of-trust', ...result }));
} finally {
  for (const name of Object.values(names)) await dropDatabase(dbUrl(name)).catch(() => undefined);
  await rm(dir, { recursive: true, force: true });
}
