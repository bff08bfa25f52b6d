import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { createPgpHome, type PgpHome } from '../support/gpg';

/**
 * Rewrap and re-encrypt through the service, against messages made by gpg, sq and the
 * service itself: the data packet is copied byte for byte (rewrap) or made anew (reencrypt), the
 * result decrypts with the current generation and still does after older generations are retired,
 * and a damaged message publishes nothing.
 */
let s: TestService;
let home: PgpHome;
let u: Awaited<ReturnType<typeof registerUser>>;

beforeAll(async () => {
  s = await startTestService();
  home = await createPgpHome();
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
  await home?.cleanup();
});

/** Splits a binary message into its packets (new or legacy format; partial lengths followed). */
function packets(msg: Buffer): { tag: number; raw: Buffer }[] {
  const out: { tag: number; raw: Buffer }[] = [];
  let i = 0;
  while (i < msg.length) {
    const start = i;
    const c = msg[i++];
    const tag = c & 0x40 ? c & 0x3f : (c >> 2) & 0x0f;
    if (!(c & 0x40)) {
      const type = c & 3;
      const n = type === 3 ? msg.length - i : msg.readUIntBE(i, 1 << type);
      i += type === 3 ? 0 : 1 << type;
      i += n;
    } else {
      for (;;) {
        const f = msg[i++];
        if (f < 192) {
          i += f;
          break;
        }
        if (f < 224) {
          i += ((f - 192) << 8) + msg[i] + 192 + 1;
          break;
        }
        if (f === 255) {
          i += 4 + msg.readUInt32BE(i);
          break;
        }
        i += 2 ** (f & 0x1f);
      }
    }
    out.push({ tag, raw: msg.subarray(start, i) });
  }
  return out;
}
const dataPacket = (msg: Buffer) => packets(msg).find((p) => p.tag === 18)!.raw;

async function dearmored(armored: Buffer): Promise<Buffer> {
  const path = home.file(`arm-${randomBytes(4).toString('hex')}.asc`);
  await writeFile(path, armored);
  return (await home.gpg(['--dearmor', '-o', '-', path])).stdout;
}

async function submit(path: string, form: Record<string, unknown>) {
  const res = await s.api('POST', path, { token: u.token, form: form as never, headers: { prefer: 'wait=60' } });
  expect([200, 202], JSON.stringify(res.body)).toContain(res.status);
  return waitJob(s.api, u.token, res.body.job_id);
}

