import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import pkcs11js from 'pkcs11js';
import { startTestService, registerUser, type TestService } from '../support/service';
import { admin, SOFTHSM_MODULE as MODULE, startSoftHsm, TOKEN_PIN as PIN, type SoftHsm } from '../support/softhsm';
import { hostname } from 'node:os';
import { startProcess, waitForOutput } from '../support/process';
import { createKey, download, encrypt, PASSPHRASE, runJob } from '../support/keys';
import { loadConfig } from '../../lib/config';
import { createContainer } from '../../lib/container';
import { keyUsage, reseal, resealProgress, rewrapKeyring, rotateDataKey, totalUses } from '../../lib/root-of-trust/operations';
import { liveProcesses } from '../../lib/heartbeats';

/**
 * The root of trust on a real PKCS#11 token: SoftHSM2 with its own token folder for this run
 * (SOFTHSM2_CONF), as an HSM would hold the root key; and the MASTER_KEY provider it can move from.
 */
let hsm: SoftHsm;
const uri = (object: string, pin: 'pin' | 'wrong-pin' = 'pin') => hsm.uri(object, pin);

/** Where the test service's stored seals stand: uses per key id over every sealed column. */
const usesOf = async (s: TestService, kid: string) => totalUses(await keyUsage(s.c.db), kid);

async function fillAccount(s: TestService) {
  const u = await registerUser(s.api);
  const key = await createKey(s.api, u.token);
  const apiKey = (await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', scopes: ['keys:read'] } })).body as {
    key_id: string;
    value: string;
  };
  const hook = (await s.api('POST', '/webhooks', { token: u.token, body: { url: 'http://127.0.0.1:9/hook' } })).body as { webhook_id: string; secret: string };
  const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.txt', data: Buffer.from('kept across rotations') }]);
  return { u, key, apiKey, hook, enc };
}

async function opensEverything(s: TestService, a: Awaited<ReturnType<typeof fillAccount>>) {
  const shown = await s.api('GET', `/api-keys/${a.apiKey.key_id}`, { token: a.u.token });
  expect(shown.status, JSON.stringify(shown.body)).toBe(200);
  expect(shown.body.value).toBe(a.apiKey.value);
  const dec = await runJob(s.api, a.u.token, '/keys/decrypt', {
    fingerprint: a.key.fingerprint,
    passphrase: PASSPHRASE,
    files: [{ name: 'a.txt.gpg', data: await download(s.api, a.u.token, a.enc.job_id) }],
  });
  expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
  expect((await download(s.api, a.u.token, dec.job_id)).toString()).toBe('kept across rotations');
  // The webhook secret opens (rotating it reads the current one), and the key's row MACs verify.
  expect((await s.api('POST', `/webhooks/${a.hook.webhook_id}/rotate-secret`, { token: a.u.token, body: {} })).status).toBeLessThan(300);
  expect((await s.api('POST', '/keys/get-public-key', { token: a.u.token, body: { fingerprint: a.key.fingerprint } })).status).toBe(200);
}

async function makeAdmin(s: TestService) {
  const u = await registerUser(s.api);
  await s.c.db('users').where({ id: u.id }).update({ role: 'admin' });
  return u;
}

beforeAll(async () => {
  hsm = await startSoftHsm();
});

afterAll(async () => {
  await hsm.stop();
});

