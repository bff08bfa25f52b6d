import { execFile } from 'node:child_process';
import { diffieHellman, sign, verify } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { generateRawKeyPair, privateKeyFromRaw, publicKeyFromRaw, rawPublicKey } from '../../lib/curve25519';

const hex = (s: string) => Buffer.from(s, 'hex');
const ROOT = join(import.meta.dirname, '..', '..');

describe('Curve25519 raw keys', () => {
  it('match RFC 7748 §6.1 (X25519) and RFC 8032 §7.1 test 1 (Ed25519)', () => {
    const alice = privateKeyFromRaw('x25519', hex('77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a'));
    const bobPublic = hex('de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f');
    expect(rawPublicKey('x25519', alice).toString('hex')).toBe('8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a');
    expect(diffieHellman({ privateKey: alice, publicKey: publicKeyFromRaw('x25519', bobPublic) }).toString('hex')).toBe(
      '4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742',
    );

    const ed = privateKeyFromRaw('ed25519', hex('9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60'));
    const edPublic = hex('d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a');
    expect(rawPublicKey('ed25519', ed)).toEqual(edPublic);
    const signature = sign(null, Buffer.alloc(0), ed);
    expect(signature.toString('hex')).toBe(
      'e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b',
    );
    expect(verify(null, Buffer.alloc(0), publicKeyFromRaw('ed25519', edPublic), signature)).toBe(true);
  });

  it('make fresh pairs whose raw halves belong together (X25519 scalars clamped)', () => {
    const [a, b] = [generateRawKeyPair('x25519'), generateRawKeyPair('x25519')];
    expect(a.d).not.toEqual(b.d);
    for (const p of [a, b]) {
      expect([p.d.length, p.x.length]).toEqual([32, 32]);
      expect([p.d[0] & 7, p.d[31] & 0xc0]).toEqual([0, 0x40]);
      expect(rawPublicKey('x25519', p.privateKey)).toEqual(p.x);
    }
    expect(diffieHellman({ privateKey: a.privateKey, publicKey: publicKeyFromRaw('x25519', b.x) })).toEqual(
      diffieHellman({ privateKey: b.privateKey, publicKey: a.publicKey }),
    );

    const ed = generateRawKeyPair('ed25519');
    expect(rawPublicKey('ed25519', privateKeyFromRaw('ed25519', ed.d))).toEqual(ed.x);
    expect(verify(null, Buffer.from('m'), publicKeyFromRaw('ed25519', ed.x), sign(null, Buffer.from('m'), ed.privateKey))).toBe(true);
  });

  it('refuse keys of another length or curve', () => {
    expect(() => privateKeyFromRaw('x25519', Buffer.alloc(31, 1))).toThrow(/31 octets/);
    expect(() => publicKeyFromRaw('ed25519', Buffer.alloc(33, 1))).toThrow(/33 octets/);
    expect(() => rawPublicKey('x25519', generateRawKeyPair('ed25519').publicKey)).toThrow(/not an x25519 key/);
  });

  // Under a 1 MiB young generation a collection falls inside many of these calls. The keys
  // generateKeyPairSync made deadlocked this loop within 60k rounds in four runs out of four (lib/curve25519.ts).
  it('can be made and exported under constant garbage collection without the process ever blocking', async () => {
    const loop = `import { generateRawKeyPair, rawPublicKey } from './lib/curve25519.ts';
      for (let i = 0; i < 60000; i++) {
        const c = i % 2 ? 'x25519' : 'ed25519';
        const pair = generateRawKeyPair(c);
        pair.privateKey.export({ format: 'jwk' });
        rawPublicKey(c, pair.privateKey);
      }`;
    await promisify(execFile)(process.execPath, ['--max-semi-space-size=1', '--import', 'tsx', '--input-type=module', '-e', loop], {
      cwd: ROOT,
      timeout: 60_000,
    });
  }, 70_000);

  it('are never made by generateKeyPairSync in the service', async () => {
    const offenders: string[] = [];
    for (const dir of ['api', 'bench', 'cli', 'client', 'db', 'jobs', 'lib', 'workers']) {
      for (const file of await readdir(join(ROOT, dir), { recursive: true })) {
        if (!/\.(ts|mjs|js)$/.test(file) || file.includes('node_modules')) continue;
        const code = (await readFile(join(ROOT, dir, file), 'utf8')).split('\n').filter((line) => !/^\s*(\*|\/\/|\/\*)/.test(line));
        if (code.some((line) => line.includes('generateKeyPairSync'))) offenders.push(join(dir, file));
      }
    }
    expect(offenders).toEqual([]);
  });
});
