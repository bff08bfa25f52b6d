import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';

/**
 * POST /api-keys/generate honours Idempotency-Key as job submissions do: a retried request makes no
 * second key and answers the first one, with its value read the sealed way (never kept in the clear);
 * the same Idempotency-Key with another request is refused with 422 idempotency_key_reused.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

const generate = (token: string, body: unknown, key?: string) =>
  s.api('POST', '/api-keys/generate', { token, body, headers: key ? { 'idempotency-key': key } : {} });

describe('POST /api-keys/generate with Idempotency-Key', () => {
  it('makes one key for one key and request, and answers it again', async () => {
    const u = await registerUser(s.api);
    const body = { name: 'deploy', scopes: ['keys:read'] };
    const first = await generate(u.token, body, 'gen-1');
    expect(first.status).toBe(201);
    const again = await generate(u.token, body, 'gen-1');
    expect(again.status).toBe(201);
    expect(again.body).toEqual(first.body);
    expect(await s.c.db('api_keys').where({ user_id: u.id })).toHaveLength(1);
    // The value is stored sealed only: not in the clear, and the idempotency columns hold no part of it.
    const row = await s.c.db('api_keys').where({ id: first.body.key_id }).first();
    expect(JSON.stringify(row)).not.toContain(first.body.value);
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'api_keys.create' })).toHaveLength(1);

    // Another account's identical key is its own.
    const other = await registerUser(s.api);
    const theirs = await generate(other.token, body, 'gen-1');
    expect(theirs.status).toBe(201);
    expect(theirs.body.key_id).not.toBe(first.body.key_id);
  });

  it('answers the key as it is now: rotated, its new value; revoked, no value', async () => {
    const u = await registerUser(s.api);
    const body = { name: 'ci', scopes: ['keys:read'] };
    const first = await generate(u.token, body, 'gen-2');
    const rotated = await s.api('POST', `/api-keys/${first.body.key_id}/rotate`, { token: u.token, body: {} });
    expect(rotated.status).toBe(200);
    expect((await generate(u.token, body, 'gen-2')).body).toMatchObject({ key_id: first.body.key_id, value: rotated.body.value });
    expect((await s.api('DELETE', `/api-keys/${first.body.key_id}`, { token: u.token })).status).toBeLessThan(300);
    expect((await generate(u.token, body, 'gen-2')).body).toMatchObject({ key_id: first.body.key_id, status: 'revoked', value: null });
  });

  it('refuses the same key with another request, and a malformed key, making nothing', async () => {
    const u = await registerUser(s.api);
    expect((await generate(u.token, { name: 'a', scopes: ['keys:read'] }, 'gen-3')).status).toBe(201);
    const other = await generate(u.token, { name: 'b', scopes: ['keys:read'] }, 'gen-3');
    expect([other.status, other.body.code]).toEqual([422, 'idempotency_key_reused']);
    const bad = await generate(u.token, { name: 'c', scopes: ['keys:read'] }, 'with space');
    expect([bad.status, bad.body.code]).toEqual([422, 'invalid_idempotency_key']);
    expect(await s.c.db('api_keys').where({ user_id: u.id })).toHaveLength(1);
    // Without the header every request makes a key, as before.
    expect((await generate(u.token, { name: 'a', scopes: ['keys:read'] })).status).toBe(201);
    expect(await s.c.db('api_keys').where({ user_id: u.id })).toHaveLength(2);
  });
});
