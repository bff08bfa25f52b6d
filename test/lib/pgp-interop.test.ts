import { createReadStream, createWriteStream } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import * as openpgp from 'openpgp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKey, readStoredPublicKey, unlockPrivateKey, type GeneratedKey } from '../../lib/pgp/keys';
import { readRecipientKey } from '../../lib/pgp/import';
import { CHUNK_BYTES } from '../../lib/pgp/packets';
import { openForRewrap } from '../../lib/pgp/rewrap';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { createPgpHome, plaintextForGpg, type PgpHome } from '../support/gpg';

/**
 * Real GnuPG 2.2 and Sequoia (sq 0.27) both ways: what we generate and encrypt, they read; what they
 * encrypt (with and without compression), we read. Private homes, a 4 MiB random file.
 */
const SECRET = 'interop-generation-secret';
const FILENAME = 'report-2025.bin';

let home: PgpHome;
let plainPath: string;
let plain: Buffer;
interface OurKey {
  gen: GeneratedKey;
  priv: openpgp.PrivateKey;
  publicPath: string;
  /** sq 0.27 has no batch passphrase option: it gets an unprotected copy. */
  unprotectedPath: string;
}
const keys = {} as Record<'curve25519' | 'rsa3072', OurKey>;

async function encryptFile(gen: GeneratedKey, out: string, opts: { armor: boolean; compress?: boolean }): Promise<string> {
  const encrypted = await encryptStream(createReadStream(plainPath, { highWaterMark: CHUNK_BYTES }), await readStoredPublicKey(gen.publicArmored), {
    ...opts,
    filename: FILENAME,
  });
  await pipeline(encrypted, createWriteStream(home.file(out)));
  return home.file(out);
}

async function decryptFile(path: string, key: openpgp.PrivateKey): Promise<{ data: Buffer; filename: string; ids: string[] }> {
  const opened = await openEncrypted(createReadStream(path, { highWaterMark: CHUNK_BYTES }), { maxDecompressedBytes: 64 << 20 });
  const out = await opened.decrypt(key);
  const chunks: Buffer[] = [];
  for await (const c of out) chunks.push(c as Buffer);
  return { data: Buffer.concat(chunks), filename: out.filename, ids: opened.encryptionKeyIds };
}

beforeAll(async () => {
  home = await createPgpHome();
  plain = plaintextForGpg(4 << 20);
  plainPath = await home.put('plain.bin', plain);
  for (const algorithm of ['curve25519', 'rsa3072'] as const) {
    const gen = await generateKey({ name: `Ours ${algorithm}`, email: `${algorithm}@kms.example`, algorithm, secret: SECRET });
    const priv = await unlockPrivateKey(gen.privateArmored, SECRET);
    const publicPath = await home.put(`${algorithm}.pub.asc`, gen.publicArmored);
    const unprotectedPath = await home.put(`${algorithm}-unprotected.asc`, priv.armor());
    keys[algorithm] = { gen, priv, publicPath, unprotectedPath };
    await home.gpg(['--import', publicPath]);
    await home.gpg(['--import', await home.put(`${algorithm}.priv.asc`, gen.privateArmored)], { passphrase: SECRET });
  }
}, 60_000);

afterAll(async () => {
  await home?.cleanup();
});

