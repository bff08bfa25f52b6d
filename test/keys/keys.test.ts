import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService, type ManualClockFollowingTime } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob, waitJob } from '../support/keys';
import { generateKey } from '../../lib/pgp/keys';

let s: TestService;
let owner: Awaited<ReturnType<typeof registerUser>>;
let other: Awaited<ReturnType<typeof registerUser>>;

beforeAll(async () => {
  s = await startTestService({ env: { MAX_FILE_BYTES: String(5 << 20), MAX_FILES_PER_JOB: '4' } });
  owner = await registerUser(s.api);
  other = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
});

const file = (name: string, size = 1024) => ({ name, data: randomBytes(size) });

describe('generate and list keys', () => {
  it('generates a curve25519 key at once from a multipart form, and from JSON', async () => {
    const key = await createKey(s.api, owner.token, { label: 'gen-test', environment: 'staging', expires_in_days: '30' });
    expect(key).toMatchObject({ label: 'gen-test', environment: 'staging', status: 'active', active: true, generation: 1, algorithm: 'curve25519' });
    expect(key.fingerprint).toMatch(/^[0-9a-f]{40}$/);
    expect(new Date((key as unknown as { expires_at: string }).expires_at).getTime()).toBeGreaterThan(Date.now() + 29 * 86400_000);
    const json = await s.api('POST', '/keys/generate-key', {
      token: owner.token,
      body: { label: 'json', name: 'J', email: 'j@example.test', passphrase: PASSPHRASE },
    });
    expect(json.status).toBe(201);
  });

  it('generates RSA keys as a crypto job', async () => {
    const res = await s.api('POST', '/keys/generate-key', {
      token: owner.token,
      form: { label: 'rsa', name: 'R', email: 'r@example.test', passphrase: PASSPHRASE, algorithm: 'rsa3072' },
    });
    expect(res.status).toBe(202);
    expect(res.headers.get('location')).toBe(`/api/v1/jobs/${res.body.job_id}`);
    const job = await waitJob(s.api, owner.token, res.body.job_id);
    expect(job.state).toBe('completed');
    expect(job.result.key).toMatchObject({ label: 'rsa', algorithm: 'rsa3072', status: 'active' });
  }, 60_000);

  it('validates the form', async () => {
    const bad = await s.api('POST', '/keys/generate-key', {
      token: owner.token,
      form: { label: '', name: 'A', email: 'nope', passphrase: 'short', algorithm: 'dsa' },
    });
    expect(bad.status).toBe(422);
    expect(bad.body.errors.map((e: { path: string }) => e.path).sort()).toEqual(['body.algorithm', 'body.email', 'body.label', 'body.passphrase']);
    const text = await s.api('POST', '/keys/generate-key', { token: owner.token, raw: 'label=x', headers: { 'content-type': 'text/plain' } });
    expect(text.status).toBe(415);
    expect((await s.api('POST', '/keys/generate-key', { form: { label: 'x' } })).status).toBe(401);
  });

  it('serves the illustrative POST /keys with an API key, returning the generated passphrase once', async () => {
    const res = await s.api('POST', '/keys', { token: owner.apiKey, body: { label: 'sample', env: 'dev' } });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ label: 'sample', env: 'dev', status: 'active' });
    expect(res.body.lineage_id).toMatch(/^[0-9a-f-]{36}$/);
    const data = randomBytes(2048);
    const enc = await encrypt(s.api, owner.apiKey, res.body.fingerprint, [{ name: 'x.bin', data }]);
    const dec = await runJob(s.api, owner.apiKey, '/keys/decrypt', {
      fingerprint: res.body.fingerprint,
      passphrase: res.body.passphrase,
      files: [{ name: 'x.bin.gpg', data: await download(s.api, owner.apiKey, enc.job_id) }],
    });
    expect(Buffer.compare(await download(s.api, owner.apiKey, dec.job_id), data)).toBe(0);
  });

  it('lists with filters and pages, never private material, only own keys', async () => {
    const u = await registerUser(s.api);
    await createKey(s.api, u.token, { label: 'a', environment: 'prod' });
    const b = await createKey(s.api, u.token, { label: 'b', environment: 'prod' });
    await createKey(s.api, u.token, { label: 'a', environment: 'test' });
    await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: b.fingerprint } });
    // An expired key is inactive too (no route makes one: its expiry is moved into the past).
    const expired = await createKey(s.api, u.token, { label: 'c', environment: 'test' });
    await s.c
      .db('pgp_keys')
      .where({ fingerprint: expired.fingerprint })
      .update({ expires_at: new Date(Date.now() - 1000) });
    const all = await s.api('GET', '/keys/list?page_size=2', { token: u.token });
    expect(all.body).toMatchObject({ total: 4, page: 1, page_size: 2 });
    expect(all.body.items).toHaveLength(2);
    // The last page, and a page past the end, still say how many there are.
    expect((await s.api('GET', '/keys/list?page_size=3&page=2', { token: u.token })).body).toMatchObject({ total: 4, items: [{}] });
    expect((await s.api('GET', '/keys/list?page_size=2&page=3', { token: u.token })).body).toMatchObject({ total: 4, items: [] });
    expect(JSON.stringify(all.body)).not.toMatch(/PRIVATE|private_sealed|secret/i);
    expect((await s.api('GET', '/keys/list?environment=prod', { token: u.token })).body.total).toBe(2);
    expect((await s.api('GET', '/keys/list?label=a', { token: u.token })).body.total).toBe(2);
    expect((await s.api('GET', '/keys/list?label=a&environment=test&active=true', { token: u.token })).body.total).toBe(1);
    const active = await s.api('GET', '/keys/list?active=true', { token: u.token });
    expect(active.body.items.map((k: { label: string }) => k.label).sort()).toEqual(['a', 'a']);
    const inactive = await s.api('GET', '/keys/list?active=false', { token: u.token });
    expect(inactive.body.items.map((k: { label: string; status: string }) => [k.label, k.status])).toEqual([
      ['c', 'expired'],
      ['b', 'disabled'],
    ]);
    expect((await s.api('GET', '/keys/list?active=maybe', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/keys/list', { token: other.token })).body.items.every((k: { lineage_id: string }) => k.lineage_id !== b.lineage_id)).toBe(
      true,
    );
  });
});

