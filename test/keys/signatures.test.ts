import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFile } from 'node:fs/promises';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, runJob } from '../support/keys';
import { createPgpHome, plaintextForGpg, type PgpHome } from '../support/gpg';

/**
 * POST /keys/sign and /keys/verify against GnuPG 2.2 and Sequoia (sq 0.27) both ways: our detached and
 * inline signatures verify with `gpg --verify` and `sq verify`; theirs verify here. Tampering, unknown
 * signers, old generations, wrong owners and wrong passphrases (the decrypt guess budget) too.
 */
let s: TestService;
let home: PgpHome;
let u: Awaited<ReturnType<typeof registerUser>>;
let key: { fingerprint: string };
let certPath: string;
const plain = plaintextForGpg(1 << 20);
let plainPath: string;

beforeAll(async () => {
  s = await startTestService();
  home = await createPgpHome();
  u = await registerUser(s.api);
  key = await createKey(s.api, u.token, { label: 'signer', name: 'Signer', email: 'signer@example.test' });
  const pub = await s.api('POST', '/keys/get-public-key', {
    token: u.token,
    body: { fingerprint: key.fingerprint },
    headers: { accept: 'application/pgp-keys' },
  });
  certPath = await home.put('ours.asc', pub.body as string);
  await home.gpg(['--import', certPath]);
  plainPath = await home.put('plain.bin', plain);
}, 60_000);
afterAll(async () => {
  await s?.stop();
  await home?.cleanup();
});

async function sign(fields: Record<string, string>, data = plain, name = 'report.bin') {
  const job = await runJob(s.api, u.token, '/keys/sign', { fingerprint: key.fingerprint, passphrase: PASSPHRASE, ...fields, files: [{ name, data }] });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return { job, output: await download(s.api, u.token, job.job_id) };
}

async function verify(fields: Record<string, string>, files: { data: Buffer; signature?: Buffer }[]) {
  const signatures = files.flatMap((f, n) => (f.signature ? [{ name: `${n}.sig`, data: f.signature }] : []));
  const job = await runJob(s.api, u.token, '/keys/verify', {
    ...fields,
    ...(signatures.length ? { signatures } : {}),
    files: files.map((f, n) => ({ name: `file-${n}`, data: f.data })),
  });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return job.result as {
    valid: boolean;
    signatures: { n: number; valid: boolean; signer_fingerprint: string | null; signed_at: string | null; reason: string | null }[];
  };
}

