import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob, waitJob } from '../support/keys';
import { unlockLineage, unlockGeneration } from '../../lib/keys/key-catalog';
import { passphraseBudgetKey } from '../../lib/keys/passphrases';
import { startService } from '../../lib/main';
import * as m005 from '../../db/migrations/005_key_integrity';

/**
 * Key passphrases: one limited, audited check for every use (decrypt and rotate), holding under parallel
 * guesses; a passphrase change leaves nothing the old passphrase can open; job rows keep no lock;
 * another account's key is 404 and audited.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

const statuses = (answers: { status: number }[]) => answers.reduce<Record<number, number>>((n, a) => ({ ...n, [a.status]: (n[a.status] ?? 0) + 1 }), {});
const wrongAudits = async (userId: string, action: string) =>
  (await s.c.db('audit_logs').where({ user_id: userId, action, status: 'failure' })).filter(
    (r: { details: { reason?: string } }) => r.details.reason === 'wrong_passphrase',
  ).length;

describe('passphrase guessing', () => {
  it('rotate with current_passphrase is limited and audited like decrypt, with an API key too', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const answers = [];
    for (let i = 0; i < 12; i++) {
      answers.push(
        await s.api('POST', `/keys/${key.fingerprint}/rotate`, {
          token: u.apiKey,
          body: { current_passphrase: `wrong guess ${i}`, new_passphrase: 'a passphrase I chose' },
        }),
      );
    }
    expect(statuses(answers)).toEqual({ 422: 10, 429: 2 });
    expect(answers[11].headers.get('retry-after')).toBeTruthy();
    expect(await wrongAudits(u.id, 'keys.rotate')).toBe(10);
    // The budget is the key's, shared with decryption: the right passphrase is refused now too.
    const right = await s.api('POST', `/keys/${key.fingerprint}/rotate`, {
      token: u.apiKey,
      body: { current_passphrase: PASSPHRASE, new_passphrase: 'a passphrase I chose' },
    });
    expect(right.status).toBe(429);
  });

  it('rotate with only current_passphrase checks it too (a wrong one is not ignored)', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const wrong = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.apiKey, body: { current_passphrase: 'not the passphrase' } });
    expect(wrong.status).toBe(422);
    expect(wrong.body.code).toBe('wrong_passphrase');
    expect(await wrongAudits(u.id, 'keys.rotate')).toBe(1);
    expect(await s.c.db('jobs').where({ user_id: u.id, kind: 'rotate-key' })).toHaveLength(0);
    const right = await s.api('POST', `/keys/${key.fingerprint}/rotate`, {
      token: u.apiKey,
      headers: { prefer: 'wait=30' },
      body: { current_passphrase: PASSPHRASE },
    });
    expect(right.status, JSON.stringify(right.body)).toBe(200);
    expect(right.body.result).toMatchObject({ rotated: true });
  });

  it('a wrong passphrase costs one point per decrypt request, checked before the upload or after it', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const file = [{ name: 'x.gpg', data: randomBytes(64) }];
    const answers = [];
    for (let i = 0; i < 11; i++) {
      // Fields first: checked when the file starts. Fields after the file: checked by the handler.
      const form =
        i % 2
          ? { fingerprint: key.fingerprint, passphrase: `wrong guess ${i}`, files: file }
          : { files: file, fingerprint: key.fingerprint, passphrase: `wrong guess ${i}` };
      answers.push(await s.api('POST', '/keys/decrypt', { token: u.token, form }));
    }
    expect(answers.map((a) => a.status)).toEqual([...Array(10).fill(422), 429]);
    expect(Number(answers[10].headers.get('retry-after'))).toBeGreaterThan(0);
    expect(await wrongAudits(u.id, 'keys.decrypt')).toBe(10);
  });

  it('20 parallel wrong passphrases against one key get 10 checks', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        s.api('POST', `/keys/${key.fingerprint}/rotate`, {
          token: u.apiKey,
          body: { current_passphrase: `wrong guess ${i}`, new_passphrase: 'a passphrase I chose' },
        }),
      ),
    );
    expect(statuses(answers)).toEqual({ 422: 10, 429: 10 });
    expect(await wrongAudits(u.id, 'keys.rotate')).toBe(10);
  });

  it('50 parallel wrong passphrases against one key get exactly 10 checks', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const answers = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        s.api('POST', '/keys/decrypt', {
          token: u.token,
          form: { fingerprint: key.fingerprint, passphrase: `wrong guess ${i}`, files: [{ name: 'x.gpg', data: randomBytes(64) }] },
        }),
      ),
    );
    expect(statuses(answers)).toEqual({ 422: 10, 429: 40 });
    expect(await wrongAudits(u.id, 'keys.decrypt')).toBe(10);
    const refused = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.decrypt', status: 'failure' });
    expect(refused.filter((r: { details: { reason?: string } }) => r.details.reason === 'rate_limited')).toHaveLength(40);
  });

  it('a right passphrase gets its point back', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data: randomBytes(100) }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);
    for (let i = 0; i < 12; i++) {
      const job = await runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 'a.gpg', data: ciphertext }],
      });
      expect(job.state).toBe('completed');
    }
    // Checked before the upload and in the handler, an honest request leaves the budget as it was.
    expect((await s.c.limiters.passphrase.get(passphraseBudgetKey(key.lineage_id, u.id)))?.consumedPoints ?? 0).toBe(0);
  });
});

describe('a passphrase change', () => {
  it('makes a new unlock key: the old passphrase with the old row opens neither new nor re-sealed generations', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes(500);
    const before = await download(s.api, u.token, (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'b.bin', data }])).job_id);
    const oldLineage = await s.c.db('key_lineages').where({ id: key.lineage_id }).first();

    const res = await s.api('POST', `/keys/${key.fingerprint}/rotate`, {
      token: u.token,
      headers: { prefer: 'wait=30' },
      body: { current_passphrase: PASSPHRASE, new_passphrase: 'a brand new passphrase' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const newLineage = await s.c.db('key_lineages').where({ id: key.lineage_id }).first();
    expect(newLineage.unlock_public).not.toBe(oldLineage.unlock_public);

    // An attacker with the old row (a backup) and the old passphrase:
    const oldUnlock = await unlockLineage(s.c, oldLineage, PASSPHRASE);
    for (const g of await s.c.db('pgp_keys').where({ lineage_id: key.lineage_id })) {
      await expect(unlockGeneration(s.c, oldUnlock, g), `generation ${g.generation}`).rejects.toThrow();
    }
    // The owner with the new passphrase decrypts old and new ciphertexts.
    const after = await download(s.api, u.token, (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'c.bin', data }])).job_id);
    for (const ciphertext of [before, after]) {
      const job = await runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: 'a brand new passphrase',
        files: [{ name: 'x.gpg', data: ciphertext }],
      });
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, job.job_id), data)).toBe(0);
    }
  });
});

describe('audit rows written by workers', () => {
  it("carry the request id (ours), the client's own id and the client address of the request that enqueued the job (generate-key, rotate-key)", async () => {
    const u = await registerUser(s.api);
    const gen = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      headers: { 'x-request-id': 'req-generate-origin' },
      form: { label: 'rsa', name: 'R', email: 'r@example.test', passphrase: PASSPHRASE, algorithm: 'rsa3072' },
    });
    expect(gen.status).toBe(202);
    const job = await waitJob(s.api, u.token, gen.body.job_id);
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    const generated = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.generate', status: 'success' }).first();
    expect(generated).toMatchObject({
      request_id: gen.headers.get('x-request-id'),
      client_request_id: 'req-generate-origin',
      ip: expect.stringContaining('127.0.0.1'),
    });

    const fpr = job.result.key.fingerprint as string;
    const rot = await s.api('POST', `/keys/${fpr}/rotate`, { token: u.token, headers: { prefer: 'wait=30', 'x-request-id': 'req-rotate-origin' }, body: {} });
    expect(rot.status, JSON.stringify(rot.body)).toBe(200);
    const rotated = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.rotate', status: 'success' }).first();
    expect(rotated).toMatchObject({
      target: fpr,
      request_id: rot.headers.get('x-request-id'),
      client_request_id: 'req-rotate-origin',
      ip: expect.stringContaining('127.0.0.1'),
    });
  });
});

describe('a generate-key job', () => {
  it('keeps no lock in its row: the lock travels sealed in the queue payload', async () => {
    const u = await registerUser(s.api);
    const res = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      form: { label: 'rsa', name: 'R', email: 'r@example.test', passphrase: PASSPHRASE, algorithm: 'rsa3072' },
    });
    expect(res.status).toBe(202);
    const row = await s.c.db('jobs').where({ id: res.body.job_id }).first();
    expect(JSON.stringify(row.request)).not.toMatch(/unlock_locked|argon2|"ct"|s1\./);
    // Nor what decides where the first generation's secret is sealed: that travels with the lock.
    expect(row.request.lineage).not.toHaveProperty('unlock_public');
    const job = await waitJob(s.api, u.token, res.body.job_id);
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    const lineage = await s.c.db('key_lineages').where({ id: job.result.key.lineage_id }).first();
    expect(lineage.unlock_locked).toMatch(/^s1\./);
  });
});

describe("another account's key", () => {
  it("is 404, and the caller's audit trail does not say that another account holds it (a fingerprint is public)", async () => {
    const owner = await registerUser(s.api);
    const intruder = await registerUser(s.api);
    const key = await createKey(s.api, owner.token);
    const res = await s.api('POST', '/keys/get-public-key', { token: intruder.token, body: { fingerprint: key.fingerprint } });
    expect(res.status).toBe(404);
    expect(JSON.stringify(res.body)).not.toContain('not_owner');
    expect(await s.c.db('audit_logs').where({ user_id: intruder.id, action: 'keys.deny_access' })).toHaveLength(0);
  });
});

describe('public key columns', () => {
  it('carry a MAC under the master key: a key swapped in the database is refused, nothing is encrypted to it', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const attacker = await createKey(s.api, u.token, { label: 'attacker' });
    const theirs = await s.c.db('pgp_keys').where({ fingerprint: attacker.fingerprint }).first();
    await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).update({ public_armored: theirs.public_armored });
    const enc = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: randomBytes(10) }] },
    });
    expect(enc.status).toBe(500);
    expect(await s.c.db('jobs').where({ user_id: u.id, kind: 'encrypt' })).toHaveLength(0);
    expect((await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(500);

    // The lineage's unlock key (what rotation seals new generations to) likewise.
    const other = await s.c.db('key_lineages').where({ id: attacker.lineage_id }).first();
    await s.c
      .db('key_lineages')
      .where({ id: attacker.lineage_id })
      .update({ unlock_public: (await s.c.db('key_lineages').where({ id: key.lineage_id }).first()).unlock_public });
    expect((await s.api('POST', `/keys/${attacker.fingerprint}/rotate`, { token: u.token, body: {} })).status).toBe(500);
    await s.c.db('key_lineages').where({ id: attacker.lineage_id }).update({ unlock_public: other.unlock_public });
    expect((await s.api('POST', `/keys/${attacker.fingerprint}/rotate`, { token: u.token, body: {} })).status).toBe(202);
  });

  it('a MAC cleared in the database is refused, and not made again when a process starts', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const attacker = await createKey(s.api, u.token, { label: 'attacker' });
    const theirs = await s.c.db('pgp_keys').where({ fingerprint: attacker.fingerprint }).first();
    await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).update({ public_armored: theirs.public_armored, public_mac: null });
    const getPublic = () => s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    expect((await getPublic()).status).toBe(500);
    const started = await startService([], s.config); // a process start (migrations applied already)
    await started.stop();
    expect((await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first()).public_mac).toBeNull();
    expect((await getPublic()).status).toBe(500);
  });

  it('rows from before the MACs get theirs in the migration that adds them, once', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    // The migration reads the master key from the environment, as `npm run migrate` does; this service
    // runs with the development key (no MASTER_KEY in its environment).
    const saved = { MASTER_KEY: process.env.MASTER_KEY, MASTER_KEYS_PREVIOUS: process.env.MASTER_KEYS_PREVIOUS };
    delete process.env.MASTER_KEY;
    delete process.env.MASTER_KEYS_PREVIOUS;
    try {
      await s.c.db.transaction((trx) => m005.down(trx));
      await s.c.db.transaction((trx) => m005.up(trx));
    } finally {
      Object.assign(process.env, Object.fromEntries(Object.entries(saved).filter(([, v]) => v !== undefined)));
    }
    expect(await s.c.db('key_lineages').whereNull('unlock_mac')).toHaveLength(0);
    expect(await s.c.db('pgp_keys').whereNull('public_mac')).toHaveLength(0);
    expect((await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);
  });
});