describe('public keys', () => {
  it('returns the armored public key as JSON or application/pgp-keys; 404 for another account', async () => {
    const key = await createKey(s.api, owner.token);
    const json = await s.api('POST', '/keys/get-public-key', { token: owner.token, body: { fingerprint: key.fingerprint.toUpperCase() } });
    expect(json.status).toBe(200);
    expect(json.body.public_key).toContain('-----BEGIN PGP PUBLIC KEY BLOCK-----');
    expect(json.body.public_key).not.toContain('PRIVATE');
    const armored = await s.api('POST', '/keys/get-public-key', {
      token: owner.token,
      body: { fingerprint: key.fingerprint },
      headers: { accept: 'application/pgp-keys' },
    });
    expect(armored.headers.get('content-type')).toContain('application/pgp-keys');
    expect(armored.body).toBe(json.body.public_key);
    const theirs = await s.api('POST', '/keys/get-public-key', { token: other.token, body: { fingerprint: key.fingerprint } });
    expect(theirs.status).toBe(404);
    expect(theirs.body.code).toBe('key_not_found');
    expect((await s.api('POST', '/keys/get-public-key', { token: owner.token, body: { fingerprint: 'xyz' } })).status).toBe(422);
  });
});

describe('encrypt and decrypt', () => {
  it('round-trips several files (binary and armored), keeping names, and counts usage', async () => {
    const key = await createKey(s.api, owner.token);
    const files = [file('report.pdf', 300_000), file('empty.txt', 0), file('notes.md', 10)];
    const enc = await encrypt(s.api, owner.token, key.fingerprint, files);
    expect(enc.result.fingerprint_used).toBe(key.fingerprint);
    expect(enc.result.files.map((f: { name: string }) => f.name)).toEqual(['report.pdf.gpg', 'empty.txt.gpg', 'notes.md.gpg']);
    expect(enc.progress).toMatchObject({ bytes_done: 300_010, bytes_total: 300_010, files_done: 3, files_total: 3 });
    const armored = await encrypt(s.api, owner.token, key.fingerprint, [files[2]], { armor: 'true' });
    const armoredOut = await download(s.api, owner.token, armored.job_id);
    expect(armoredOut.toString()).toMatch(/^-----BEGIN PGP MESSAGE-----/);

    const ciphertexts = await Promise.all(enc.result.files.map((f: { n: number }) => download(s.api, owner.token, enc.job_id, f.n)));
    const dec = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [...ciphertexts.map((data, i) => ({ name: `${files[i].name}.gpg`, data })), { name: 'x.asc', data: armoredOut }],
    });
    expect(dec.state).toBe('completed');
    expect(dec.result.files.map((f: { name: string }) => f.name)).toEqual(['report.pdf', 'empty.txt', 'notes.md', 'notes.md']);
    for (const [i, f] of files.entries()) expect(Buffer.compare(await download(s.api, owner.token, dec.job_id, i), f.data)).toBe(0);

    const row = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first();
    expect(row.ops_count).toBe(3);
    expect(row.bytes_count).toBeGreaterThan(600_000);
    expect(row.last_used_at).not.toBeNull();
    const audit = await s.c.db('audit_logs').where({ user_id: owner.id, target: key.fingerprint }).select('action', 'status');
    expect(audit).toEqual(
      expect.arrayContaining([
        { action: 'keys.generate', status: 'success' },
        { action: 'keys.encrypt', status: 'success' },
        { action: 'keys.decrypt', status: 'success' },
      ]),
    );
  });

  it('compresses when asked', async () => {
    const key = await createKey(s.api, owner.token);
    const data = Buffer.alloc(200_000, 'a');
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [{ name: 'a.txt', data }], { compress: 'true' });
    expect(enc.result.files[0].size).toBeLessThan(10_000);
    const dec = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.txt.gpg', data: await download(s.api, owner.token, enc.job_id) }],
    });
    expect(Buffer.compare(await download(s.api, owner.token, dec.job_id), data)).toBe(0);
  });

  it('encrypts to a supplied public key, and refuses private or malformed keys', async () => {
    const supplied = await generateKey({ name: 'Ext', email: 'ext@example.test', algorithm: 'curve25519', secret: 'x'.repeat(20) });
    const enc = await runJob(s.api, owner.token, '/keys/encrypt', { public_key: supplied.publicArmored, files: [file('a.bin')] });
    expect(enc.state).toBe('completed');
    expect(enc.result.fingerprint_used).toBe(supplied.fingerprint);
    const asFile = await runJob(s.api, owner.token, '/keys/encrypt', {
      public_key: { name: 'key.asc', data: Buffer.from(supplied.publicArmored) },
      files: [file('a.bin')],
    });
    expect(asFile.state).toBe('completed');
    const priv = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { public_key: supplied.privateArmored, files: [file('a.bin')] } });
    expect(priv.status).toBe(422);
    expect(priv.body.code).toBe('private_key_supplied');
    const junk = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { public_key: 'hello', files: [file('a.bin')] } });
    expect(junk.status).toBe(422);
    expect(junk.body.code).toBe('invalid_public_key');
    const both = await s.api('POST', '/keys/encrypt', {
      token: owner.token,
      form: { public_key: supplied.publicArmored, fingerprint: supplied.fingerprint, files: [file('a.bin')] },
    });
    expect(both.status).toBe(422);
  });

  it('refuses unknown, foreign and disabled keys, and bad uploads', async () => {
    const key = await createKey(s.api, owner.token);
    const foreign = await s.api('POST', '/keys/encrypt', { token: other.token, form: { fingerprint: key.fingerprint, files: [file('a')] } });
    expect(foreign.status).toBe(404);
    const unknown = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { fingerprint: 'ab'.repeat(20), files: [file('a')] } });
    expect(unknown.status).toBe(404);
    const none = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { fingerprint: key.fingerprint } });
    expect(none.status).toBe(422);
    expect(none.body.code).toBe('no_files');
    const big = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { fingerprint: key.fingerprint, files: [file('big', (5 << 20) + 1)] } });
    expect(big.status).toBe(413);
    expect(big.body.code).toBe('file_too_large');
    const many = await s.api('POST', '/keys/encrypt', {
      token: owner.token,
      form: { fingerprint: key.fingerprint, files: [1, 2, 3, 4, 5].map((i) => file(`f${i}`)) },
    });
    expect(many.status).toBe(413);
    expect(many.body.code).toBe('too_many_files');
    const broken = await s.api('POST', '/keys/encrypt', {
      token: owner.token,
      raw: '--xyz\r\nContent-Disposition: form-data; name="files"; filename="a"\r\n\r\nabc',
      headers: { 'content-type': 'multipart/form-data; boundary=xyz' },
    });
    expect(broken.status).toBeGreaterThanOrEqual(400);
    expect(broken.status).toBeLessThan(500);

    const disabled = await s.api('POST', '/keys/disable-key', { token: owner.token, body: { fingerprint: key.fingerprint } });
    expect(disabled.body).toMatchObject({ status: 'disabled', active: false });
    const refused = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { fingerprint: key.fingerprint, files: [file('a')] } });
    expect(refused.status).toBe(409);
    expect(refused.body.code).toBe('key_disabled');
    expect((await s.api('POST', '/keys/disable-key', { token: other.token, body: { fingerprint: key.fingerprint } })).status).toBe(404);
    // Nothing of the refused uploads is left in the blob store.
    const jobsDir = await import('node:fs/promises').then((fs) => fs.readdir(`${s.env.BLOB_STORE_URL}/jobs`).catch(() => [] as string[]));
    const known = (await s.c.db('jobs').select('id')).map((r: { id: string }) => r.id);
    expect(jobsDir.filter((d) => !known.includes(d))).toEqual([]);
  });

  it('still decrypts with a disabled key, so no data is stranded', async () => {
    const key = await createKey(s.api, owner.token);
    const data = randomBytes(1000);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [{ name: 'd.bin', data }]);
    await s.api('POST', '/keys/disable-key', { token: owner.token, body: { fingerprint: key.fingerprint } });
    const dec = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'd.bin.gpg', data: await download(s.api, owner.token, enc.job_id) }],
    });
    expect(Buffer.compare(await download(s.api, owner.token, dec.job_id), data)).toBe(0);
  });

  it('answers a wrong passphrase with 422 wrong_passphrase, audited, and rate limits guessing', async () => {
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [file('w.bin')]);
    const data = await download(s.api, owner.token, enc.job_id);
    const res = await s.api('POST', '/keys/decrypt', {
      token: owner.token,
      form: { fingerprint: key.fingerprint, passphrase: 'not the passphrase', files: [{ name: 'w.gpg', data }] },
    });
    expect(res.status).toBe(422);
    expect(res.body.code).toBe('wrong_passphrase');
    expect(JSON.stringify(res.body)).not.toContain('not the passphrase');
    const audit = await s.c.db('audit_logs').where({ user_id: owner.id, action: 'keys.decrypt', status: 'failure' }).orderBy('id', 'desc').first();
    expect(audit.details).toEqual({ reason: 'wrong_passphrase' });
    let last = res;
    for (let i = 0; i < 10 && last.status !== 429; i++) {
      last = await s.api('POST', '/keys/decrypt', {
        token: owner.token,
        form: { fingerprint: key.fingerprint, passphrase: 'still wrong!!', files: [{ name: 'w.gpg', data }] },
      });
    }
    expect(last.status).toBe(429);
    expect(Number(last.headers.get('retry-after'))).toBeGreaterThan(0);
  });

  it('refuses a wrong passphrase or an unknown key before storing the upload', async () => {
    const key = await createKey(s.api, owner.token);
    // Over the 5 MiB limit: were the file stored first, the answer would be 413.
    const big = file('big.gpg', 6 << 20);
    const wrong = await s.api('POST', '/keys/decrypt', {
      token: owner.token,
      form: { fingerprint: key.fingerprint, passphrase: 'not the passphrase', files: [big] },
    });
    expect(wrong.status).toBe(422);
    expect(wrong.body.code).toBe('wrong_passphrase');
    const unknown = await s.api('POST', '/keys/encrypt', { token: owner.token, form: { fingerprint: 'cd'.repeat(20), files: [big] } });
    expect(unknown.status).toBe(404);
  });

  it('fails tampered ciphertext on integrity, offers no output and keeps nothing', async () => {
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [file('t.bin', 400_000)]);
    const data = await download(s.api, owner.token, enc.job_id);
    data[data.length - 100] ^= 0x01;
    const dec = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 't.bin.gpg', data }],
    });
    expect(dec.state).toBe('failed');
    expect(dec.error.code).toBe('integrity_check_failed');
    expect(dec.result).toBeNull();
    const dl = await s.api('GET', `/jobs/${dec.job_id}/files/0`, { token: owner.token });
    expect(dl.status).toBe(409);
    const fs = await import('node:fs/promises');
    expect(await fs.readdir(`${s.env.BLOB_STORE_URL}/jobs/${dec.job_id}`).catch(() => [])).toEqual([]);
    const audit = await s.c.db('audit_logs').where({ user_id: owner.id, action: 'keys.decrypt', status: 'failure' }).orderBy('id', 'desc').first();
    expect(audit.details).toMatchObject({ code: 'integrity_check_failed', job_id: dec.job_id });
  });

  it('fails a file that is not encrypted to this key, and garbage input', async () => {
    const mine = await createKey(s.api, owner.token);
    const another = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, another.fingerprint, [file('n.bin')]);
    const wrongKey = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: mine.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'n.gpg', data: await download(s.api, owner.token, enc.job_id) }],
    });
    expect(wrongKey.error.code).toBe('no_matching_key');
    const junk = await runJob(s.api, owner.token, '/keys/decrypt', { fingerprint: mine.fingerprint, passphrase: PASSPHRASE, files: [file('junk.gpg', 5000)] });
    expect(junk.state).toBe('failed');
    expect(junk.error.code).toBe('malformed_message');
  });
});