describe('our signatures, verified by gpg and sq', () => {
  it.each([
    ['binary', 'false', '.sig'],
    ['armored', 'true', '.asc'],
  ])('a detached %s signature', async (_kind, armor, ext) => {
    const { job, output } = await sign({ armor });
    expect(job.result.files[0].name).toBe(`report.bin${ext}`);
    expect(job.result.fingerprint).toBe(key.fingerprint);
    const sigPath = await home.put(`ours-detached${ext}`, output);
    const gpg = await home.gpg(['--status-fd', '2', '--verify', sigPath, plainPath]);
    expect(gpg.stderr).toContain(`VALIDSIG ${key.fingerprint.toUpperCase()}`);
    // SHA-256 or stronger (gpg's VALIDSIG names the hash algorithm: 8 SHA-256, 10 SHA-512).
    expect(Number(/VALIDSIG \S+ \S+ \d+ \d+ \d+ \d+ \d+ (\d+)/.exec(gpg.stderr)![1])).toBeGreaterThanOrEqual(8);
    const sq = await home.sq(['verify', '--signer-cert', certPath, '--detached', sigPath, plainPath]);
    expect(sq.code).toBe(0);
  });

  it('a signed message (detached=false), read by gpg and sq', async () => {
    const { job, output } = await sign({ detached: 'false', armor: 'true' });
    expect(job.result.files[0].name).toBe('report.bin.asc');
    const msgPath = await home.put('signed.asc', output);
    const out = home.file('signed-out.bin');
    const gpg = await home.gpg(['--status-fd', '2', '-o', out, '--decrypt', msgPath]);
    expect(gpg.stderr).toContain(`GOODSIG`);
    expect(Buffer.compare(await readFile(out), plain)).toBe(0);
    expect((await home.sq(['verify', '--signer-cert', certPath, msgPath])).code).toBe(0);
  });

  it('verifies its own signatures, and a tampered signature or content is valid: false', async () => {
    const { output: sig } = await sign({});
    const good = await verify({ fingerprint: key.fingerprint }, [{ data: plain, signature: sig }]);
    expect(good.valid).toBe(true);
    expect(good.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: key.fingerprint, reason: null });
    expect(Date.now() - Date.parse(good.signatures[0].signed_at!)).toBeLessThan(120_000);

    const changed = Buffer.from(plain);
    changed[1000] ^= 1;
    const tamperedSig = Buffer.from(sig);
    tamperedSig[tamperedSig.length - 5] ^= 1;
    const bad = await verify({ fingerprint: key.fingerprint }, [
      { data: changed, signature: sig },
      { data: plain, signature: tamperedSig },
    ]);
    expect(bad.valid).toBe(false);
    expect(bad.signatures.map((v) => [v.n, v.valid, v.reason])).toEqual([
      [0, false, 'bad_signature'],
      [1, false, 'bad_signature'],
    ]);
  });

  it('old generations verify what they signed after a rotation', async () => {
    const k = await createKey(s.api, u.token, { label: 'rotating-signer' });
    const { output: sig } = await runJob(s.api, u.token, '/keys/sign', {
      fingerprint: k.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.bin', data: plain }],
    }).then(async (job) => ({ output: await download(s.api, u.token, job.job_id) }));
    const rotated = await s.api('POST', `/keys/${k.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.body.state).toBe('completed');
    const result = await verify({ fingerprint: rotated.body.result.new_fingerprint }, [{ data: plain, signature: sig }]);
    expect(result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: k.fingerprint });
  }, 60_000);
});

describe('their signatures, verified by us', () => {
  let gpgCert: string;
  let gpgFingerprint: string;
  beforeAll(async () => {
    await home.gpg(['--quick-generate-key', 'Peer <peer@example.test>', 'future-default', 'default', 'never'], { passphrase: '' });
    gpgCert = (await home.gpg(['--export', '--armor', 'peer@example.test'])).stdout.toString();
    gpgFingerprint = /^fpr:+([0-9A-F]{40}):/m.exec((await home.gpg(['--with-colons', '--list-keys', 'peer@example.test'])).stdout.toString())![1].toLowerCase();
  }, 60_000);

  it('gpg detached signatures (binary and armored) and gpg -s messages, with a supplied public key', async () => {
    await home.gpg(['-u', gpgFingerprint, '--detach-sign', '-o', home.file('gpg.sig'), plainPath], { passphrase: '' });
    await home.gpg(['-u', gpgFingerprint, '--detach-sign', '--armor', '-o', home.file('gpg.asc'), plainPath], { passphrase: '' });
    await home.gpg(['-u', gpgFingerprint, '--sign', '-o', home.file('gpg-signed.gpg'), plainPath], { passphrase: '' });
    const detached = await verify({ public_key: gpgCert }, [
      { data: plain, signature: await readFile(home.file('gpg.sig')) },
      { data: plain, signature: await readFile(home.file('gpg.asc')) },
    ]);
    expect(detached.signatures.map((v) => [v.valid, v.signer_fingerprint])).toEqual([
      [true, gpgFingerprint],
      [true, gpgFingerprint],
    ]);
    const inline = await verify({ public_key: gpgCert }, [{ data: await readFile(home.file('gpg-signed.gpg')) }]);
    expect(inline.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: gpgFingerprint });
    // Verified against a key that did not sign: unknown signer.
    const unknown = await verify({ fingerprint: key.fingerprint }, [{ data: plain, signature: await readFile(home.file('gpg.sig')) }]);
    expect(unknown.signatures[0]).toMatchObject({ valid: false, reason: 'unknown_signer', signer_fingerprint: null });
  }, 60_000);

  it('sq detached signatures, with the imported sq public key', async () => {
    const keyPath = home.file('sq-signer.pgp');
    await home.sq(['key', 'generate', '--userid', 'Sq Signer <sq-signer@example.test>', '--export', keyPath]);
    const cert = (await home.sq(['key', 'extract-cert', keyPath])).stdout.toString();
    await home.sq(['sign', '--detached', '--signer-key', keyPath, '-o', home.file('sq.sig'), plainPath]);
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'sq-signer', key: cert } });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const result = await verify({ fingerprint: imported.body.fingerprint }, [{ data: plain, signature: await readFile(home.file('sq.sig')) }]);
    expect(result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: imported.body.fingerprint });
  }, 60_000);

  it('refuses malformed signatures before the upload (422), and a missing signature fails the job', async () => {
    const res = await s.api('POST', '/keys/verify', {
      token: u.token,
      form: { fingerprint: key.fingerprint, signatures: [{ name: 'x.sig', data: Buffer.from('garbage') }], files: [{ name: 'f', data: plain }] },
    });
    expect([res.status, res.body.code]).toEqual([422, 'malformed_signature']);
    const { output: sig } = await sign({});
    const job = await runJob(s.api, u.token, '/keys/verify', {
      fingerprint: key.fingerprint,
      signatures: [{ name: '0.sig', data: sig }],
      files: [
        { name: 'a', data: plain },
        { name: 'b', data: plain },
      ],
    });
    expect([job.state, job.error?.code]).toEqual(['failed', 'signature_missing']);
  });

  it('refuses a signature packet with a huge subpacket area unread (422)', async () => {
    // A v4 signature (tag 2, new format, five-octet length) whose hashed area is one 60,000-octet notation.
    const notation = Buffer.concat([Buffer.from([0xff]), u32(60_001), Buffer.from([20]), Buffer.alloc(60_000, 0x41)]);
    const body = Buffer.concat([
      Buffer.from([4, 0x00, 22, 8]),
      u16(notation.length),
      notation,
      u16(0),
      Buffer.from([0, 0]),
      Buffer.from([0, 8, 0xff, 0, 8, 0xff]),
    ]);
    const packet = Buffer.concat([Buffer.from([0xc2, 0xff]), u32(body.length), body]);
    const res = await s.api('POST', '/keys/verify', {
      token: u.token,
      form: { fingerprint: key.fingerprint, signatures: [{ name: 'huge.sig', data: packet }], files: [{ name: 'f', data: plain }] },
    });
    expect([res.status, res.body.code]).toEqual([422, 'malformed_signature']);
    expect(res.body.detail).toContain('longer than');
  });
});

const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff]);
const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

describe('who may sign', () => {
  it('a wrong passphrase spends a point of the same per-key budget as decrypt, before the check', async () => {
    const k = await createKey(s.api, u.token, { label: 'guessed' });
    const attempt = (path: '/keys/sign' | '/keys/decrypt', passphrase: string) =>
      s.api('POST', path, { token: u.token, form: { fingerprint: k.fingerprint, passphrase, files: [{ name: 'f', data: Buffer.from('x') }] } });
    for (let i = 0; i < 10; i++) expect((await attempt(i % 2 ? '/keys/sign' : '/keys/decrypt', `wrong guess ${i}`)).body.code).toBe('wrong_passphrase');
    // The budget is spent: even the right passphrase is not checked.
    const limited = await attempt('/keys/sign', PASSPHRASE);
    expect([limited.status, limited.body.code]).toEqual([429, 'rate_limited']);
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.sign', status: 'failure' }).select('details');
    expect(audit.map((a) => a.details.reason)).toEqual(expect.arrayContaining(['wrong_passphrase', 'rate_limited']));
    expect(JSON.stringify(audit)).not.toContain('wrong guess');
  });

  it("another account's key is not found (404)", async () => {
    const other = await registerUser(s.api);
    const res = await s.api('POST', '/keys/sign', {
      token: other.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f', data: plain }] },
    });
    expect([res.status, res.body.code]).toEqual([404, 'key_not_found']);
  });

  it('signing is audited and announced, never with the passphrase', async () => {
    const { job } = await sign({});
    const row = await s.c
      .db('audit_logs')
      .where({ user_id: u.id, action: 'keys.sign', status: 'success' })
      .whereRaw("details->>'job_id' = ?", [job.job_id])
      .first();
    expect(row?.target).toBe(key.fingerprint);
    expect(JSON.stringify(row)).not.toContain(PASSPHRASE);
    const events = await s.api('GET', '/events/history', { token: u.token });
    expect(JSON.stringify(events.body)).toContain('keys.signed');
  });
});

describe('sign and encrypt, decrypt and verify', () => {
  it('gpg -d and sq decrypt read our sign-and-encrypt with a good signature by our key', async () => {
    const gpgKey = await home
      .gpg(['--quick-generate-key', 'Receiver <receiver@example.test>', 'future-default', 'default', 'never'], { passphrase: '' })
      .then(() => home.gpg(['--export', '--armor', 'receiver@example.test']));
    const job = await runJob(s.api, u.token, '/keys/encrypt', {
      public_key: gpgKey.stdout.toString(),
      sign_with: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'se.bin', data: plain }],
    });
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    expect(job.result.signed_by).toBe(key.fingerprint);
    const encrypted = await home.put('se.gpg', await download(s.api, u.token, job.job_id));
    const out = home.file('se-out.bin');
    const gpg = await home.gpg(['--status-fd', '2', '-o', out, '--decrypt', encrypted], { passphrase: '' });
    expect(gpg.stderr).toContain(`VALIDSIG ${key.fingerprint.toUpperCase()}`);
    expect(Buffer.compare(await readFile(out), plain)).toBe(0);

    // sq decrypt with --signer-cert fails unless one good signature by that certificate is in the message.
    const sqKey = home.file('sq-receiver.pgp');
    await home.sq(['key', 'generate', '--userid', 'Sq Receiver <sq-receiver@example.test>', '--export', sqKey]);
    const sqCert = (await home.sq(['key', 'extract-cert', sqKey])).stdout.toString();
    const toSq = await runJob(s.api, u.token, '/keys/encrypt', {
      public_key: sqCert,
      sign_with: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'se-sq.bin', data: plain }],
    });
    expect(toSq.state, JSON.stringify(toSq.error)).toBe('completed');
    const sqOut = home.file('se-sq-out.bin');
    await home.sq([
      'decrypt',
      '--recipient-key',
      sqKey,
      '--signer-cert',
      certPath,
      '-o',
      sqOut,
      await home.put('se-sq.pgp', await download(s.api, u.token, toSq.job_id)),
    ]);
    expect(Buffer.compare(await readFile(sqOut), plain)).toBe(0);
    const otherCert = await home.put('other.cert', sqCert);
    const unverified = await home.sq(['decrypt', '--recipient-key', sqKey, '--signer-cert', otherCert, '-o', home.file('nope.bin'), home.file('se-sq.pgp')], {
      allowFailure: true,
    });
    expect(unverified.code).not.toBe(0);
  }, 60_000);

  it('decrypts and verifies gpg -se and sq encrypt --signer-key output; require_signature fails unsigned files', async () => {
    await home.gpg(['--quick-generate-key', 'Sender <sender@example.test>', 'future-default', 'default', 'never'], { passphrase: '' });
    const senderCert = (await home.gpg(['--export', '--armor', 'sender@example.test'])).stdout.toString();
    const senderFpr = /^fpr:+([0-9A-F]{40}):/m
      .exec((await home.gpg(['--with-colons', '--list-keys', 'sender@example.test'])).stdout.toString())![1]
      .toLowerCase();
    await home.gpg(['-u', senderFpr, '-r', key.fingerprint, '-se', '-o', home.file('gpg-se.gpg'), plainPath], { passphrase: '' });
    await home.gpg(['-r', key.fingerprint, '-e', '-o', home.file('gpg-e.gpg'), plainPath]);
    const decrypt = (data: Buffer, extra: Record<string, string>) =>
      runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        verify_public_key: senderCert,
        ...extra,
        files: [{ name: 'in.gpg', data }],
      });
    const signed = await decrypt(await readFile(home.file('gpg-se.gpg')), { require_signature: 'true' });
    expect(signed.state, JSON.stringify(signed.error)).toBe('completed');
    expect(signed.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: senderFpr });
    expect(Buffer.compare(await download(s.api, u.token, signed.job_id), plain)).toBe(0);

    const unsigned = await decrypt(await readFile(home.file('gpg-e.gpg')), {});
    expect(unsigned.result.signatures[0]).toMatchObject({ valid: false, reason: 'unsigned' });
    const required = await decrypt(await readFile(home.file('gpg-e.gpg')), { require_signature: 'true' });
    expect([required.state, required.error?.code]).toEqual(['failed', 'signature_required']);

    // Signed by someone else than the expected signer: the plaintext is not published.
    const keyPath = home.file('sq-sender.pgp');
    await home.sq(['key', 'generate', '--userid', 'Sq Sender <sq-sender@example.test>', '--export', keyPath]);
    await home.sq(['encrypt', '--recipient-cert', certPath, '--signer-key', keyPath, '-o', home.file('sq-se.pgp'), plainPath]);
    const wrongSigner = await decrypt(await readFile(home.file('sq-se.pgp')), { require_signature: 'true' });
    expect([wrongSigner.state, wrongSigner.error?.code]).toEqual(['failed', 'signature_invalid']);
    const sqCert = (await home.sq(['key', 'extract-cert', keyPath])).stdout.toString();
    const sq = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      verify_public_key: sqCert,
      require_signature: 'true',
      files: [{ name: 'sq.pgp', data: await readFile(home.file('sq-se.pgp')) }],
    });
    expect(sq.state, JSON.stringify(sq.error)).toBe('completed');
    expect(sq.result.signatures[0].valid).toBe(true);
  }, 60_000);

  it('at 64 MiB: gpg reads our sign-and-encrypt, gpg and sq verify our detached signature; we decrypt and verify gpg -se and sq encrypt --signer-key', async () => {
    const big = plaintextForGpg(64 << 20);
    const bigPath = await home.put('big.bin', big);
    await home.gpg(['--quick-generate-key', 'Big Peer <big-peer@example.test>', 'future-default', 'default', 'never'], { passphrase: '' });
    const peerCert = (await home.gpg(['--export', '--armor', 'big-peer@example.test'])).stdout.toString();
    const peerFpr = /^fpr:+([0-9A-F]{40}):/m
      .exec((await home.gpg(['--with-colons', '--list-keys', 'big-peer@example.test'])).stdout.toString())![1]
      .toLowerCase();

    const ours = await runJob(s.api, u.token, '/keys/encrypt', {
      public_key: peerCert,
      sign_with: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'big.bin', data: big }],
    });
    expect(ours.state, JSON.stringify(ours.error)).toBe('completed');
    const out = home.file('big-out.bin');
    const read = await home.gpg(['--status-fd', '2', '-o', out, '--decrypt', await home.put('big.gpg', await download(s.api, u.token, ours.job_id))], {
      passphrase: '',
    });
    expect(read.stderr).toContain(`VALIDSIG ${key.fingerprint.toUpperCase()}`);
    expect(Buffer.compare(await readFile(out), big)).toBe(0);

    const { output } = await sign({ armor: 'false' }, big, 'big.bin');
    const bigSig = await home.put('big.bin.sig', output);
    const checked = await home.gpg(['--status-fd', '2', '--verify', bigSig, bigPath]);
    expect(checked.stderr).toContain(`VALIDSIG ${key.fingerprint.toUpperCase()}`);
    expect((await home.sq(['verify', '--signer-cert', certPath, '--detached', bigSig, bigPath])).code).toBe(0);

    // Sequoia signs and encrypts to us; we decrypt and verify.
    const sqKey = home.file('big-sq.pgp');
    await home.sq(['key', 'generate', '--userid', 'Big Sq <big-sq@example.test>', '--export', sqKey]);
    await home.sq(['encrypt', '--recipient-cert', certPath, '--signer-key', sqKey, '-o', home.file('big-sq.pgp.enc'), bigPath]);
    const fromSq = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      verify_public_key: (await home.sq(['key', 'extract-cert', sqKey])).stdout.toString(),
      require_signature: 'true',
      files: [{ name: 'big-sq.pgp', data: await readFile(home.file('big-sq.pgp.enc')) }],
    });
    expect(fromSq.state, JSON.stringify(fromSq.error)).toBe('completed');
    expect(fromSq.result.signatures[0].valid).toBe(true);

    await home.gpg(['-u', peerFpr, '-r', key.fingerprint, '-se', '-o', home.file('big-se.gpg'), bigPath], { passphrase: '' });
    const theirs = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      verify_public_key: peerCert,
      require_signature: 'true',
      files: [{ name: 'big-se.gpg', data: await readFile(home.file('big-se.gpg')) }],
    });
    expect(theirs.state, JSON.stringify(theirs.error)).toBe('completed');
    expect(theirs.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: peerFpr });
    expect(Buffer.compare(await download(s.api, u.token, theirs.job_id), big)).toBe(0);
  }, 180_000);
});
