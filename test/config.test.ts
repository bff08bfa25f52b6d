import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { loadConfig } from '../lib/config';

/** Configuration fails closed: the public development secrets only where the environment says so. */
const key = (kid: string) => `${kid}:${randomBytes(32).toString('base64')}`;
const secrets = { MASTER_KEY: key('m1'), JWT_SECRET: randomBytes(24).toString('hex') };

describe('loadConfig', () => {
  it('refuses to start with NODE_ENV unset (or production) and no MASTER_KEY or JWT_SECRET', () => {
    expect(() => loadConfig({})).toThrow(/MASTER_KEY must be set/);
    expect(() => loadConfig({ MASTER_KEY: secrets.MASTER_KEY })).toThrow(/JWT_SECRET must be set/);
    expect(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: secrets.JWT_SECRET })).toThrow(/MASTER_KEY must be set/);
    expect(loadConfig(secrets).production).toBe(true);
  });

  it('uses the development secrets only for NODE_ENV development or test', () => {
    expect(loadConfig({ NODE_ENV: 'development' }).masterKeys.current).toMatch(/^dev:/);
    expect(loadConfig({ NODE_ENV: 'test' }).jwt.secret.length).toBeGreaterThanOrEqual(32);
  });

  it('refuses the development master key among the previous keys outside development and test', () => {
    const dev = loadConfig({ NODE_ENV: 'development' }).masterKeys.current;
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: dev })).toThrow(/development master key/);
    expect(() => loadConfig({ ...secrets, MASTER_KEY: dev })).toThrow(/development master key/);
  });

  it('refuses a master key id that appears twice (a previous key would replace the current one)', () => {
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: key('m1') })).toThrow(/"m1" appears more than once/);
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: `${key('old')},${key('old')}` })).toThrow(/"old"/);
    expect(loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: key('m0') }).masterKeys.previous).toHaveLength(1);
  });

  it('trusts no proxy by default', () => {
    expect(loadConfig({ NODE_ENV: 'test' }).trustedProxyCount).toBe(0);
    expect(loadConfig({ NODE_ENV: 'test', TRUSTED_PROXY_COUNT: '2' }).trustedProxyCount).toBe(2);
  });
});
