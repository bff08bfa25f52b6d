import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { createSealer } from '../../lib/sealer';

const key = (kid: string) => `${kid}:${randomBytes(32).toString('base64')}`;

describe('sealer', () => {
  const sealer = createSealer(key('k1'));

  it('opens what it sealed, with the same AAD only', () => {
    const sealed = sealer.seal('secret', 'row-1');
    expect(sealer.openText(sealed, 'row-1')).toBe('secret');
    expect(() => sealer.open(sealed, 'row-2')).toThrow();
  });

  it('refuses a truncated tag and values too short to hold an IV and a tag', () => {
    const sealed = sealer.seal('secret', 'aad');
    const [v, kid, body] = sealed.split('.') as [string, string, string];
    const raw = Buffer.from(body, 'base64url');
    for (const cut of [1, 4, 12]) {
      const truncated = `${v}.${kid}.${raw.subarray(0, raw.length - cut).toString('base64url')}`;
      expect(() => sealer.open(truncated, 'aad'), `tag cut by ${cut}`).toThrow();
    }
    expect(() => sealer.open(`${v}.${kid}.${raw.subarray(0, 27).toString('base64url')}`, 'aad')).toThrow(/too short/);
  });

  it('refuses values with extra parts or characters outside base64url (one spelling per sealed value)', () => {
    const sealed = sealer.seal('secret', 'aad');
    const [v, kid, body] = sealed.split('.') as [string, string, string];
    expect(() => sealer.open(`${sealed}.extra`, 'aad')).toThrow(/format/);
    for (const variant of [`${body.slice(0, 10)}+${body.slice(10)}`, `${body} `, `${body}==`, `${body.slice(0, 10)}\n${body.slice(10)}`]) {
      expect(() => sealer.open(`${v}.${kid}.${variant}`, 'aad'), JSON.stringify(variant)).toThrow(/base64url/);
    }
    expect(() => sealer.open(`${v}.unknown.${body}`, 'aad')).toThrow(/master key id/);
  });
});