describe('root key in a PKCS#11 token', () => {
  let s: TestService;
  beforeAll(async () => {
    // The key is made by the operator command before the service first starts.
    const made = await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri('root-a') });
    expect(made, made.err).toMatchObject({ code: 0, out: expect.stringMatching(/Created the root key/) });
    s = await startTestService({ env: { MASTER_KEY_URI: uri('root-a'), KEYRING_REFRESH_MS: '200' } });
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('init makes a non-extractable, sensitive AES-256 key once; the service seals under keys it wraps', async () => {
    const again = await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri('root-a') });
    expect(again.out).toMatch(/already holds/);

    // The service in this process has the library initialised and the token logged in already.
    const p = new pkcs11js.PKCS11();
    p.load(MODULE);
    expect(() => p.C_Initialize()).toThrow(/CKR_CRYPTOKI_ALREADY_INITIALIZED/);
    const slot = p.C_GetSlotList(true).find((x) => p.C_GetTokenInfo(x).label.trim() === 'kms')!;
    const session = p.C_OpenSession(slot, pkcs11js.CKF_SERIAL_SESSION);
    try {
      p.C_FindObjectsInit(session, [{ type: pkcs11js.CKA_LABEL, value: 'root-a' }]);
      const found = p.C_FindObjects(session, 5);
      p.C_FindObjectsFinal(session);
      expect(found).toHaveLength(1);
      const attrs = p.C_GetAttributeValue(session, found[0], [
        { type: pkcs11js.CKA_EXTRACTABLE },
        { type: pkcs11js.CKA_SENSITIVE },
        { type: pkcs11js.CKA_VALUE_LEN },
        { type: pkcs11js.CKA_TOKEN },
      ]);
      const [extractable, sensitive, length, onToken] = attrs.map((x) => x.value);
      expect([extractable[0], sensitive[0], onToken[0], length.readUIntLE(0, Math.min(length.length, 6))]).toEqual([0, 1, 1, 32]);
      expect(() => p.C_GetAttributeValue(session, found[0], [{ type: pkcs11js.CKA_VALUE }])).toThrow(/CKR_ATTRIBUTE_SENSITIVE/);
    } finally {
      p.C_CloseSession(session);
    }

    const [ring] = await s.c.db('keyring');
    expect(ring).toMatchObject({ root_id: 'pkcs11:token=kms;object=root-a', current_from: new Date(0), retired_at: null });
    expect(ring.wrapped).toMatch(/^w1\./);
    const a = await fillAccount(s);
    const row = await s.c.db('api_keys').where({ id: a.apiKey.key_id }).first();
    expect(row.value_sealed.startsWith(`s1.${ring.kid}.`)).toBe(true);
    await opensEverything(s, a);
  });

  it('rotation: the new key is current at once, the re-seal job moves every value and MAC, /status shows it, and the old key retires', async () => {
    const a = await fillAccount(s);
    const old = s.c.keyring.current().kid;
    const adminUser = await makeAdmin(s);
    const refused = await admin(['master-key', 'retire', old], s.env);
    expect(refused).toMatchObject({ code: 1, err: expect.stringMatching(/is the current key/) });

    const rotated = await admin(['master-key', 'rotate'], s.env);
    expect(rotated.code, rotated.err).toBe(0);
    const kid = /Data key (\S+) is current/.exec(rotated.out)![1];
    // Traffic goes on while the job runs: none of it fails, and what it seals uses the new key.
    const traffic: Promise<unknown>[] = [
      s.api('POST', `/keys/${a.key.fingerprint}/rotate`, { token: a.u.token, body: {} }).then((r) => expect(r.status, JSON.stringify(r.body)).toBe(202)),
    ];
    let finished = false;
    while (!finished) {
      traffic.push(encrypt(s.api, a.u.token, a.key.fingerprint, [{ name: 'b.txt', data: randomBytes(64) }]));
      traffic.push(
        s.api('POST', '/api-keys/generate', { token: a.u.token, body: { name: 'load', scopes: ['keys:read'] } }).then((r) => expect(r.status).toBe(201)),
      );
      const status = await s.api('GET', '/status', { token: adminUser.token });
      expect(status.status).toBe(200);
      finished = status.body.master_key.reseal?.target_kid === kid && status.body.master_key.reseal.finished_at !== null;
      if (finished)
        expect(status.body.master_key).toMatchObject({ root_id: 'pkcs11:token=kms;object=root-a', current_kid: kid, reseal: { resealed: expect.any(Number) } });
      await new Promise((r) => setTimeout(r, 300));
    }
    await Promise.all(traffic);

    const status = JSON.parse((await admin(['master-key', 'status', '--json'], s.env)).out) as { current_kid: string; keys: { kid: string; uses: number }[] };
    expect(status.current_kid).toBe(kid);
    expect(status.keys.find((k) => k.kid === old)!.uses).toBe(0);
    expect(status.keys.find((k) => k.kid === kid)!.uses).toBeGreaterThan(10);

    const retired = await admin(['master-key', 'retire', old], s.env);
    expect(retired.code, retired.err).toBe(0);
    const row = await s.c.db('keyring').where({ kid: old }).first();
    expect(row).toMatchObject({ wrapped: null, retired_at: expect.any(Date) });
    await s.c.keyring.load();
    expect(s.c.keyring.get(old)).toBeUndefined();
    await opensEverything(s, a);
  }, 120_000);
});

