import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Writable } from 'node:stream';
import { createHash, randomBytes } from 'node:crypto';
import { createLogger } from '../lib/logger';
import { startTestService, type TestService } from './support/service';

/** Whatever is logged by mistake, no secret of ours reaches the output, at any depth. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService({ roles: [] });
});
afterAll(async () => {
  await s?.stop();
});

function capture() {
  let out = '';
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      out += chunk.toString();
      done();
    },
  });
  return { log: createLogger('info', {}, sink), output: () => out };
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
    log.info({ req: { headers: { authorization: `Bearer ${jwt}`, 'x-api-key': apiKey, cookie: secret('ck') } }, body: { a: { b: { c: { ...values } } } } }, 'request');
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
      return trx('leak_check').insert({ token_hash: hash }).catch((e: unknown) => e);
    });
    expect(JSON.stringify(err, Object.getOwnPropertyNames(err))).toContain(hash); // Postgres does put it there
    log.error({ err }, 'insert failed');
    const text = output();
    expect(text).toContain('23505');
    expect(text).not.toContain(hash);
  });
});