describe.each(['curve25519', 'rsa3072'] as const)('our %s key', (algorithm) => {
  it('imports into gpg (done in beforeAll) and sq as a usable encryption key', async () => {
    const { gen, publicPath } = keys[algorithm];
    const listing = (await home.gpg(['--with-colons', '--list-keys', gen.fingerprint])).stdout.toString();
    expect(listing).toContain(`fpr:::::::::${gen.fingerprint.toUpperCase()}:`);
    const sub = listing.split('\n').find((l) => l.startsWith('sub:'));
    expect(sub?.split(':')[11]).toContain('e'); // capabilities of the subkey: encrypt
    expect(sub?.split(':')[4]?.toLowerCase()).toBe(gen.encryptionKeyIds[0]);

    // gpg checks both self-signatures (the user id's certification, the subkey's binding).
    const sigs = await home.gpg(['--check-sigs', gen.fingerprint]);
    expect(sigs.stdout.toString().match(/^sig!/gm)).toHaveLength(2);
    expect(sigs.stderr).toContain('2 good signatures');

    const inspect = (await home.sq(['inspect', publicPath])).stdout.toString();
    expect(inspect).toContain('OpenPGP Certificate');
    expect(inspect).not.toMatch(/Bad Signature|Invalid/i);
    expect(inspect).toContain(gen.fingerprint.toUpperCase());
    expect(inspect).toMatch(/Key flags: transport encryption, data-at-rest encryption/);
  });

  it('encrypts files that gpg and sq decrypt (binary, armored, compressed), name kept', async () => {
    const { gen, unprotectedPath } = keys[algorithm];
    for (const opts of [{ armor: false }, { armor: true }, { armor: false, compress: true }]) {
      const tag = `${algorithm}-${opts.armor ? 'asc' : 'bin'}${opts.compress ? '-z' : ''}`;
      const encrypted = await encryptFile(gen, `${tag}.pgp`, opts);

      const gpgOut = home.file(`${tag}.gpg-out`);
      const gpg = await home.gpg(['--status-fd', '2', '--decrypt', '-o', gpgOut, encrypted], { passphrase: SECRET });
      expect(gpg.stderr).toContain('[GNUPG:] DECRYPTION_OKAY');
      expect(gpg.stderr).toContain('[GNUPG:] GOODMDC');
      expect(gpg.stderr).toMatch(new RegExp(`\\[GNUPG:\\] PLAINTEXT 62 \\d+ ${FILENAME}`));
      expect((await readFile(gpgOut)).equals(plain), `gpg ${tag}`).toBe(true);

      const sqOut = home.file(`${tag}.sq-out`);
      await home.sq(['decrypt', '--recipient-key', unprotectedPath, '-o', sqOut, encrypted]);
      expect((await readFile(sqOut)).equals(plain), `sq ${tag}`).toBe(true);
    }
  });

  it('decrypts what gpg encrypts to it, with every compression gpg offers', async () => {
    const { gen, priv } = keys[algorithm];
    for (const extra of [[], ['--compress-algo', 'zlib'], ['--compress-algo', 'zip'], ['--compress-algo', 'bzip2'], ['--armor']]) {
      const out = home.file(`${algorithm}-from-gpg${extra.join('')}.pgp`);
      await home.gpg(['--encrypt', ...extra, '-r', gen.fingerprint, '-o', out, plainPath]);
      const result = await decryptFile(out, priv);
      expect(result.data.equals(plain), `gpg ${extra.join(' ')}`).toBe(true);
      expect(result.filename).toBe('plain.bin');
      expect(result.ids).toEqual(gen.encryptionKeyIds);
    }
  });

  it('decrypts what sq encrypts to it (padding, none, zlib, armored)', async () => {
    const { priv, publicPath } = keys[algorithm];
    for (const extra of [['--binary'], ['--binary', '--compression', 'none'], ['--binary', '--compression', 'zlib'], []]) {
      const out = home.file(`${algorithm}-from-sq${extra.join('')}.pgp`);
      await home.sq(['encrypt', ...extra, '--recipient-cert', publicPath, '-o', out, plainPath]);
      expect((await decryptFile(out, priv)).data.equals(plain), `sq ${extra.join(' ')}`).toBe(true);
    }
  });
});

