import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as openpgp from 'openpgp';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { admin, startSoftHsm, type SoftHsm } from '../support/softhsm';
import { startProcess } from '../support/process';
import { startWorkers } from '../../workers/worker';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { loadConfig } from '../../lib/config';
import { AppError } from '../../lib/errors';
import { aad, unlockGeneration, unlockLineage } from '../../lib/keys/key-catalog';
import { deleteSpentTokenKeys, destroyDueGenerations } from '../../lib/lifecycle/key-lifecycle';
import { lineageKeyLabel } from '../../lib/root-of-trust/lineage-keys';
import type { KeyRow, LineageRow } from '../../db/keys';

/**
 * Per-lineage keys in the token (LINEAGE_TOKEN_KEYS) on a SoftHSM2 token of this file's own: the private
 * keys of a lineage are sealed under its own token key inside the keyring's seal, and deleting that key
 * when the lineage is destroyed leaves a database backup of it unopenable even with keyring and root key.
 */
let hsm: SoftHsm;
let s: TestService;
let u: Awaited<ReturnType<typeof registerUser>>;
const DAY = 86_400_000;

beforeAll(async () => {
  hsm = await startSoftHsm();
  const made = await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: hsm.uri('root') });
  expect(made.code, made.err).toBe(0);
  s = await startTestService({ env: { MASTER_KEY_URI: hsm.uri('root'), LINEAGE_TOKEN_KEYS: 'true' } });
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
  await hsm?.stop();
});

async function withClockAdvanced<T>(ms: number, fn: () => Promise<T>): Promise<T> {
  const clock = s.c.clock as ManualClockFollowingTime;
  clock.advance(ms);
  try {
    return await fn();
  } finally {
    clock.advance(-ms);
  }
}

const decrypt = (fingerprint: string, data: Buffer) =>
  runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.gpg', data }] });
const rowsOf = async (lineageId: string) => ({
  lineage: (await s.c.db<LineageRow>('key_lineages').where({ id: lineageId }).first())!,
  generations: await s.c.db<KeyRow>('pgp_keys').where({ lineage_id: lineageId }).orderBy('generation'),
});

/** Opens a generation's private key as a job does, from rows as given (a live row, or a backup's copy). */
/** The generation's private key, opened (these tests' keys are v4: OpenPGP.js keys). */
async function opensFrom(lineage: LineageRow, generation: KeyRow) {
  const unlock = await unlockLineage(s.c, lineage, PASSPHRASE);
  return (await unlockGeneration(s.c, unlock, generation)) as openpgp.PrivateKey;
}

