import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from './support/service';

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
    expect([path.status, path.body.detail]).toEqual([422, 'The path parameters are invalid.']);
    const query = await s.api('GET', '/keys/list?page=abc', { token: u.token });
    expect([query.status, query.body.detail]).toEqual([422, 'The query string is invalid.']);
    const body = await s.api('POST', '/auth/login', { body: { identifier: 'x' } });
    expect([body.status, body.body.detail]).toEqual([422, 'The request body is invalid.']);
  });
});