describe('a key generated by gpg', () => {
  let peerPublic: string;
  let peerPrivate: openpgp.PrivateKey;
  beforeAll(async () => {
    await home.gpg(['--quick-generate-key', 'Peer <peer@example.com>', 'future-default', 'default', 'never'], { passphrase: '' });
    peerPublic = (await home.gpg(['--export', '--armor', 'peer@example.com'])).stdout.toString();
    const secret = (await home.gpg(['--export-secret-keys', '--armor', 'peer@example.com'], { passphrase: '' })).stdout.toString();
    peerPrivate = await openpgp.readPrivateKey({ armoredKey: secret });
  }, 30_000);

  it('passes readRecipientKey, and gpg decrypts what we encrypt to it', async () => {
    const recipient = await readRecipientKey(peerPublic);
    expect(recipient.encryptionKeyIds).toHaveLength(1);
    for (const armor of [false, true]) {
      const out = home.file(`to-peer-${armor}.pgp`);
      await pipeline(await encryptStream(createReadStream(plainPath), recipient.key, { armor, filename: FILENAME }), createWriteStream(out));
      const decrypted = home.file(`to-peer-${armor}.out`);
      const gpg = await home.gpg(['--status-fd', '2', '--decrypt', '-o', decrypted, out], { passphrase: '' });
      expect(gpg.stderr).toContain('[GNUPG:] GOODMDC');
      expect((await readFile(decrypted)).equals(plain)).toBe(true);
    }
  });

  it('its default, zlib-compressed, gpg output decrypts with openEncrypted', async () => {
    const out = home.file('gpg-default-to-peer.pgp');
    await home.gpg(['--encrypt', '-r', 'peer@example.com', '-o', out, plainPath]);
    // gpg's own prefs (ZLIB first) make it compress by default: check that this really is compressed.
    const whole = await (await openpgp.readMessage({ binaryMessage: new Uint8Array(await readFile(out)) })).decrypt([peerPrivate]);
    expect((whole.packets[0].constructor as { tag?: number }).tag).toBe(openpgp.enums.packet.compressedData);
    expect((await decryptFile(out, peerPrivate)).data.equals(plain)).toBe(true);
  });
});

describe('rewrap of a gpg message to two keys and a password', () => {
  it('addresses it to a third key and keeps the other key and the password: each opens it, gpg too', async () => {
    const [a, b] = [keys.curve25519, keys.rsa3072];
    const msg = home.file('two-and-password.gpg');
    await home.gpg(['--encrypt', '--symmetric', '-r', a.gen.fingerprint, '-r', b.gen.fingerprint, '-o', msg, plainPath], { passphrase: 'a shared password' });
    const c = await generateKey({ name: 'Third', email: 'third@kms.example', algorithm: 'curve25519', secret: SECRET });
    const cPriv = await unlockPrivateKey(c.privateArmored, SECRET);

    const opened = await openForRewrap(createReadStream(msg));
    expect(opened.encryptionKeyIds.sort()).toEqual([...a.gen.encryptionKeyIds, ...b.gen.encryptionKeyIds].sort());
    const out = home.file('rewrapped.gpg');
    await pipeline(await opened.rewrap(a.priv, a.gen.encryptionKeyIds, await readStoredPublicKey(c.publicArmored)), createWriteStream(out));

    for (const key of [b.priv, cPriv]) {
      const { data, ids } = await decryptFile(out, key);
      expect(data.equals(plain)).toBe(true);
      expect(ids.sort()).toEqual([...b.gen.encryptionKeyIds, ...c.encryptionKeyIds].sort());
    }
    const bytes = await readFile(out);
    const byPassword = await openpgp.decrypt({
      message: await openpgp.readMessage({ binaryMessage: bytes }),
      passwords: ['a shared password'],
      format: 'binary',
    });
    expect(Buffer.from(byPassword.data).equals(plain)).toBe(true);
    const decrypted = home.file('rewrapped.out');
    const gpg = await home.gpg(['--status-fd', '2', '--decrypt', '-o', decrypted, out], { passphrase: SECRET });
    expect(gpg.stderr).toContain('[GNUPG:] GOODMDC');
    expect((await readFile(decrypted)).equals(plain)).toBe(true);
  });
});