describe('configuration', () => {
  it('LINEAGE_TOKEN_KEYS=true without MASTER_KEY_URI stops start-up with one line', async () => {
    expect(() => loadConfig({ NODE_ENV: 'test', LINEAGE_TOKEN_KEYS: 'true' })).toThrow(/^LINEAGE_TOKEN_KEYS=true needs MASTER_KEY_URI/);
    const { MASTER_KEY_URI: _uri, ...env } = s.env;
    const web = startProcess('web', { ...env, MASTER_KEY: `k1:${randomBytes(32).toString('base64')}` });
    expect(await web.exited).not.toBe(0);
    expect(web.output().trim().split('\n')).toEqual([
      expect.stringMatching(/^LINEAGE_TOKEN_KEYS=true needs MASTER_KEY_URI: the per-lineage keys are made in the PKCS#11 token that holds the root key$/),
    ]);
  });
});

describe('a lineage with its own token key', () => {
  it('generate → encrypt → decrypt, and after a rotation too; the private key is sealed under the token key inside the keyring seal', async () => {
    const key = await createKey(s.api, u.token, { label: 'flow' });
    const { lineage, generations } = await rowsOf(key.lineage_id);
    expect(lineage).toMatchObject({ token_key: true, token_key_deleted_at: null });
    expect(hsm.labels()).toContain(lineageKeyLabel(key.lineage_id));
    // The keyring's seal opens to the token layer, not to an armored key.
    const inner = s.c.sealer.openText(generations[0].private_sealed, aad.private(key.lineage_id, 1));
    expect(inner).toMatch(/^t1\./);
    expect(inner).not.toContain('PGP');

    const plain = randomBytes(2000);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data: plain }]);
    const ct = await download(s.api, u.token, enc.job_id);
    const dec = await decrypt(key.fingerprint, ct);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(s.api, u.token, dec.job_id)).equals(plain)).toBe(true);

    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.status, JSON.stringify(rotated.body)).toBe(200);
    const g2 = (await rowsOf(key.lineage_id)).generations[1];
    expect(s.c.sealer.openText(g2.private_sealed, aad.private(key.lineage_id, 2))).toMatch(/^t1\./);
    // One token object per lineage, not per generation.
    expect(hsm.labels().filter((l) => l === lineageKeyLabel(key.lineage_id))).toHaveLength(1);
    const enc2 = await encrypt(s.api, u.token, rotated.body.result.new_fingerprint, [{ name: 'b.bin', data: plain }]);
    for (const [fpr, job] of [
      [key.fingerprint, enc],
      [rotated.body.result.new_fingerprint as string, enc2],
    ] as const) {
      const out = await decrypt(fpr, await download(s.api, u.token, job.job_id));
      expect(out.state, JSON.stringify(out.error)).toBe('completed');
    }
  });

  it('an imported secret key gets a token key and decrypts; an imported public key (a recipient key) gets none', async () => {
    const made = await openpgp.generateKey({ type: 'curve25519', userIDs: [{ name: 'Imp Orted', email: 'imp@example.test' }], format: 'armored' });
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'imp', passphrase: PASSPHRASE, key: made.privateKey } });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const rows = await rowsOf(imported.body.lineage_id);
    expect(rows.lineage.token_key).toBe(true);
    expect(hsm.labels()).toContain(lineageKeyLabel(rows.lineage.id));
    const ct = await download(
      s.api,
      u.token,
      (await encrypt(s.api, u.token, imported.body.fingerprint, [{ name: 'i', data: Buffer.from('imported') }])).job_id,
    );
    const dec = await decrypt(imported.body.fingerprint, ct);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(s.api, u.token, dec.job_id)).toString()).toBe('imported');

    const other = await openpgp.generateKey({ type: 'curve25519', userIDs: [{ name: 'Re Cipient', email: 'rc@example.test' }], format: 'armored' });
    const recipient = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'rcpt', key: other.publicKey } });
    expect(recipient.status, JSON.stringify(recipient.body)).toBe(201);
    expect((await rowsOf(recipient.body.lineage_id)).lineage.token_key).toBe(false);
    expect(hsm.labels()).not.toContain(lineageKeyLabel(recipient.body.lineage_id));
  });

  it('a recipient key upgraded by its secret key gets a token key; of two upgrades at once, the refused one leaves it in place', async () => {
    const made = await openpgp.generateKey({ userIDs: [{ name: 'Up Graded', email: 'up@example.test' }], format: 'armored' });
    const recipient = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'up', key: made.publicKey } });
    expect(recipient.status, JSON.stringify(recipient.body)).toBe(201);
    const ct = await download(
      s.api,
      u.token,
      (await encrypt(s.api, u.token, recipient.body.fingerprint, [{ name: 'u', data: Buffer.from('upgraded') }])).job_id,
    );
    const upgrade = () => s.api('POST', '/keys/import', { token: u.token, form: { label: 'up', passphrase: PASSPHRASE, key: made.privateKey } });
    const answers = await Promise.all([upgrade(), upgrade()]);
    expect(answers.map((r) => r.status).sort(), JSON.stringify(answers.map((r) => r.body))).toEqual([200, 409]);
    const rows = await rowsOf(recipient.body.lineage_id);
    expect(rows.lineage).toMatchObject({ kind: 'managed', token_key: true });
    expect(hsm.labels()).toContain(lineageKeyLabel(rows.lineage.id));
    const dec = await decrypt(recipient.body.fingerprint, ct);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(s.api, u.token, dec.job_id)).toString()).toBe('upgraded');
  });

  it('a destroyed lineage’s token key is deleted after the commit: a backup copy of its rows no longer opens with keyring and root key; another lineage still does', async () => {
    const doomed = await createKey(s.api, u.token, { label: 'doomed' });
    const kept = await createKey(s.api, u.token, { label: 'kept' });
    const doomedCt = await download(
      s.api,
      u.token,
      (await encrypt(s.api, u.token, doomed.fingerprint, [{ name: 'd', data: Buffer.from('to be shredded') }])).job_id,
    );
    // The backup: the rows as they are before destruction, with the keyring (and root key) still there.
    const backup = await rowsOf(doomed.lineage_id);
    expect((await opensFrom(backup.lineage, backup.generations[0])).isPrivate()).toBe(true);

    const res = await s.api('POST', `/keys/${doomed.fingerprint}/destruction`, { token: u.apiKey, body: { waiting_days: 7 } });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    // The first delete fails (the token lost its login, and the PIN cannot be read to log in again): the
    // generation is destroyed, and the key stays for the next sweep to delete.
    await hsm.loggedOut(() => withClockAdvanced(8 * DAY, async () => expect(await destroyDueGenerations(s.c)).toEqual({ destroyed: 1, postponed: 0 })));
    const between = await rowsOf(doomed.lineage_id);
    expect(between.lineage).toMatchObject({ destroyed_at: expect.any(Date), token_key_deleted_at: null });
    expect(between.generations[0]).toMatchObject({ private_sealed: '', secret_sealed: '', destroyed_at: expect.any(Date) });
    expect(hsm.labels()).toContain(lineageKeyLabel(doomed.lineage_id));
    // Until then the backup copy opens still (the token key is there).
    expect((await opensFrom(backup.lineage, backup.generations[0])).isPrivate()).toBe(true);

    // The next sweep deletes it, once: a sweep after that finds nothing to do.
    await withClockAdvanced(8 * DAY, () => destroyDueGenerations(s.c));
    expect(await deleteSpentTokenKeys(s.c)).toBe(0);
    const after = await rowsOf(doomed.lineage_id);
    expect(after.lineage.token_key_deleted_at).toBeInstanceOf(Date);
    expect(hsm.labels()).not.toContain(lineageKeyLabel(doomed.lineage_id));
    const audit = await s.c.db('audit_logs').where({ action: 'keys.delete_token_key', target: doomed.lineage_id });
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ user_id: u.id, details: { label: lineageKeyLabel(doomed.lineage_id), found: true } });

    // The backup's copy: the keyring still opens its outer seal (root key and data key are there) …
    const copy = backup.generations[0];
    expect(s.c.sealer.openText(copy.private_sealed, aad.private(doomed.lineage_id, 1))).toMatch(/^t1\./);
    // … but what is inside needs the deleted token key: the error names the lineage.
    const err = await opensFrom(backup.lineage, copy).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ status: 410, code: 'lineage_key_missing', message: expect.stringContaining(`lineage ${doomed.lineage_id}`) });
    // Put back into the database as a restore would, a decrypt job fails with that error, not a 500.
    await s.c.db('key_lineages').where({ id: doomed.lineage_id }).update({ destroyed_at: null, destroy_after: null, disabled_at: null });
    await s.c
      .db('pgp_keys')
      .where({ id: copy.id })
      .update({ private_sealed: copy.private_sealed, secret_sealed: copy.secret_sealed, destroyed_at: null, destroy_after: null });
    const restored = await decrypt(doomed.fingerprint, doomedCt);
    expect(restored.state).toBe('failed');
    expect(restored.error).toMatchObject({ code: 'lineage_key_missing', message: expect.stringContaining(doomed.lineage_id) });

    // The lineage not destroyed still opens, from its rows and through a job.
    const live = await rowsOf(kept.lineage_id);
    expect((await opensFrom(live.lineage, live.generations[0])).isPrivate()).toBe(true);
    const ct = await download(s.api, u.token, (await encrypt(s.api, u.token, kept.fingerprint, [{ name: 'k', data: Buffer.from('still here') }])).job_id);
    const dec = await decrypt(kept.fingerprint, ct);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(s.api, u.token, dec.job_id)).toString()).toBe('still here');
  }, 60_000);

  it('a lineage made with the setting off has no token key: its backup copy still opens after destruction, with keyring and root key', async () => {
    s.c.config.masterKeys.lineageTokenKeys = false;
    let key: Awaited<ReturnType<typeof createKey>>;
    try {
      key = await createKey(s.api, u.token, { label: 'plain' });
    } finally {
      s.c.config.masterKeys.lineageTokenKeys = true;
    }
    const backup = await rowsOf(key.lineage_id);
    expect(backup.lineage.token_key).toBe(false);
    expect(hsm.labels()).not.toContain(lineageKeyLabel(key.lineage_id));
    expect((await s.api('POST', `/keys/${key.fingerprint}/destruction`, { token: u.apiKey, body: { waiting_days: 7 } })).status).toBe(202);
    await withClockAdvanced(8 * DAY, async () => expect((await destroyDueGenerations(s.c)).destroyed).toBe(1));
    expect((await rowsOf(key.lineage_id)).generations[0].private_sealed).toBe('');
    expect((await opensFrom(backup.lineage, backup.generations[0])).isPrivate()).toBe(true);
  });

  it('a lineage that is never stored leaves no token key: refused at the plan limit in the request, or in its job', async () => {
    const limits = { keys: 1, api_keys: 1, shares: 1, monthly_encrypted_bytes: 1 << 30, concurrent_jobs: 5, file_size: 1 << 26 };
    const env = {
      MASTER_KEY_URI: hsm.uri('root'),
      LINEAGE_TOKEN_KEYS: 'true',
      BILLING_ENFORCE_LIMITS: 'true',
      BILLING_PLANS: JSON.stringify({ free: limits }),
    };
    const web = await startTestService({ roles: ['web'], env }); // no worker yet: the RSA job waits
    try {
      const v = await registerUser(web.api);
      const before = new Set(hsm.labels());
      const generate = (label: string, algorithm = 'curve25519') =>
        web.api('POST', '/keys/generate-key', {
          token: v.token,
          form: { label, name: 'Ann Example', email: 'ann@example.test', passphrase: PASSPHRASE, algorithm },
        });
      const rsa = await generate('rsa', 'rsa3072');
      expect(rsa.status, JSON.stringify(rsa.body)).toBe(202);
      // Both pass the early check (nothing stored yet) and make their token key; one is stored.
      const both = await Promise.all([generate('a'), generate('b')]);
      expect(both.map((r) => r.status).sort()).toEqual([201, 402]);
      const pool = await startWorkers(web.c, [{ queue: 'crypto', concurrency: 1 }]);
      try {
        const job = await web.api('GET', `/jobs/${rsa.body.job_id}`, { token: v.token, headers: { prefer: 'wait=60' } });
        expect([job.body.state, job.body.error?.code]).toEqual(['failed', 'plan_limit_reached']);
      } finally {
        await pool.close();
      }
      const stored = await web.c.db('key_lineages').where({ user_id: v.id }).pluck('id');
      expect(stored).toHaveLength(1);
      expect(hsm.labels().filter((l) => !before.has(l))).toEqual(stored.map(lineageKeyLabel));
    } finally {
      await web.stop();
    }
  }, 120_000);

  it('a token that refuses to create the key, cannot be logged in to, or has lost the key gives an error naming the lineage, never a 500', async () => {
    const generate = (api: typeof s.api, label: string) =>
      api('POST', '/keys/generate-key', { token: u.token, form: { label, name: 'Ann Example', email: 'ann@example.test', passphrase: PASSPHRASE } });
    const refused = await hsm.full(() => generate(s.api, 'refused'));
    expect(refused.status, JSON.stringify(refused.body)).toBe(503);
    expect(refused.headers.get('content-type')).toContain('application/problem+json');
    expect(refused.body).toMatchObject({
      code: 'lineage_key_unavailable',
      detail: expect.stringMatching(/^The token could not create the key of lineage [0-9a-f-]{36}: CKR_GENERAL_ERROR\.$/),
    });
    // The login lost and the PIN unreadable: said with the lineage and the cause, no PIN.
    const unreachable = await hsm.loggedOut(() => generate(s.api, 'no-login'));
    expect(unreachable.status, JSON.stringify(unreachable.body)).toBe(503);
    expect(unreachable.body.detail).toMatch(
      /^The token could not create the key of lineage [0-9a-f-]{36}: MASTER_KEY_URI: the PIN file \S+ cannot be read \(ENOENT\)\.$/,
    );
    expect(await s.c.db('key_lineages').where({ user_id: u.id }).whereIn('label', ['refused', 'no-login'])).toHaveLength(0);

    const lost = await createKey(s.api, u.token, { label: 'lost' });
    const ct = await download(s.api, u.token, (await encrypt(s.api, u.token, lost.fingerprint, [{ name: 'x', data: randomBytes(64) }])).job_id);
    hsm.destroyKey(lineageKeyLabel(lost.lineage_id));
    const dec = await decrypt(lost.fingerprint, ct);
    expect(dec.state).toBe('failed');
    expect(dec.error).toEqual({
      code: 'lineage_key_missing',
      message: `The token holds no key for lineage ${lost.lineage_id} (${lineageKeyLabel(lost.lineage_id)}): the private keys of this lineage cannot be opened.`,
    });
    const rotate = await s.api('POST', `/keys/${lost.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotate.body.error ?? rotate.body, JSON.stringify(rotate.body)).toMatchObject({ code: 'lineage_key_missing' });
  });
});
