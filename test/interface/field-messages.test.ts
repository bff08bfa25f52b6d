import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKey } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';

/**
 * A refused request body says, per field, what is wrong in words a form can show as they are, on every
 * route (route() parses every request the same way); the detail names the first field, so a client
 * that shows only the detail still tells which field and why. Never the validator's own text.
 */
let s: TestService;

beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

type Problem = { detail: string; code: string; errors: { path: string; message: string }[] };

const VALIDATOR_TEXT = /Too small|Too big|Invalid input|Invalid option|expected|received|Unrecognized|>=|<=/;

function expectWords(res: { status: number; body: Problem }, errors: Problem['errors']) {
  expect(res.status).toBe(422);
  expect(res.body.code).toBe('validation_failed');
  expect(res.body.errors).toEqual(errors);
  for (const e of res.body.errors) expect(e.message).not.toMatch(VALIDATOR_TEXT);
  expect(res.body.detail).not.toMatch(VALIDATOR_TEXT);
}

describe('validation problems in words', () => {
  it('POST /keys/{fp}/rotation-schedule names the wrong or unknown field and why', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const schedule = (body: unknown) => s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body });

    const text = await schedule({ rotation_interval_days: 'abc' });
    expectWords(text, [{ path: 'body.rotation_interval_days', message: 'must be a number' }]);
    expect(text.body.detail).toBe('The request body is invalid: `rotation_interval_days` must be a number.');

    const unknown = await schedule({ interval: 30 });
    expect(unknown.body.errors[0]).toEqual({ path: 'body.interval', message: 'is not a field of this request' });
    expect(unknown.body.detail).toMatch(/^The request body is invalid: `interval` is not a field of this request\. \(1 more in errors\)$/);

    const out = await schedule({ rotation_interval_days: 0, profile: 'newest' });
    expectWords(out, [
      { path: 'body.rotation_interval_days', message: 'must be at least 1' },
      { path: 'body.profile', message: 'must be one of: rfc4880, rfc9580, pqc' },
    ]);
    expectWords(await schedule({ rotation_interval_days: 731 }), [{ path: 'body.rotation_interval_days', message: 'must be at most 730' }]);
    expectWords(await schedule({ use_account_policy: false }), [{ path: 'body.use_account_policy', message: 'must be true' }]);
  });

  it('empty, too long, missing and malformed fields, on other routes', async () => {
    const u = await registerUser(s.api);
    const contact = await s.api('POST', '/auth/contact', { body: { name: '', email: 'not an address', subject: 'x'.repeat(201) } });
    expectWords(contact, [
      { path: 'body.name', message: 'must not be empty' },
      { path: 'body.email', message: 'must be an email address' },
      { path: 'body.subject', message: 'must be at most 200 characters' },
      { path: 'body.message', message: 'is required' },
    ]);
    expect(contact.body.detail).toBe('The request body is invalid: `name` must not be empty. (3 more in errors)');

    const apiKey = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'k', scopes: [], expires_in_days: 1.5 } });
    expectWords(apiKey, [
      { path: 'body.scopes', message: 'must not be empty' },
      { path: 'body.expires_in_days', message: 'must be a whole number' },
    ]);
    const scope = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'k', scopes: ['keys:fly'] } });
    expect(scope.body.errors[0].path).toBe('body.scopes.0');
    expect(scope.body.errors[0].message).toMatch(/^must be one of: keys:read, /);

    const notObject = await s.api('POST', '/auth/login', { body: ['x'] });
    expectWords(notObject, [{ path: 'body', message: 'must be an object' }]);
    expect(notObject.body.detail).toBe('The request body is invalid: it must be an object.');
  });

  it('keeps the messages a schema states itself', async () => {
    const u = await registerUser(s.api);
    const res = await s.api('PUT', '/profile/update', { token: u.token, body: { company_name: 'a\u0007b' } });
    expectWords(res, [{ path: 'body.company_name', message: 'must not contain control characters' }]);
    const login = await s.api('POST', '/auth/login', { body: { identifier: u.username, email: u.email, password: u.password } });
    expectWords(login, [{ path: 'body.identifier', message: 'give exactly one of identifier, username and email' }]);
  });
});