describe('jobs', () => {
  it('hides other accounts’ jobs and checks file numbers', async () => {
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [file('a')]);
    expect((await s.api('GET', `/jobs/${enc.job_id}`, { token: other.token })).status).toBe(404);
    expect((await s.api('GET', `/jobs/${enc.job_id}/files/0`, { token: other.token })).status).toBe(404);
    expect((await s.api('GET', `/jobs/${enc.job_id}/files/1`, { token: owner.token })).status).toBe(404);
    expect((await s.api('GET', '/jobs/not-a-uuid', { token: owner.token })).status).toBe(422);
    // Numbers in a URL are decimal digits: not what Number() would also read (white space, hex, exponents, '').
    for (const n of ['0%0A', '%200', '0x0', '0e0', '-0', '0.0', '+0']) {
      const res = await s.api('GET', `/jobs/${enc.job_id}/files/${n}`, { token: owner.token });
      expect(res.status, n).toBe(422);
      expect(res.body.errors[0].path, n).toBe('params.n');
    }
    expect((await s.api('GET', `/jobs/${enc.job_id}/files/00`, { token: owner.token })).status).toBe(200);
    for (const q of ['page=0x2', 'page=', 'page_size=1e1', 'page_size=%2010', 'page=true']) {
      expect((await s.api('GET', `/keys/list?${q}`, { token: owner.token })).status, q).toBe(422);
    }
    expect((await s.api('GET', '/keys/list?page=1&page_size=10', { token: owner.token })).status).toBe(200);
  });

  it('returns the same job for a repeated Idempotency-Key', async () => {
    const key = await createKey(s.api, owner.token);
    const headers = { 'idempotency-key': `idem-${Date.now()}` };
    const same = file('a');
    const first = await s.api('POST', '/keys/encrypt', { token: owner.token, headers, form: { fingerprint: key.fingerprint, files: [same] } });
    const second = await s.api('POST', '/keys/encrypt', { token: owner.token, headers, form: { fingerprint: key.fingerprint, files: [same] } });
    expect(first.status).toBe(202);
    expect(second.body.job_id).toBe(first.body.job_id);
    const race = { 'idempotency-key': `race-${Date.now()}` };
    const concurrent = await Promise.all(
      [1, 2, 3].map(() => s.api('POST', '/keys/encrypt', { token: owner.token, headers: race, form: { fingerprint: key.fingerprint, files: [same] } })),
    );
    // One job; a request that came while its upload still arrived is told so (409, as Stripe), and a
    // retry once it has been answered replays it.
    const jobs = concurrent.filter((r) => r.status === 202);
    expect(new Set(jobs.map((r) => r.body.job_id)).size).toBe(1);
    for (const r of concurrent.filter((r) => r.status !== 202)) expect(r.body.code).toBe('idempotency_key_in_use');
    const retried = await s.api('POST', '/keys/encrypt', { token: owner.token, headers: race, form: { fingerprint: key.fingerprint, files: [same] } });
    expect(retried.body.job_id).toBe(jobs[0].body.job_id);
    const otherKind = await s.api('POST', '/keys/decrypt', {
      token: owner.token,
      headers,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [file('a')] },
    });
    expect(otherKind.status).toBe(422);
    expect(otherKind.body.code).toBe('idempotency_key_reused');
  });

  it('deletes outputs after the retention period (maintenance queue), then answers 410', async () => {
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [file('a')]);
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance((s.config.jobRetentionHours + 1) * 3600_000);
    try {
      const id = await s.c.jobs.enqueue('purge-job-outputs', {});
      const queue = s.c.jobs.queue('maintenance');
      await expect.poll(async () => (await queue.getJob(id))?.finishedOn !== undefined, { timeout: 10_000 }).toBe(true);
    } finally {
      clock.advance(-(s.config.jobRetentionHours + 1) * 3600_000);
    }
    const dl = await s.api('GET', `/jobs/${enc.job_id}/files/0`, { token: owner.token });
    expect(dl.status).toBe(410);
    expect(dl.body.code).toBe('output_expired');
    const job = await s.api('GET', `/jobs/${enc.job_id}`, { token: owner.token });
    expect(job.body.result).toMatchObject({ outputs_expired: true, files: [] });
  });

  it('never lets the passphrase reach Redis, the audit log or job rows in plaintext', async () => {
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [file('a')]);
    const dec = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.gpg', data: await download(s.api, owner.token, enc.job_id) }],
    });
    expect(dec.state).toBe('completed');
    for (const k of await s.c.redis.keys(`*${s.config.redisPrefix}*`)) {
      const type = await s.c.redis.type(k);
      const dump =
        type === 'hash'
          ? JSON.stringify(await s.c.redis.hgetall(k))
          : type === 'string'
            ? await s.c.redis.get(k)
            : type === 'list'
              ? JSON.stringify(await s.c.redis.lrange(k, 0, -1))
              : '';
      expect(dump).not.toContain(PASSPHRASE);
    }
    expect(JSON.stringify(await s.c.db('audit_logs').select('details'))).not.toContain(PASSPHRASE);
    expect(JSON.stringify(await s.c.db('jobs').select('request', 'result', 'error'))).not.toContain(PASSPHRASE);
    expect(JSON.stringify(await s.c.db('key_lineages').select('*'))).not.toContain(PASSPHRASE);
  });
});
