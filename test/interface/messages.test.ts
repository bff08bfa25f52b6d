import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKey } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';

/** Problem details read as sentences a person would write. */
let s: TestService;

beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

describe('problem details', () => {
  it('name the part of the request that is invalid in plain words', async () => {
    const u = await registerUser(s.api);
    const path = await s.api('GET', '/jobs/not-a-uuid', { token: u.token });
    expect([path.status, path.body.detail]).toEqual([422, 'The path parameters are invalid: `job_id` must be a UUID.']);
    const query = await s.api('GET', '/keys/list?page=abc', { token: u.token });
    expect([query.status, query.body.detail]).toEqual([422, 'The query string is invalid: `page` must be a whole number (decimal digits).']);
    const body = await s.api('POST', '/auth/login', { body: { identifier: 'x' } });
    expect([body.status, body.body.detail]).toEqual([422, 'The request body is invalid: `password` is required.']);
  });

  it('say what is wrong as a sentence', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: 'not the passphrase of this key', files: [{ name: 'a.gpg', data: Buffer.from('x') }] },
    });
    expect([res.status, res.body.code, res.body.detail]).toEqual([422, 'wrong_passphrase', 'The passphrase is wrong.']);
  });

  it('say what is wrong with a supplied key as a sentence too', async () => {
    const u = await registerUser(s.api);
    const encryptTo = (publicKey: string) =>
      s.api('POST', '/keys/encrypt', { token: u.token, form: { public_key: publicKey, files: [{ name: 'a.txt', data: Buffer.from('x') }] } });
    const empty = await encryptTo(' ');
    expect([empty.status, empty.body.code, empty.body.detail]).toEqual([422, 'invalid_public_key', 'The public key is empty.']);
    const garbage = await encryptTo('-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n');
    expect([garbage.status, garbage.body.code]).toEqual([422, 'invalid_public_key']);
    expect(garbage.body.detail).toMatch(/^Not a readable OpenPGP public key: /);
  });
});