describe('re-seal runs', () => {
  let s: TestService;
  beforeAll(async () => {
    s = await startTestService({ env: { MASTER_KEY: `m1:${randomBytes(32).toString('base64')}`, KEYRING_REFRESH_MS: '200' } });
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('resume after a crash half-way, never overwrite a value changed meanwhile, and the old key retires only when unused', async () => {
    const a = await fillAccount(s);
    const b = await fillAccount(s);
    const before = await s.c.db('api_keys').where({ id: a.apiKey.key_id }).first();
    expect(before.value_sealed).toMatch(/^s1\.m1\./);

    const { kid } = await rotateDataKey(s.c.db, s.c.keyring.roots, 0);
    await s.c.keyring.load();
    expect(s.c.keyring.current().kid).toBe(kid);
    expect(await usesOf(s, 'm1')).toBeGreaterThan(0);
    const refusal = await admin(['master-key', 'retire', 'm1'], s.env);
    expect(refusal).toMatchObject({ code: 1, err: expect.stringMatching(/re-seal to "dk-.*" has not finished/) });

    // A crash in the middle: the batch in flight is not written, those before it are, and the position says where.
    let steps = 0;
    await expect(
      reseal(s.c.db, s.c.keyring, s.c.sealer, kid, {
        batch: 1,
        between: ({ ids }) => {
          if (ids.length && ++steps === 4) throw new Error('worker killed');
        },
      }),
    ).rejects.toThrow('worker killed');
    const stopped = await s.c.db('keyring_reseals').where({ target_kid: kid }).first();
    expect(Number(stopped.resealed)).toBe(3);
    expect(stopped.finished_at).toBeNull();

    // Resumed: meanwhile, an API key is rotated between the run's read and its write; its new value stays.
    let raced = false;
    const run = await reseal(s.c.db, s.c.keyring, s.c.sealer, kid, {
      batch: 1,
      between: async ({ table, ids }) => {
        if (raced || table !== 'api_keys' || !ids.includes(b.apiKey.key_id)) return;
        raced = true;
        const res = await s.api('POST', `/api-keys/${b.apiKey.key_id}/rotate`, { token: b.u.token, body: {} });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        b.apiKey.value = res.body.value;
      },
    });
    expect(raced).toBe(true);
    expect(run.finished_at).not.toBeNull();
    expect(run.skipped).toBeGreaterThanOrEqual(1);
    expect((await s.api('GET', `/api-keys/${b.apiKey.key_id}`, { token: b.u.token })).body.value).toBe(b.apiKey.value);
    expect(await usesOf(s, 'm1')).toBe(0);

    // Saved from a backup taken before the retirement: opens no more, and the error names the key id.
    const backup = before.value_sealed as string;
    // A job not yet run whose payload was sealed under the old key holds the retirement back.
    const jobId = await s.c.jobs.enqueue('request-password-reset', { request_id: randomUUID(), sealed_email: backup }, { delay: 3600_000 });
    expect(await admin(['master-key', 'retire', 'm1'], s.env)).toMatchObject({
      code: 1,
      err: expect.stringMatching(/still seals values in 1 job\(s\) waiting in the queues/),
    });
    await (await s.c.jobs.queue('notify').getJob(jobId))!.remove();
    expect((await admin(['master-key', 'retire', 'm1'], s.env)).code).toBe(0);
    await s.c.keyring.load();
    await opensEverything(s, a);
    await opensEverything(s, b);
    await s.c.db('api_keys').where({ id: a.apiKey.key_id }).update({ value_sealed: backup });
    const res = await s.api('GET', `/api-keys/${a.apiKey.key_id}`, { token: a.u.token });
    expect(res.status).toBe(500);
    expect(res.body).toMatchObject({ code: 'master_key_unavailable', detail: 'A stored value is sealed under master key id "m1", which was retired.' });
  });

  it('moves from MASTER_KEY to the token by re-wrapping the keyring; the token alone then opens what was sealed', async () => {
    const a = await fillAccount(s);
    expect((await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri('root-b') })).code).toBe(0);
    const { MASTER_KEY, ...rest } = s.env;
    const both = await createContainer(loadConfig({ ...s.env, MASTER_KEY_URI: uri('root-b') }));
    try {
      expect(await rewrapKeyring(both.db, both.keyring.roots)).toBeGreaterThan(0);
    } finally {
      await both.close();
    }
    expect(new Set((await s.c.db('keyring').whereNull('retired_at')).map((r) => r.root_id))).toEqual(new Set(['pkcs11:token=kms;object=root-b']));

    const tokenOnly = await createContainer(loadConfig({ ...rest, MASTER_KEY_URI: uri('root-b') }));
    try {
      const row = await tokenOnly.db('api_keys').where({ id: a.apiKey.key_id }).first();
      const { valueAad } = await import('../../lib/accounts/api-keys');
      expect(tokenOnly.sealer.openText(row.value_sealed, valueAad(row.id, row.current_secret_id))).toBe(a.apiKey.value);
    } finally {
      await tokenOnly.close();
    }
    // MASTER_KEY alone no longer opens the keyring: start-up says which root it needs.
    await expect(createContainer(loadConfig({ ...s.env, MASTER_KEY: MASTER_KEY }))).rejects.toThrow(
      /wrapped by the root key pkcs11:token=kms;object=root-b, which is not configured/,
    );
  });
});

