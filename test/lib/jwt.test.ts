import { describe, expect, it } from 'vitest';
import { signSession, verifySession } from '../../lib/auth/jwt';

/** Session tokens: verified once per process, but every use is checked against the clock and the secret. */
describe('verifySession', () => {
  const secret = 's'.repeat(48);
  const t0 = new Date('2026-11-25T10:00:00Z');
  const claims = { sub: '6b3e1f0e-0000-4000-8000-000000000001', role: 'user' as const, tv: 3, auth_time: t0.getTime() / 1000 - 3600 };
  const at = (seconds: number) => new Date(t0.getTime() + seconds * 1000);

  it('accepts a token again and again until it expires, then never (the second use comes from the cache)', async () => {
    const { token } = await signSession(claims, secret, 900, t0);
    expect(await verifySession(token, secret, at(1), 900)).toEqual(claims);
    expect(await verifySession(token, secret, at(899), 900)).toEqual(claims);
    // Expired (past the 30 s clock tolerance), however often it was accepted before.
    expect(await verifySession(token, secret, at(900 + 31), 900)).toBeNull();
    // Not yet valid for a process whose clock is behind by more than the tolerance.
    expect(await verifySession(token, secret, at(-31), 900)).toBeNull();
    // A shorter allowed lifetime (configuration changed) refuses it too.
    expect(await verifySession(token, secret, at(2), 600)).toBeNull();
  });

  it('refuses a verified token under another secret, and any changed token', async () => {
    const { token } = await signSession(claims, secret, 900, t0);
    expect(await verifySession(token, secret, at(1), 900)).toEqual(claims);
    expect(await verifySession(token, 'o'.repeat(48), at(1), 900)).toBeNull();
    expect(await verifySession(token, secret, at(1), 900)).toEqual(claims);
    const [h, p, sig] = token.split('.');
    const forged = JSON.parse(Buffer.from(p, 'base64url').toString()) as Record<string, unknown>;
    forged.role = 'admin';
    expect(await verifySession(`${h}.${Buffer.from(JSON.stringify(forged)).toString('base64url')}.${sig}`, secret, at(1), 900)).toBeNull();
    expect(await verifySession(`${token.slice(0, -2)}AA`, secret, at(1), 900)).toBeNull();
  });

  it('carries the sign-in time it was given, and refuses one later than the issue', async () => {
    const { token } = await signSession(claims, secret, 900, t0);
    expect((await verifySession(token, secret, at(1), 900))?.auth_time).toBe(claims.auth_time);
    const { token: later } = await signSession({ ...claims, auth_time: t0.getTime() / 1000 + 5 }, secret, 900, t0);
    expect(await verifySession(later, secret, at(10), 900)).toBeNull();
  });
});
