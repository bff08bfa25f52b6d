import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { captureLogs } from '../support/logs';

/** Whatever is logged by mistake, no secret of ours reaches the output, at any depth. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

function capture() {
  const logs = captureLogs();
  return { log: logs.logger('info'), output: logs.output };
}

const secret = (label: string) => `${label}-${randomBytes(12).toString('hex')}`;

describe('log redaction', () => {
  it('censors secret-named fields and secret-shaped values at any depth, in messages and errors too', async () => {
    const { log, output } = capture();
    const sealed = s.c.sealer.seal('x', 'aad');
    const jwt = `eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ${randomBytes(8).toString('hex')}.${randomBytes(16).toString('base64url')}`;
    const apiKey = `kms_pk_${randomBytes(32).toString('base64url')}`;
    const values = {
      password: secret('pw'),
      passphrase: secret('pp'),
      new_passphrase: secret('np'),
      current_passphrase: secret('cp'),
      token: secret('tok'),
      sealed_passphrase: secret('sp'),
      private_sealed: secret('ps'),
    };
    log.info(
      { req: { headers: { authorization: `Bearer ${jwt}`, 'x-api-key': apiKey, cookie: secret('ck') } }, body: { a: { b: { c: { ...values } } } } },
      'request',
    );
    log.info({ deep: [{ note: `key ${apiKey} and seal ${sealed}` }] }, `message with ${jwt}`);
    log.error({ err: new Error(`failed for ${apiKey} with ${sealed}`) }, 'boom');
    const text = output();
    for (const v of [...Object.values(values), jwt, apiKey, sealed]) expect(text, v).not.toContain(v);
    expect(text).toContain('[redacted]');
    expect(text).toContain('request');
  });

  it('keeps bound values out of logged database errors', async () => {
    const { log, output } = capture();
    const hash = createHash('sha256').update(randomBytes(16)).digest('hex');
    const err = await s.c.db.transaction(async (trx) => {
      await trx.raw('create temporary table leak_check (token_hash text unique) on commit drop');
      await trx('leak_check').insert({ token_hash: hash });
      return trx('leak_check')
        .insert({ token_hash: hash })
        .catch((e: unknown) => e);
    });
    expect(JSON.stringify(err, Object.getOwnPropertyNames(err))).toContain(hash); // Postgres does put it there
    log.error({ err }, 'insert failed');
    const text = output();
    expect(text).toContain('23505');
    expect(text).not.toContain(hash);
  });

  it('censors at any depth (no depth limit lets a value through) and in arrays, Maps, Sets and Buffers', () => {
    const { log, output } = capture();
    const pw = secret('deep');
    const hidden = secret('plain'); // not secret-shaped: only its field name gives it away
    let nested: Record<string, unknown> = { password: pw, note: 'innermost' };
    for (let i = 0; i < 40; i++) nested = { level: i, child: nested };
    log.info(
      {
        nested,
        list: [[[{ current_passphrase: hidden }]]],
        map: new Map([['x', { new_passphrase: hidden }]]),
        set: new Set([{ token: hidden }]),
        raw: Buffer.from(hidden),
      },
      'deep',
    );
    const text = output();
    for (const v of [pw, hidden]) expect(text).not.toContain(v);
    expect(text).toContain('"level":39');
    expect(text).toContain('[too deep]'); // beyond 32 levels a value is replaced, never passed through
  });

  it('censors passwords in connection URLs and secret URL parameters, in child bindings and interpolated arguments; keeps dates readable', () => {
    const { log, output } = capture();
    const [dbPw, redisPw, resetToken, apiParam, bound, interpolated] = ['db', 'rd', 'rt', 'ak', 'bd', 'ip'].map(secret);
    log.info({ database: `postgres://kms:${dbPw}@db.internal:5432/kms`, at: new Date(0) }, `redis at redis://:${redisPw}@cache:6379/0`);
    log.info({ link: `https://kms.example/reset-password#token=${resetToken}`, call: `https://api.example/v1?user=1&api_key=${apiParam}` }, 'links');
    log.child({ request_id: 'r1' }).child({ authorization: bound }).child({ job: 'j' }).info('child');
    log.info('interpolated %o and %s', { passphrase: interpolated }, `Bearer ${interpolated}`);
    const text = output();
    for (const v of [dbPw, redisPw, resetToken, apiParam, bound, interpolated]) expect(text, v).not.toContain(v);
    expect(text).toContain('postgres://kms:[redacted]@db.internal:5432/kms');
    expect(text).toContain('1970-01-01T00:00:00.000Z');
  });

  it('a failing query carries its SQL with placeholders, never a bound value, in its message and in the logs', async () => {
    const { log, output } = capture();
    const hash = createHash('sha256').update(randomBytes(16)).digest('hex');
    const password = secret('pw');
    const sealed = s.c.sealer.seal('x', 'aad');
    const errors: Error[] = [];
    // knex inlines bindings by default (here into the jsonb `?` it unescaped); Postgres repeats a bad
    // input value inside the message of a data exception (SQLSTATE 22P02, 22003, 22007).
    for (const [sql, bindings] of [
      ["select '{}'::jsonb \\? ?, ?::uuid", [hash, password]],
      ['select ?::int', [`9${'9'.repeat(20)}${hash.slice(0, 8)}`]],
      ['select ?::timestamptz', [sealed]],
    ] as const) {
      const err = await s.c.db.raw(sql, [...bindings]).then(
        () => null,
        (e: Error) => e,
      );
      expect(err).toBeInstanceOf(Error);
      errors.push(err!);
    }
    const inTrx = await s.c.db
      .transaction((trx) => trx.raw('select ?::uuid', [password]))
      .then(
        () => null,
        (e: Error) => e,
      );
    errors.push(inTrx!);
    for (const err of errors) {
      expect(err.message).toMatch(/\$1/);
      for (const v of [hash, hash.slice(0, 8), password, sealed]) {
        expect(err.message, err.message).not.toContain(v);
        expect(err.stack).not.toContain(v);
      }
      log.error({ err }, 'query failed');
    }
    const text = output();
    expect(text).toContain('22P02');
    for (const v of [hash, hash.slice(0, 8), password, sealed]) expect(text).not.toContain(v);
  });

  it('a request through the service logs none of the secrets it carries', async () => {
    const { log, output } = capture();
    const original = s.c.log;
    s.c.log = log;
    try {
      const u = await registerUser(s.api);
      const jwt = u.token;
      const apiKey = `kms_pk_${randomBytes(32).toString('base64url')}`;
      const password = secret('login-pw');
      await s.api('POST', '/auth/login', { body: { username: u.username, password } });
      await s.api('GET', '/auth/me', { token: jwt, headers: { 'x-api-key': apiKey, cookie: `session=${jwt}` } });
      await s.api('POST', '/profile/change-password', {
        token: jwt,
        body: { current_password: password, new_password: secret('new-pw'), extra: { a: { b: { token: secret('t') } } } },
      });
      const text = output();
      expect(text).toContain('"route"');
      for (const v of [jwt, apiKey, password, u.password]) expect(text).not.toContain(v);
    } finally {
      s.c.log = original;
    }
  });
});