describe('rotate and retire know the live processes', () => {
  const A = `ka:${randomBytes(32).toString('base64')}`;
  const B = `kb:${randomBytes(32).toString('base64')}`;
  const METRICS_TOKEN = 'metrics-token-for-tests-0123456789';
  let s: TestService;
  /** The configuration after the root moved to B: what every process should be restarted with. */
  let moved: Record<string, string>;
  /** A real worker process started with root A only, which nobody restarts after the root moves. */
  let old: ReturnType<typeof startProcess>;
  const started: ReturnType<typeof startProcess>[] = [];
  const start = (env: Record<string, string>) => {
    const p = startProcess('worker', { ...env, LOG_LEVEL: 'info' });
    started.push(p);
    return p;
  };
  const stop = async (p: ReturnType<typeof startProcess>) => {
    p.kill('SIGTERM');
    await p.exited;
  };
  const beatOf = async (pid: number | undefined, prefix = s.config.redisPrefix) => (await liveProcesses(s.c.redis, prefix)).find((b) => b.pid === pid);

  beforeAll(async () => {
    s = await startTestService({ roles: [], env: { MASTER_KEY: A, KEYRING_REFRESH_MS: '200' } });
    moved = { ...s.env, MASTER_KEY: B, MASTER_KEYS_PREVIOUS: A };
    old = start({ ...s.env, WORKER_QUEUES: 'notify=1', WORKER_HTTP_PORT: '0', METRICS_TOKEN });
    await waitForOutput(old, 'workers started');
    // The operator moves the root key to B; the worker keeps running, as it knows every data key.
    expect(await admin(['master-key', 'rewrap'], moved)).toMatchObject({ code: 0 });
  }, 60_000);
  afterAll(async () => {
    for (const p of started) if (p.exitCode === null) await stop(p);
    await s?.stop();
  });

  it('rotate refuses while no worker takes the maintenance queue on the Redis it enqueues to (nothing made, exit 1)', async () => {
    // A worker of the maintenance queue on another prefix of the same Redis does not serve these queues.
    const other = `${s.config.redisPrefix}_other`;
    const elsewhere = start({ ...moved, REDIS_PREFIX: other, WORKER_QUEUES: 'maintenance=1' });
    await expect.poll(async () => (await beatOf(elsewhere.pid, other))?.queues, { timeout: 20_000 }).toEqual([{ queue: 'maintenance', concurrency: 1 }]);
    const refused = await admin(['master-key', 'rotate'], moved);
    expect(refused, refused.out).toMatchObject({ code: 1, err: expect.stringMatching(/^no live worker takes the "maintenance" queue on this Redis/) });
    expect((await s.c.db('keyring')).map((r) => r.kid)).toEqual(['ka']);
    expect(await s.c.jobs.queue('maintenance').getJobCounts('waiting', 'delayed')).toEqual({ waiting: 0, delayed: 0 });
    await stop(elsewhere);
  }, 60_000);

  it('retire refuses, naming it, while a live process has not loaded the current key (its reload fails: heartbeat, /readyz, metric), and goes once it is restarted', async () => {
    const fresh = start({ ...moved, WORKER_QUEUES: 'maintenance=1' });
    await expect.poll(() => beatOf(fresh.pid), { timeout: 20_000 }).toBeDefined();
    const rotated = await admin(['master-key', 'rotate'], moved);
    expect(rotated.code, rotated.err).toBe(0);
    const kid = /Data key (\S+) is current/.exec(rotated.out)![1];
    // The old worker cannot unwrap the new key (the root B wraps it): it keeps sealing under "ka".
    await waitForOutput(old, 'keyring reload failed');
    await expect.poll(async () => (await resealProgress(s.c.db, kid))?.finished_at ?? null, { timeout: 30_000, interval: 300 }).not.toBeNull();
    expect(await usesOf(s, 'ka')).toBe(0);
    const refused = await admin(['master-key', 'retire', 'ka'], moved);
    expect(refused, refused.out).toMatchObject({ code: 1, err: expect.stringContaining(`have not loaded the current data key "${kid}"`) });
    expect(refused.err).toContain(
      `worker pid ${old.pid} on ${hostname()} seals under "ka" (its keyring reload fails: the keyring's data key "${kid}" is wrapped by the root key master-key:kb, which is not configured`,
    );
    expect(refused.err).not.toContain(`pid ${fresh.pid} `);
    expect(await s.c.db('keyring').where({ kid: 'ka' }).first()).toMatchObject({ retired_at: null, wrapped: expect.any(String) });

    // What shows it: its heartbeat, its /readyz, its metrics, master-key status.
    expect((await beatOf(old.pid))?.keyring).toMatchObject({ current_kid: 'ka', reload_error: expect.stringContaining('master-key:kb') });
    expect((await beatOf(fresh.pid))?.keyring).toMatchObject({ current_kid: kid, reload_error: null });
    const port = Number(/"port":(\d+),[^\n]*worker health server listening/.exec(old.output())![1]);
    const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
    expect([ready.status, await ready.json()]).toEqual([200, { status: 'degraded', checks: { postgres: 'up', redis: 'up', keyring: 'stale' } }]);
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })).text();
    expect(metrics).toMatch(/^kms_keyring_reload_failing 1$/m);
    expect(Number(/^kms_keyring_reload_failures_total (\d+)$/m.exec(metrics)![1])).toBeGreaterThan(0);
    const status = JSON.parse((await admin(['master-key', 'status', '--json'], moved)).out) as { processes: { pid: number; behind: boolean }[] };
    expect(status.processes.map((p) => [p.pid, p.behind]).sort()).toEqual(
      [
        [old.pid, true],
        [fresh.pid, false],
      ].sort(),
    );

    // Restarted with the root key configuration, it loads the current key, and the old key retires.
    await stop(old);
    const restarted = start({ ...moved, WORKER_QUEUES: 'notify=1' });
    await expect.poll(async () => (await beatOf(restarted.pid))?.keyring, { timeout: 20_000 }).toMatchObject({ current_kid: kid, reload_error: null });
    const retired = await admin(['master-key', 'retire', 'ka'], moved);
    expect(retired.code, retired.err).toBe(0);
  }, 120_000);
});