async function rotate(fingerprint: string) {
  const res = await s.api('POST', `/keys/${fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.result.new_fingerprint as string;
}

async function decryptInService(fingerprint: string, name: string, data: Buffer | Blob) {
  return submit('/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name, data }] });
}

describe('a 64 MiB file encrypted by gpg to generation 1, after two rotations', () => {
  let fpr1: string;
  let fpr3: string;
  let plainPath: string;
  let encrypted: Buffer;

  beforeAll(async () => {
    const key = await createKey(s.api, u.token, { label: 'big' });
    fpr1 = key.fingerprint;
    const cert = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: fpr1 }, headers: { accept: 'application/pgp-keys' } });
    await home.gpg(['--import', await home.put('gen1.asc', cert.body as string)]);
    plainPath = await home.put('big.bin', randomBytes(64 << 20));
    await home.gpg(['--encrypt', '--compress-algo', 'none', '-r', fpr1, '-o', home.file('big.bin.gpg'), plainPath]);
    encrypted = await readFile(home.file('big.bin.gpg'));
    await rotate(fpr1);
    fpr3 = await rotate(fpr1);
  }, 120_000);

  for (const mode of ['rewrap', 'reencrypt'] as const) {
    it(`${mode}: addressed to generation 3, decrypts with it, and still after generation 1 is retired`, async () => {
      const job = await submit('/keys/rewrap', {
        fingerprint: fpr1,
        passphrase: PASSPHRASE,
        mode,
        files: [{ name: 'big.bin.gpg', data: new Blob([encrypted]) }],
      });
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      expect(job.kind).toBe('rewrap');
      expect(job.result.rewrapped).toEqual([
        expect.objectContaining({ n: 0, input_name: 'big.bin.gpg', from_generation: 1, from_fingerprint: fpr1, to_generation: 3, to_fingerprint: fpr3 }),
      ]);
      expect(job.result.files[0].name).toBe('big.bin.gpg');
      const out = await download(s.api, u.token, job.job_id);
      const same = Buffer.compare(dataPacket(out), dataPacket(encrypted)) === 0;
      expect(same).toBe(mode === 'rewrap'); // rewrap copies the data packet; reencrypt makes a new one
      // One session-key packet, and no longer the original one (addressed to generation 1).
      const pkesks = packets(out).filter((p) => p.tag === 1);
      expect(pkesks.length).toBe(1);
      expect(pkesks[0].raw.equals(packets(encrypted).find((p) => p.tag === 1)!.raw)).toBe(false);

      // Retire generations 1 and 2: the rewrapped file still decrypts (it needs generation 3 only).
      const retire = await s.api('PATCH', `/keys/${fpr1}/settings`, { token: u.token, body: { min_decryption_generation: 3 } });
      expect(retire.status, JSON.stringify(retire.body)).toBe(200);
      const dec = await decryptInService(fpr1, 'big.bin.gpg', new Blob([out]));
      expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
      const plain = await download(s.api, u.token, dec.job_id);
      expect(Buffer.compare(plain, await readFile(plainPath))).toBe(0);
      // The original, addressed to generation 1, is refused now (409 generation_retired naming it).
      const old = await decryptInService(fpr1, 'orig.gpg', new Blob([encrypted]));
      expect(old.state).toBe('failed');
      expect(old.error.code).toBe('generation_retired');
      expect(old.error.message).toContain(fpr1);
      const back = await s.api('PATCH', `/keys/${fpr1}/settings`, { token: u.token, body: { min_decryption_generation: 1 } });
      expect(back.status).toBe(200);
    }, 180_000);
  }
});

describe('messages from sq, gpg (armored) and the service itself', () => {
  let fpr1: string;
  let fpr2: string;
  let certPath: string;
  const plain = randomBytes((1 << 20) + 12345);

  beforeAll(async () => {
    const key = await createKey(s.api, u.token, { label: 'small' });
    fpr1 = key.fingerprint;
    const cert = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: fpr1 }, headers: { accept: 'application/pgp-keys' } });
    certPath = await home.put('small.asc', cert.body as string);
    await home.gpg(['--import', certPath]);
    await home.put('small.bin', plain);
  }, 60_000);

  async function made(): Promise<Record<string, Buffer>> {
    const p = home.file('small.bin');
    await home.sq(['encrypt', '--binary', '--recipient-cert', certPath, '-o', home.file('sq.gpg'), p]);
    await home.sq(['encrypt', '--recipient-cert', certPath, '-o', home.file('sq.asc'), p]);
    await home.gpg(['--encrypt', '--armor', '-r', fpr1, '-o', home.file('gpg.asc'), p]);
    const enc = await submit('/keys/encrypt', { fingerprint: fpr1, files: [{ name: 'svc.bin', data: new Blob([plain]) }] });
    return {
      'sq.gpg': await readFile(home.file('sq.gpg')),
      'sq.asc': await readFile(home.file('sq.asc')),
      'gpg.asc': await readFile(home.file('gpg.asc')),
      'svc.bin.gpg': await download(s.api, u.token, enc.job_id),
    };
  }

  it('rewraps and re-encrypts each (binary stays binary, armored stays armored), and the service decrypts the results', async () => {
    const inputs = await made();
    fpr2 = await rotate(fpr1);
    for (const mode of ['rewrap', 'reencrypt'] as const) {
      const names = Object.keys(inputs);
      const job = await submit('/keys/rewrap', {
        fingerprint: fpr2,
        passphrase: PASSPHRASE,
        mode,
        files: names.map((name) => ({ name, data: new Blob([inputs[name]]) })),
      });
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      expect(job.result.files.map((f: { name: string }) => f.name)).toEqual(['sq.gpg', 'sq.asc', 'gpg.asc', 'svc.bin.gpg']);
      expect(job.result.rewrapped.every((r: { from_generation: number; to_generation: number }) => r.from_generation === 1 && r.to_generation === 2)).toBe(
        true,
      );
      for (const [i, name] of names.entries()) {
        const out = await download(s.api, u.token, job.job_id, i);
        const armored = name.endsWith('.asc');
        expect(out.subarray(0, 27).toString()).toBe(armored ? '-----BEGIN PGP MESSAGE-----' : out.subarray(0, 27).toString());
        if (!armored) expect(out[0] & 0x80).toBe(0x80);
        if (mode === 'rewrap') {
          const before = armored ? await dearmored(inputs[name]) : inputs[name];
          const after = armored ? await dearmored(out) : out;
          expect(Buffer.compare(dataPacket(after), dataPacket(before)), name).toBe(0);
        }
        const dec = await decryptInService(fpr2, name, new Blob([out]));
        expect(dec.state, `${mode} ${name}: ${JSON.stringify(dec.error)}`).toBe('completed');
        expect(Buffer.compare(await download(s.api, u.token, dec.job_id), plain), name).toBe(0);
      }
    }
  }, 120_000);

  it('a tampered file fails rewrap and reencrypt, and nothing is published', async () => {
    const enc = await submit('/keys/encrypt', { fingerprint: fpr1, files: [{ name: 't.bin', data: new Blob([plain]) }] });
    const good = await download(s.api, u.token, enc.job_id);
    for (const at of [good.length - 5, Math.floor(good.length / 2)]) {
      const bad = Buffer.from(good);
      bad[at] ^= 0x01;
      for (const mode of ['rewrap', 'reencrypt'] as const) {
        const job = await submit('/keys/rewrap', {
          fingerprint: fpr1,
          passphrase: PASSPHRASE,
          mode,
          files: [
            { name: 'ok.gpg', data: new Blob([good]) },
            { name: 'bad.gpg', data: new Blob([bad]) },
          ],
        });
        expect(job.state, mode).toBe('failed');
        expect(job.error.code, mode).toBe('integrity_check_failed');
        const files = await s.c.db('job_files').where({ job_id: job.job_id, role: 'output' });
        expect(files).toEqual([]);
        expect((await s.api('GET', `/jobs/${job.job_id}/files/0`, { token: u.token })).status).not.toBe(200);
        expect(await s.c.blob.stat(`jobs/${job.job_id}/out/0`)).toBeNull();
        expect(await s.c.blob.stat(`jobs/${job.job_id}/out/1`)).toBeNull();
      }
    }
  }, 60_000);

  it('refuses what is not a message, a wrong passphrase before the upload, and another account’s key', async () => {
    const junk = await submit('/keys/rewrap', {
      fingerprint: fpr1,
      passphrase: PASSPHRASE,
      files: [{ name: 'x.gpg', data: new Blob([Buffer.from('hello')]) }],
    });
    expect(junk.state).toBe('failed');
    expect(junk.error.code).toBe('malformed_message');
    const wrong = await s.api('POST', '/keys/rewrap', {
      token: u.token,
      form: { fingerprint: fpr1, passphrase: 'not the passphrase', files: [{ name: 'x.gpg', data: Buffer.from('x') }] },
    });
    expect(wrong.status).toBe(422);
    expect(wrong.body.code).toBe('wrong_passphrase');
    const other = await registerUser(s.api);
    const foreign = await s.api('POST', '/keys/rewrap', {
      token: other.token,
      form: { fingerprint: fpr1, passphrase: PASSPHRASE, files: [{ name: 'x.gpg', data: Buffer.from('x') }] },
    });
    expect(foreign.status).toBe(404);
  });
});
