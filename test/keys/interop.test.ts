import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFile } from 'node:fs/promises';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { createPgpHome, plaintextForGpg, type PgpHome } from '../support/gpg';

/** The service against the real OpenPGP peers from Debian: GnuPG 2.2 and Sequoia. */
let s: TestService;
let home: PgpHome;
let u: Awaited<ReturnType<typeof registerUser>>;
const plain = plaintextForGpg(3 << 20);

beforeAll(async () => {
  s = await startTestService();
  home = await createPgpHome();
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
  await home?.cleanup();
});

async function publicKeyOf(fingerprint: string): Promise<string> {
  const res = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint }, headers: { accept: 'application/pgp-keys' } });
  expect(res.status).toBe(200);
  return res.body as string;
}

async function decryptInService(fingerprint: string, name: string, data: Buffer): Promise<Buffer> {
  const job = await runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name, data }] });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return download(s.api, u.token, job.job_id);
}

describe.each(['curve25519', 'rsa3072'] as const)('service %s keys with gpg and sq', (algorithm) => {
  let fingerprint: string;
  let certPath: string;

  beforeAll(async () => {
    const res = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      form: { label: algorithm, name: 'Service Key', email: `svc-${algorithm}@example.test`, passphrase: PASSPHRASE, algorithm },
      headers: { prefer: 'wait=30' },
    });
    fingerprint = res.status === 201 ? res.body.fingerprint : res.body.result.key.fingerprint;
    certPath = await home.put(`${algorithm}.asc`, await publicKeyOf(fingerprint));
  }, 60_000);

  it('exports a public key that gpg and sq import', async () => {
    await home.gpg(['--import', certPath]);
    const listing = (await home.gpg(['--with-colons', '--list-keys', fingerprint])).stdout.toString();
    expect(listing.toLowerCase()).toContain(fingerprint);
    const inspect = (await home.sq(['inspect', certPath])).stdout.toString();
    expect(inspect.toLowerCase().replace(/\s/g, '')).toContain(fingerprint);
  });

  it('decrypts what gpg encrypts to it (compressed by default, and uncompressed)', async () => {
    const plainPath = await home.put(`plain-${algorithm}.bin`, plain);
    for (const extra of [[], ['--compress-algo', 'none']]) {
      const out = home.file(`gpg-${algorithm}-${extra.length}.gpg`);
      await home.gpg(['--encrypt', ...extra, '-r', fingerprint, '-o', out, plainPath]);
      expect(Buffer.compare(await decryptInService(fingerprint, 'from-gpg.gpg', await readFile(out)), plain)).toBe(0);
    }
  });

  it('decrypts what sq encrypts to it, binary and armored', async () => {
    const plainPath = await home.put(`plain-sq-${algorithm}.bin`, plain);
    for (const extra of [['--binary'], []]) {
      const out = home.file(`sq-${algorithm}-${extra.length}.pgp`);
      await home.sq(['encrypt', ...extra, '--recipient-cert', certPath, '-o', out, plainPath]);
      expect(Buffer.compare(await decryptInService(fingerprint, 'from-sq.pgp', await readFile(out)), plain)).toBe(0);
    }
  });
});

describe('keys made by the peers, supplied to the service', () => {
  it('encrypts to a gpg-made public key, and gpg decrypts it', async () => {
    await home.gpg(['--quick-generate-key', 'Peer <peer@example.test>', 'future-default', 'default', 'never'], { passphrase: '' });
    const cert = (await home.gpg(['--export', '--armor', 'peer@example.test'])).stdout.toString();
    for (const armor of ['false', 'true']) {
      const job = await runJob(s.api, u.token, '/keys/encrypt', { public_key: cert, armor, files: [{ name: 'for-gpg.bin', data: plain }] });
      expect(job.state).toBe('completed');
      const encrypted = await home.put(`for-gpg-${armor}`, await download(s.api, u.token, job.job_id));
      const out = home.file(`from-service-${armor}.bin`);
      await home.gpg(['--decrypt', '-o', out, encrypted], { passphrase: '' });
      expect(Buffer.compare(await readFile(out), plain)).toBe(0);
    }
  });

  it('encrypts to an sq-made certificate, and sq decrypts it', async () => {
    const keyPath = home.file('sq-key.pgp');
    await home.sq(['key', 'generate', '--userid', 'Sq Peer <sq@example.test>', '--export', keyPath]);
    const cert = (await home.sq(['key', 'extract-cert', keyPath])).stdout.toString();
    const job = await runJob(s.api, u.token, '/keys/encrypt', { public_key: cert, files: [{ name: 'for-sq.bin', data: plain }] });
    expect(job.state).toBe('completed');
    const encrypted = await home.put('for-sq.pgp', await download(s.api, u.token, job.job_id));
    const out = home.file('from-service-sq.bin');
    await home.sq(['decrypt', '--recipient-key', keyPath, '-o', out, encrypted]);
    expect(Buffer.compare(await readFile(out), plain)).toBe(0);
  });

  it('round-trips in the service a file it encrypted to its own key', async () => {
    const key = await createKey(s.api, u.token, { label: 'own' });
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'own.bin', data: plain }]);
    expect(Buffer.compare(await decryptInService(key.fingerprint, 'own.bin.gpg', await download(s.api, u.token, enc.job_id)), plain)).toBe(0);
  });
});

describe('rotation with gpg as the peer', () => {
  it('gpg encrypts to the exported new key after rotation, and the service still decrypts what gpg encrypted to the old one', async () => {
    const key = await createKey(s.api, u.token, { label: 'rotated-for-gpg', email: 'rotated@example.test' });
    const oldCert = await home.put('old-gen.asc', await publicKeyOf(key.fingerprint));
    await home.gpg(['--import', oldCert]);
    const plainPath = await home.put('rot-plain.bin', plain);
    const toOld = home.file('to-old.gpg');
    await home.gpg(['--encrypt', '-r', key.fingerprint, '-o', toOld, plainPath]);

    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.body.state).toBe('completed');
    const newFingerprint = rotated.body.result.new_fingerprint as string;
    const newCert = await home.put('new-gen.asc', await publicKeyOf(key.fingerprint));
    await home.gpg(['--import', newCert]);
    const toNew = home.file('to-new.gpg');
    await home.gpg(['--encrypt', '-r', newFingerprint, '-o', toNew, plainPath]);

    for (const file of [toOld, toNew]) {
      for (const fingerprint of [key.fingerprint, newFingerprint]) {
        expect(Buffer.compare(await decryptInService(fingerprint, 'x.gpg', await readFile(file)), plain)).toBe(0);
      }
    }
  });
});