describe('start-up failures of the root of trust', () => {
  let s: TestService;
  beforeAll(async () => {
    s = await startTestService({ roles: [], env: { MASTER_KEY: `m2:${randomBytes(32).toString('base64')}` } });
    // Each check gets a database whose keyring the token's key wraps.
    const made = await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri('root-c') });
    expect(made.code, made.err).toBe(0);
    const c = await createContainer(loadConfig({ ...s.env, MASTER_KEY_URI: uri('root-c') }));
    await rewrapKeyring(c.db, c.keyring.roots);
    await c.close();
  });
  afterAll(async () => {
    await s?.stop();
  });

  it('each ends the process with one line naming the cause, never the PIN or a stack trace', async () => {
    const other = `k9:${randomBytes(32).toString('base64')}`;
    const cases: [Record<string, string>, RegExp][] = [
      [{ MASTER_KEY_URI: uri('root-c', 'wrong-pin') }, /^MASTER_KEY_URI: logging in to token "kms" failed: the PIN is wrong$/],
      [{ MASTER_KEY_URI: uri('root-c').replace('token=kms', 'token=absent') }, /^MASTER_KEY_URI: no token labelled "absent"/],
      [
        { MASTER_KEY_URI: uri('missing') },
        /^MASTER_KEY_URI: token "kms" has no secret key labelled "missing" \(npm run admin -- master-key init creates it\)$/,
      ],
      [{ MASTER_KEY_URI: uri('root-c').replace(MODULE, '/etc/hostname') }, /^MASTER_KEY_URI: the module-path \/etc\/hostname is not a PKCS#11 library/],
      [{ MASTER_KEY: other }, /is wrapped by the root key pkcs11:token=kms;object=root-c, which is not configured/],
    ];
    const start = async (env: Record<string, string>) => {
      const web = startProcess('web', { ...s.env, MASTER_KEY: '', ...env });
      return { code: await web.exited, lines: web.output().trim().split('\n') };
    };
    const runs = await Promise.all(cases.map(([env]) => start(env)));
    // The token's key replaced by another of the same label (deleted, then made again by init).
    hsm.destroyKey('root-c');
    expect((await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri('root-c') })).out).toMatch(/Created/);
    cases.push([
      {},
      /^the keyring's data key "m2" does not open with the root key pkcs11:token=kms;object=root-c: the token's key is not the one that wrapped it$/,
    ]);
    runs.push(await start({ MASTER_KEY_URI: uri('root-c') }));
    for (const [i, run] of runs.entries()) {
      expect(run.code).not.toBe(0);
      expect(run.lines, run.lines.join('\n')).toHaveLength(1);
      expect(run.lines[0]).toMatch(cases[i][1]);
      expect(run.lines[0]).not.toContain(PIN);
    }
  }, 90_000);
});
