import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../lib/errors';
import {
  createLineageLock,
  DEFAULT_KDF,
  lineageKdf,
  openLineageLock,
  openSealedSecret,
  randomSecret,
  sealSecret,
  setLineageKdf,
  type KdfParams,
  type LineageLock,
} from '../../lib/lineage';
import { generateKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { loadConfig } from '../../lib/config';

const PASS = 'correct horse battery staple';

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => undefined,
    (e: unknown) => e,
  );
}

function editLocked(lock: LineageLock, edit: (o: Record<string, unknown>) => void): LineageLock {
  const o = JSON.parse(lock.lockedPrivate) as Record<string, unknown>;
  edit(o);
  return { ...lock, lockedPrivate: JSON.stringify(o) };
}

function flipFirstByte(b64url: unknown): string {
  const raw = Buffer.from(String(b64url), 'base64url');
  raw[0] ^= 1;
  return raw.toString('base64url');
}

describe('lineage lock', () => {
  let saved: KdfParams;
  beforeAll(() => {
    saved = lineageKdf();
    setLineageKdf({ memoryKib: 1024, timeCost: 1 }); // fast for tests; production refuses this
  });
  afterAll(() => {
    setLineageKdf(saved);
  });

  it('round-trips: seal without the passphrase, open with it', async () => {
    const lock = await createLineageLock(PASS);
    expect(Buffer.from(lock.publicKey, 'base64')).toHaveLength(32);
    const stored = JSON.parse(lock.lockedPrivate) as Record<string, unknown>;
    expect(stored).toMatchObject({ v: 1, kdf: 'argon2id', m: 1024, t: 1, p: 1 });
    expect(lock.lockedPrivate).not.toContain(PASS);

    const secret = randomSecret();
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const sealed = sealSecret(lock.publicKey, secret, 'generation:1');
    expect(sealed).not.toContain(secret);
    expect(sealSecret(lock.publicKey, secret, 'generation:1')).not.toBe(sealed); // fresh ephemeral key each time

    const unlock = await openLineageLock(lock, PASS);
    expect(unlock.publicKey).toBe(lock.publicKey);
    expect(openSealedSecret(unlock, sealed, 'generation:1')).toBe(secret);
  });

  it('says wrong_passphrase (422) for a wrong passphrase', async () => {
    const lock = await createLineageLock(PASS);
    const err = await rejection(openLineageLock(lock, 'Correct horse battery staple'));
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe('wrong_passphrase');
    expect((err as AppError).status).toBe(422);
  });

  it('treats a tampered or malformed lock as corrupt data (plain Error)', async () => {
    const lock = await createLineageLock(PASS);
    const cases: LineageLock[] = [
      editLocked(lock, (o) => (o.ct = flipFirstByte(o.ct))),
      editLocked(lock, (o) => (o.iv = flipFirstByte(o.iv))),
      editLocked(lock, (o) => (o.tag = flipFirstByte(o.tag))),
      editLocked(lock, (o) => (o.v = 2)),
      editLocked(lock, (o) => (o.m = 1 << 30)), // would ask for 1 TiB
      editLocked(lock, (o) => delete o.salt),
      { ...lock, lockedPrivate: 'not json' },
      { ...lock, publicKey: (await createLineageLock(PASS)).publicKey }, // lock moved to another lineage
    ];
    for (const bad of cases) {
      const err = await rejection(openLineageLock(bad, PASS));
      expect(err).toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(AppError);
    }
  });

  it('binds a sealed secret to its context and its lineage', async () => {
    const lock = await createLineageLock(PASS);
    const other = await createLineageLock(PASS);
    const sealed = sealSecret(lock.publicKey, 's3cret', 'lineage:1/generation:2');
    const unlock = await openLineageLock(lock, PASS);
    expect(() => openSealedSecret(unlock, sealed, 'lineage:1/generation:3')).toThrow(/cannot be opened/);
    const parts = sealed.split('.');
    for (const i of [1, 2, 3, 4]) {
      const tampered = parts.map((p, j) => (j === i ? flipFirstByte(p) : p)).join('.');
      expect(() => openSealedSecret(unlock, tampered, 'lineage:1/generation:2')).toThrow();
    }
    expect(() => openSealedSecret(unlock, 'garbage', 'x')).toThrow(/unknown format/);
    const otherUnlock = await openLineageLock(other, PASS);
    expect(() => openSealedSecret(otherUnlock, sealed, 'lineage:1/generation:2')).toThrow(/cannot be opened/);
  });

  it('protects an OpenPGP generation end to end', async () => {
    const lock = await createLineageLock(PASS);
    const secret = randomSecret();
    const key = await generateKey({ name: 'L', email: 'l@example.com', algorithm: 'curve25519', secret });
    const sealed = sealSecret(lock.publicKey, secret, key.fingerprint); // rotation: no passphrase needed
    const unlock = await openLineageLock(lock, PASS); // decryption: passphrase needed
    const privateKey = await unlockPrivateKey(key.privateArmored, openSealedSecret(unlock, sealed, key.fingerprint));
    expect(privateKey.getFingerprint()).toBe(key.fingerprint);
  });

  it('opens locks made with other parameters (they are stored with the lock)', async () => {
    const lock = await createLineageLock(PASS);
    setLineageKdf({ memoryKib: 2048, timeCost: 2 });
    let other: LineageLock;
    try {
      other = await createLineageLock(PASS);
      expect(JSON.parse(other.lockedPrivate)).toMatchObject({ m: 2048, t: 2 });
    } finally {
      setLineageKdf({ memoryKib: 1024, timeCost: 1 });
    }
    await openLineageLock(other, PASS);
    await openLineageLock(lock, PASS);
  });

  it('uses production-grade defaults and refuses to go below the floor in production', async () => {
    expect(DEFAULT_KDF.memoryKib).toBeGreaterThanOrEqual(19_456);
    expect(DEFAULT_KDF.timeCost).toBeGreaterThanOrEqual(2);
    const env = process.env.NODE_ENV;
    process.env.NODE_ENV = 'production';
    try {
      expect(() => setLineageKdf({ memoryKib: 1024, timeCost: 1 })).toThrow(/production floor/);
    } finally {
      process.env.NODE_ENV = env;
    }
    setLineageKdf(DEFAULT_KDF);
    try {
      const started = performance.now();
      const lock = await createLineageLock(PASS);
      await openLineageLock(lock, PASS);
      expect(performance.now() - started).toBeLessThan(5_000);
    } finally {
      setLineageKdf({ memoryKib: 1024, timeCost: 1 });
    }
  });

  it('has one default: the configuration (LINEAGE_KDF_MEMORY_KIB) takes its memory from DEFAULT_KDF', () => {
    expect(loadConfig({ NODE_ENV: 'test' }).lineageKdfMemoryKib).toBe(DEFAULT_KDF.memoryKib);
    expect(loadConfig({ NODE_ENV: 'test', LINEAGE_KDF_MEMORY_KIB: '65536' }).lineageKdfMemoryKib).toBe(65_536);
  });

  it('requires a passphrase', async () => {
    expect(((await rejection(createLineageLock(''))) as AppError).code).toBe('invalid_passphrase');
  });
});
