import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, encrypt } from '../support/keys';
import * as accounts from '../../lib/accounts/user-accounts';
import { routes } from '../../api/app';

/**
 * Hostile text in every request part of every route the OpenAPI document lists. Postgres refuses
 * U+0000 in text (SQLSTATE 22021), which used to surface as 500; other control characters must be
 * refused where the document says so (its patterns) and must never break anything elsewhere.
 *
 * For each operation, each of its path and query parameters and each string field of its JSON or
 * multipart body (read from the served document's schemas) gets, one at a time, a value holding
 * U+0000 and then other control characters, in an otherwise valid-looking request by a registered
 * user. Every answer must come in time, never be 5xx, and every 4xx must be problem+json; U+0000 must
 * be answered 422 validation_failed naming the field; a value the documented pattern refuses must be 4xx.
 */
type Json = Record<string, any>;
type Where = 'params' | 'query' | 'body';

let s: TestService;
let owner: Awaited<ReturnType<typeof registerUser>>;
let doc: Json;
let key: { fingerprint: string; lineage_id: string };
let rotated: { fingerprint: string };
let jobId: string;
let webhook: { id: string; delivery: string };

beforeAll(async () => {
  s = await startTestService({ env: { MAX_FILES_PER_JOB: '4', MAX_FILE_BYTES: String(1 << 20) } });
  owner = await registerUser(s.api);
  // An administrator, so that admin-only routes validate their input too instead of answering 403 first.
  await s.c.db('users').where({ id: owner.id }).update({ role: 'admin' });
  [key, rotated] = await Promise.all([createKey(s.api, owner.token), createKey(s.api, owner.token, { label: 'rotated' })]);
  jobId = (await encrypt(s.api, owner.token, key.fingerprint, [{ name: 'a.txt', data: Buffer.from('hello') }])).job_id;
  const hook = (await s.api('POST', '/webhooks', { token: owner.token, body: { url: 'http://127.0.0.1:9/hook' } })).body;
  webhook = { id: hook.webhook_id, delivery: (await s.api('POST', `/webhooks/${hook.webhook_id}/test`, { token: owner.token })).body.delivery_id };
  doc = (await s.api('GET', '/openapi.json')).body;
}, 60_000);
afterAll(async () => {
  await s?.stop();
});

const TIMEOUT_MS = 10_000;
const NUL = '\u0000';
/** Other control characters: C0, ESC, DEL. */
const OTHERS = ['\u0001', '\u001b', '\u007f'];
/** Ill-formed UTF-16: lone surrogates (JSON can carry them as \\ud800; Postgres json/jsonb refuses them). */
const LONE_SURROGATES = ['\ud800', '\udc00'];

interface Sent {
  method: string;
  path: string;
  token?: string;
  json?: unknown;
  form?: FormData;
  raw?: { body: Buffer; type: string };
}
interface Answer {
  status: number;
  type: string;
  body: any;
}

async function send(req: Sent): Promise<Answer> {
  const headers: Record<string, string> = {};
  if (req.token) headers.authorization = `Bearer ${req.token}`;
  let body: RequestInit['body'];
  if (req.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(req.json);
  } else if (req.form) body = req.form;
  else if (req.raw) {
    headers['content-type'] = req.raw.type;
    body = req.raw.body;
  }
  const res = await fetch(s.url + req.path, { method: req.method, headers, body, signal: AbortSignal.timeout(TIMEOUT_MS) });
  const type = res.headers.get('content-type') ?? '';
  const text = Buffer.from(await res.arrayBuffer()).toString('utf8');
  let parsed: unknown = text;
  if (type.includes('json')) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  return { status: res.status, type, body: parsed };
}

/** encodeURIComponent, except that a lone surrogate goes out as the (invalid) UTF-8 bytes of its code unit. */
const encodeSegment = (v: string) =>
  v.replace(/[\ud800-\udfff]|[^\ud800-\udfff]+/g, (part) => {
    if (part.length === 1 && /[\ud800-\udfff]/.test(part)) {
      const u = part.charCodeAt(0);
      return [0xe0 | (u >> 12), 0x80 | ((u >> 6) & 0x3f), 0x80 | (u & 0x3f)].map((b) => `%${b.toString(16).toUpperCase()}`).join('');
    }
    return encodeURIComponent(part);
  });

/** Runs `tasks` with at most `limit` in flight. */
async function pool<T>(tasks: (() => Promise<T>)[], limit: number): Promise<T[]> {
  const out: T[] = new Array(tasks.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, tasks.length) }, async () => {
      while (next < tasks.length) {
        const i = next++;
        out[i] = await tasks[i]();
      }
    }),
  );
  return out;
}

const resolve = (schema: Json | undefined): Json => (schema?.$ref ? doc.components.schemas[String(schema.$ref).split('/').pop()!] : (schema ?? {}));
const variantsOf = (schema: Json): Json[] => [schema, ...((schema.anyOf ?? schema.oneOf ?? []) as Json[]).map(resolve)];
/** Bytes, where NUL is content: a binary string, or a repeatable field of them (a form's binary parts). */
const isBinary = (s: Json): boolean =>
  (s.type === 'string' && (s.contentMediaType === 'application/octet-stream' || s.format === 'binary')) ||
  (s.type === 'array' && isBinary(resolve(s.items as Json)));
/** Form fields read as bytes whether sent as text or as a file part (a key, detached signatures): NUL is content there. */
const BINARY_PARTS = new Set(routes.flatMap((r) => (r.multipart?.binaryFields ?? []).map((f) => `${r.method.toUpperCase()} ${r.path} ${f}`)));
/** Top-level properties of a body schema, and of each variant of a union of objects. */
const bodyVariants = (schema: Json): Json[] =>
  schema.properties ? [schema] : ((schema.anyOf ?? schema.oneOf ?? []) as Json[]).map(resolve).filter((v) => v.properties);
const patternOf = (s: Json): RegExp | undefined => {
  const p = variantsOf(s).find((v) => typeof v.pattern === 'string')?.pattern;
  return p ? new RegExp(p, 'u') : undefined;
};

/** A plausible value for a field: by name (these need real ids, keys and secrets), else from its schema. */
function sample(name: string, schema: Json, ctx: { path: string; password: string }): unknown {
  const byName: Record<string, unknown> = {
    fingerprint: ctx.path.startsWith('/keys/{fingerprint}') ? rotated.fingerprint : key.fingerprint,
    job_id: jobId,
    key_id: key.lineage_id,
    webhook_id: webhook.id,
    delivery_id: webhook.delivery,
    // Ids of resources the walk does not create: well-formed, so the NUL-bearing field is what is refused.
    share_id: randomUUID(),
    passkey_id: randomUUID(),
    user_id: randomUUID(),
    source_user_id: randomUUID(),
    url: 'http://127.0.0.1:9/hook',
    n: 0,
    email: `someone_${randomBytes(4).toString('hex')}@example.test`,
    username: `u_${randomBytes(4).toString('hex')}`,
    identifier: owner.username,
    password: ctx.password,
    current_password: ctx.password,
    new_password: 'a new password 123',
    passphrase: PASSPHRASE,
    current_passphrase: PASSPHRASE,
    new_passphrase: PASSPHRASE,
    token: 'x'.repeat(43),
    label: 'hostile-text',
    environment: 'staging',
    env: 'staging',
    name: 'Ann Example',
    subject: 'Hello',
    message: 'A message',
    company_name: 'Acme',
  };
  if (name in byName) return byName[name];
  const v = variantsOf(schema).find((x) => x.type !== undefined) ?? schema;
  if (v.default !== undefined) return v.default;
  if (Array.isArray(v.enum)) return v.enum[0];
  const type = Array.isArray(v.type) ? v.type.find((t: string) => t !== 'null') : v.type;
  if (type === 'integer' || type === 'number') return v.minimum ?? 1;
  if (type === 'boolean') return false;
  if (v.format === 'uuid') return randomUUID();
  return 'x'.repeat(Math.max(v.minLength ?? 1, 5));
}

/** The hostile values for a field: the short one, and one long enough for the field's minLength. */
function hostile(char: string, schema: Json): string[] {
  const short = `a${char}b`;
  const min = Math.max(0, ...variantsOf(schema).map((v) => v.minLength ?? 0));
  return min > short.length ? [short, short + 'x'.repeat(min - short.length)] : [short];
}

interface Case {
  label: string;
  where: Where;
  field: string;
  value: string;
  schema: Json;
  req: () => Promise<Sent>;
}

/** Routes whose successful answer would end the caller's session or account: each case gets its own fresh user. */
const OWN_USER = new Set(['POST /profile/change-password', 'POST /profile/delete-account', 'POST /partners/rotate-api-key']);
let fresh = 0;
async function userFor(route: string) {
  if (!OWN_USER.has(route)) return { token: owner.token, password: owner.password };
  const n = `${Date.now().toString(36)}${(fresh++).toString(36)}`;
  const password = 'correct horse battery';
  const made = await accounts.register(s.c, { username: `own_${n}`, email: `own_${n}@example.test`, password }, { ip: '127.0.0.1', requestId: 'hostile-text' });
  return { token: made.session.token, password };
}

/** Route-specific base bodies where the schema alone cannot say (one of fingerprint and public_key). */
function adjustBody(route: string, field: string, body: Record<string, unknown>) {
  if (route === 'POST /keys/encrypt') {
    if (field === 'public_key') delete body.fingerprint;
    else if (field !== 'fingerprint') body.fingerprint ??= key.fingerprint;
  }
  return body;
}

function casesFor(path: string, method: string, op: Json, chars: string[]): Case[] {
  const token = (kind: 'jwt' | 'apiKey') => (kind === 'apiKey' ? owner.apiKey : owner.token);
  const route = `${method.toUpperCase()} ${path}`;
  const params = (op.parameters ?? []) as Json[];
  const isPublic = !(op.security ?? []).length;
  const sessionOnly = String(op.description ?? '').includes('API keys are refused');
  const out: Case[] = [];

  const build = async (mutate: { where: Where; field: string; value: string }, opts: { media?: string; auth?: 'jwt' | 'apiKey' } = {}): Promise<Sent> => {
    const user = await userFor(route);
    const ctx = { path, password: user.password };
    let url = path;
    for (const p of params.filter((x) => x.in === 'path')) {
      const v = mutate.where === 'params' && mutate.field === p.name ? mutate.value : String(sample(p.name, resolve(p.schema), ctx));
      url = url.replace(`{${p.name}}`, encodeSegment(v));
    }
    const query = new URLSearchParams();
    for (const p of params.filter((x) => x.in === 'query')) {
      if (mutate.where === 'query' && mutate.field === p.name) query.set(p.name, mutate.value);
      else if (p.required) query.set(p.name, String(sample(p.name, resolve(p.schema), ctx)));
    }
    if (mutate.where === 'query' && !params.some((p) => p.in === 'query' && p.name === mutate.field)) query.set(mutate.field, mutate.value);
    if ([...query].length) url += `?${query.toString()}`;
    const sent: Sent = { method: method.toUpperCase(), path: url };
    const auth = isPublic ? undefined : (opts.auth ?? 'jwt');
    sent.token = auth === 'apiKey' ? token('apiKey') : OWN_USER.has(route) ? user.token : auth && token(auth);
    const content = op.requestBody?.content ?? {};
    const media = opts.media ?? (content['application/json'] ? 'application/json' : Object.keys(content)[0]);
    if (media) {
      const variants = bodyVariants(resolve(content[media].schema));
      const schema = variants.find((v) => mutate.where === 'body' && mutate.field in v.properties) ?? variants[0] ?? {};
      const props = (schema.properties ?? {}) as Record<string, Json>;
      const required = new Set<string>(schema.required ?? []);
      const body: Record<string, unknown> = {};
      for (const [name, prop] of Object.entries(props)) {
        if (name === 'files' || (!required.has(name) && !(mutate.where === 'body' && mutate.field === name))) continue;
        body[name] = sample(name, resolve(prop), ctx);
      }
      if (route === 'POST /keys/{fingerprint}/rotate') Object.assign(body, { current_passphrase: PASSPHRASE, new_passphrase: PASSPHRASE });
      if (mutate.where === 'body') body[mutate.field] = mutate.value;
      adjustBody(route, mutate.where === 'body' ? mutate.field : '', body);
      if (media === 'multipart/form-data') {
        const form = new FormData();
        for (const [k, v] of Object.entries(body)) form.append(k, String(v));
        if (props.files) form.append('files', new File([Buffer.from('plain text\n')], 'input.txt'));
        sent.form = form;
      } else sent.json = body;
    }
    return sent;
  };

  const fields: { where: Where; name: string; schema: Json; media?: string }[] = [];
  for (const p of params)
    if (p.in === 'path' || p.in === 'query') fields.push({ where: p.in === 'path' ? 'params' : 'query', name: p.name, schema: resolve(p.schema) });
  // A query parameter the route does not declare is read (and must be refused with NUL) all the same.
  fields.push({ where: 'query', name: 'undeclared', schema: {} });
  for (const [media, content] of Object.entries((op.requestBody?.content ?? {}) as Record<string, Json>)) {
    const seen = new Set<string>();
    for (const schema of bodyVariants(resolve(content.schema))) {
      for (const [name, prop] of Object.entries((schema.properties ?? {}) as Record<string, Json>)) {
        const p = resolve(prop);
        // Every property, text or not (text where a number is due is hostile too); uploads excepted.
        if (seen.has(name) || variantsOf(p).every(isBinary)) continue;
        if (media === 'multipart/form-data' && BINARY_PARTS.has(`${route} ${name}`)) continue;
        seen.add(name);
        fields.push({ where: 'body', name, schema: p, media });
      }
    }
  }
  for (const f of fields) {
    // An undeclared parameter is ignored unless it holds NUL: other values would make a valid request.
    for (const char of f.name === 'undeclared' ? chars.filter((c) => c === NUL) : chars) {
      for (const value of hostile(char, f.schema)) {
        const tag = `${route}${f.media ? ` [${f.media}]` : ''} ${f.where}.${f.name}=${JSON.stringify(value)}`;
        out.push({
          label: tag,
          where: f.where,
          field: f.name,
          value,
          schema: f.schema,
          req: () => build({ where: f.where, field: f.name, value }, { media: f.media }),
        });
        // The same through a partner API key, where the route takes one.
        if (char === NUL && !isPublic && !sessionOnly && !OWN_USER.has(route)) {
          out.push({
            label: `${tag} (API key)`,
            where: f.where,
            field: f.name,
            value,
            schema: f.schema,
            req: () => build({ where: f.where, field: f.name, value }, { media: f.media, auth: 'apiKey' }),
          });
        }
      }
    }
  }
  return out;
}

/** What is wrong with an answer to a hostile value; undefined when it is right. */
function judge(c: Pick<Case, 'where' | 'field' | 'value' | 'schema'>, a: Answer): string | undefined {
  if (a.status >= 500) return `answered ${a.status}: ${JSON.stringify(a.body)}`;
  if (a.status >= 400 && !a.type.startsWith('application/problem+json')) return `answered ${a.status} as ${a.type}, not problem+json`;
  if (c.value.includes(NUL)) {
    if (a.status !== 422 || a.body?.code !== 'validation_failed') return `NUL: expected 422 validation_failed, got ${a.status} ${JSON.stringify(a.body)}`;
    const paths = ((a.body.errors ?? []) as { path: string }[]).map((e) => e.path);
    if (!paths.includes(`${c.where}.${c.field}`)) return `NUL: errors name ${JSON.stringify(paths)}, not ${c.where}.${c.field}`;
    return undefined;
  }
  const pattern = patternOf(c.schema);
  if (pattern && !pattern.test(c.value) && (a.status < 400 || a.status >= 500))
    return `the documented pattern ${pattern} refuses the value, but the answer is ${a.status}`;
  return undefined;
}

describe('hostile text in every request part', () => {
  const operations = () =>
    Object.entries(doc.paths as Json).flatMap(([path, item]) => Object.entries(item as Json).map(([method, op]) => ({ path, method, op: op as Json })));

  /** Sends every case built from `chars`, 6 at a time; returns the cases and what went wrong. */
  async function walk(chars: string[]) {
    const cases = operations().flatMap(({ path, method, op }) => casesFor(path, method, op, chars));
    const started = Date.now();
    const problems = (
      await pool(
        cases.map((c) => async () => {
          try {
            return { c, problem: judge(c, await send(await c.req())) };
          } catch (err) {
            return { c, problem: `no answer: ${(err as Error).name} ${(err as Error).message}` };
          }
        }),
        6,
      )
    )
      .filter((r) => r.problem)
      .map((r) => `${r.c.label}: ${r.problem}`);
    return { cases, problems, ms: Date.now() - started };
  }

  it('walks every route of the OpenAPI document: never 5xx, never a hang, 4xx as problem+json, NUL refused with 422 naming the field', async () => {
    const ops = operations();
    expect(ops.length).toBeGreaterThan(25);
    const { cases, problems, ms } = await walk([NUL, ...OTHERS]);
    // Every operation has cases, and every declared parameter and body property of it.
    const covered = new Set(cases.map((c) => `${c.label.split(' ').slice(0, 2).join(' ')} ${c.where}.${c.field}`));
    for (const { path, method, op } of ops) {
      const route = `${method.toUpperCase()} ${path}`;
      expect(covered.has(`${route} query.undeclared`), route).toBe(true);
      // Header parameters (Prefer on uploads) are read by the job replies, not walked here.
      for (const p of ((op.parameters ?? []) as Json[]).filter((x) => x.in !== 'header'))
        expect(covered.has(`${route} ${p.in === 'path' ? 'params' : 'query'}.${p.name}`), `${route} ${p.name}`).toBe(true);
      for (const content of Object.values((op.requestBody?.content ?? {}) as Record<string, Json>)) {
        for (const v of bodyVariants(resolve(content.schema))) {
          for (const [name, prop] of Object.entries(v.properties as Record<string, Json>)) {
            if (!variantsOf(resolve(prop)).every(isBinary)) expect(covered.has(`${route} body.${name}`), `${route} ${name}`).toBe(true);
          }
        }
      }
    }
    expect(problems).toEqual([]);
    console.log(`hostile text: ${cases.length} requests over ${ops.length} operations in ${ms} ms`);
    expect(cases.length).toBeGreaterThan(300);
    expect(ms).toBeLessThan(25_000);
  }, 40_000);

  it('never answers 5xx to lone surrogates (ill-formed UTF-16) in any field', async () => {
    // Known failure at the time of writing: a lone surrogate in a JSON string passes validation and
    // reaches a jsonb column (audit_logs.details, jobs.request), which Postgres refuses (22P02 "Unicode
    // low surrogate must follow a high surrogate") → 500. Found for POST /keys label and
    // POST /keys/generate-key label (JSON), and name or label of an RSA generate-key (the job's request).
    // In text columns the driver writes U+FFFD instead. The fix belongs where NUL is refused (api/route.ts
    // nulStrings: refuse ill-formed strings too) or in text() (api/schemas/common.ts).
    const { problems, ms } = await walk(LONE_SURROGATES);
    for (const field of ['label', 'name']) {
      const json = { label: 'rsa', name: 'Ann', email: 'ann@example.test', passphrase: PASSPHRASE, algorithm: 'rsa3072', [field]: 'a\ud800b' };
      const a = await send({ method: 'POST', path: '/keys/generate-key', token: owner.token, json });
      const problem = judge({ where: 'body', field, value: json[field], schema: {} }, a);
      if (problem) problems.push(`POST /keys/generate-key [application/json, rsa3072] body.${field}="a\\ud800b": ${problem}`);
    }
    expect(problems).toEqual([]);
    expect(ms).toBeLessThan(20_000);
  }, 30_000);

  const nul = (where: Where, field: string) => ({ where, field, value: `a${NUL}b`, schema: {} });
  const expectNul = async (where: Where, field: string, req: Sent) => {
    const a = await send(req);
    expect(judge(nul(where, field), a), JSON.stringify(a.body)).toBeUndefined();
    return a;
  };

  it('refuses the known cases with 422 validation_failed', async () => {
    await expectNul('query', 'label', { method: 'GET', path: '/keys/list?label=%00', token: owner.token });
    await expectNul('query', 'label', { method: 'GET', path: '/keys/list?label=a%00b', token: owner.apiKey });
    await expectNul('body', 'identifier', { method: 'POST', path: '/auth/login', json: { identifier: `a${NUL}b`, password: 'whatever it is' } });
    for (const field of ['name', 'email', 'subject', 'message']) {
      const json: Record<string, string> = { name: 'Ann', email: 'ann@example.test', subject: 'Hi', message: 'Hello', [field]: `a${NUL}b` };
      await expectNul('body', field, { method: 'POST', path: '/auth/contact', json });
    }
    await expectNul('body', 'company_name', {
      method: 'POST',
      path: '/partners/register',
      json: { username: 'nul_company', email: 'nul@example.test', password: 'correct horse battery', company_name: `a${NUL}b` },
    });
    await expectNul('body', 'label', { method: 'POST', path: '/keys', token: owner.apiKey, json: { label: `a${NUL}b`, env: 'dev' } });
    for (const field of ['label', 'name']) {
      const fields: Record<string, string> = { label: 'x', name: 'Ann', email: 'ann@example.test', passphrase: PASSPHRASE, [field]: `a${NUL}b` };
      await expectNul('body', field, { method: 'POST', path: '/keys/generate-key', token: owner.token, json: fields });
      const form = new FormData();
      for (const [k, v] of Object.entries(fields)) form.append(k, v);
      await expectNul('body', field, { method: 'POST', path: '/keys/generate-key', token: owner.token, form });
    }
    await expectNul('body', 'company_name', { method: 'PUT', path: '/profile/update', token: owner.token, json: { company_name: `a${NUL}b` } });
    await expectNul('params', 'job_id', { method: 'GET', path: '/jobs/%00', token: owner.token });
    await expectNul('params', 'n', { method: 'GET', path: `/jobs/${jobId}/files/%00`, token: owner.token });
    await expectNul('params', 'fingerprint', { method: 'GET', path: '/keys/%00/rotation-history', token: owner.token });
    // Other control characters in single-line text: refused by text().
    for (const c of OTHERS.slice(0, 3)) {
      const a = await send({ method: 'PUT', path: '/profile/update', token: owner.token, json: { company_name: `a${c}b` } });
      expect(a.status, JSON.stringify(a.body)).toBe(422);
      expect(a.body.errors.map((e: { path: string }) => e.path)).toEqual(['body.company_name']);
    }
    const me = await send({ method: 'GET', path: '/auth/me', token: owner.token });
    expect(me.body.company_name).not.toMatch(/\p{Cc}/u);
  });

  it('refuses NUL in a text field sent as a file part (public_key), and in a field sent before the files of a job', async () => {
    const form = new FormData();
    form.append('public_key', new File([Buffer.from(`-----BEGIN PGP PUBLIC KEY BLOCK-----\n${NUL}\n`)], 'key.asc'));
    form.append('files', new File([Buffer.from('x')], 'a.txt'));
    await expectNul('body', 'public_key', { method: 'POST', path: '/keys/encrypt', token: owner.token, form });
    const dec = new FormData();
    dec.append('fingerprint', key.fingerprint);
    dec.append('passphrase', `${PASSPHRASE}${NUL}`);
    dec.append('files', new File([Buffer.from('x')], 'a.gpg'));
    await expectNul('body', 'passphrase', { method: 'POST', path: '/keys/decrypt', token: owner.token, form: dec });
  });

  it('keeps control characters out of stored file names: NUL and others in an upload’s file name', async () => {
    const boundary = `b${randomBytes(8).toString('hex')}`;
    const multipart = (disposition: string) =>
      Buffer.concat([
        Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="fingerprint"\r\n\r\n${key.fingerprint}\r\n`),
        Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files"; ${disposition}\r\nContent-Type: text/plain\r\n\r\n`),
        Buffer.from('plain text\n'),
        Buffer.from(`\r\n--${boundary}--\r\n`),
      ]);
    // Raw control characters in a part's header are malformed (busboy refuses: 4xx); percent-encoded ones
    // (RFC 5987 filename*) arrive decoded and are stripped from the stored name.
    const dispositions: [string, string | null][] = [
      ['filename="re\u0000port.txt"', null],
      ['filename="\u0000"', null],
      ['filename="a\u0001\u001b\u007fb.txt"', null],
      [`filename*=UTF-8''re%00po%1Brt%7F.txt`, 'report.txt.gpg'],
      [`filename*=UTF-8''%00`, 'file-1.gpg'],
      [`filename*=UTF-8''%00%01..`, 'file-1.gpg'],
    ];
    for (const [d, stored] of dispositions) {
      const a = await send({
        method: 'POST',
        path: '/keys/encrypt',
        token: owner.token,
        raw: { body: multipart(d), type: `multipart/form-data; boundary=${boundary}` },
      });
      expect(judge({ where: 'body', field: 'files', value: 'file name', schema: {} }, a), `${d}: ${JSON.stringify(a.body)}`).toBeUndefined();
      expect(a.status >= 400, `${d}: ${a.status}`).toBe(stored === null);
      if (a.status >= 400) continue;
      let job = a.body;
      for (let i = 0; i < 10 && job.state !== 'completed' && job.state !== 'failed'; i++)
        job = (await s.api('GET', `/jobs/${job.job_id}`, { token: owner.token, headers: { prefer: 'wait=10' } })).body;
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      const name: string = job.result.files[0].name;
      expect(name).toBe(stored);
      const file = await fetch(`${s.url}/jobs/${job.job_id}/files/0`, {
        headers: { authorization: `Bearer ${owner.token}` },
        signal: AbortSignal.timeout(TIMEOUT_MS),
      });
      expect(file.status).toBe(200);
      // eslint-disable-next-line no-control-regex -- the assertion is that no control character reaches the header
      expect(file.headers.get('content-disposition')).not.toMatch(/[\u0000-\u001f\u007f]/);
      await file.arrayBuffer();
    }
  });

  it('answers malformed encodings, repeated parameters, hostile keys and invalid UTF-8 without 5xx', async () => {
    const reqs: Sent[] = [
      { method: 'GET', path: '/jobs/%E0%A4%A', token: owner.token },
      { method: 'GET', path: '/keys/list?label=%E0%A4%A', token: owner.token },
      { method: 'GET', path: '/keys/list?label=a&label=b', token: owner.token },
      { method: 'GET', path: '/keys/list?a%00b=1', token: owner.token },
      { method: 'PUT', path: '/profile/update', token: owner.token, json: { [`a${NUL}b`]: 'x' } },
      {
        method: 'POST',
        path: '/keys',
        token: owner.token,
        raw: { body: Buffer.concat([Buffer.from('{"label":"'), Buffer.from([0xff, 0xfe, 0xc0]), Buffer.from('\\u0000"}')]), type: 'application/json' },
      },
      {
        method: 'POST',
        path: '/keys',
        token: owner.token,
        raw: { body: Buffer.from([0x7b, 0x22, 0x6c, 0x61, 0x62, 0x65, 0x6c, 0x22, 0x3a, 0x22, 0x61, 0x00, 0x22, 0x7d]), type: 'application/json' },
      },
      { method: 'POST', path: '/auth/login', raw: { body: Buffer.from('{"identifier":"a\\u0000b","password":"x"}'), type: 'application/json' } },
    ];
    for (const req of reqs) {
      const a = await send(req);
      const what = `${req.method} ${req.path}: ${a.status} ${JSON.stringify(a.body)}`;
      expect(a.status, what).toBeLessThan(500);
      if (a.status >= 400) expect(a.type, what).toMatch(/^application\/problem\+json/);
    }
    // Malformed percent-encoding: the path parameter is refused; in the query it is taken literally (a valid label).
    expect((await send(reqs[0])).status).toBe(422);
    expect((await send(reqs[1])).status).toBe(200);
    // Repeated parameter: not a string, refused.
    expect((await send(reqs[2])).status).toBe(422);
    // A parameter or body field the route does not name is refused, its name in the error.
    expect((await send(reqs[3])).body).toMatchObject({ code: 'validation_failed', errors: [{ path: 'query.a\u0000b' }] });
    expect((await send(reqs[4])).status).toBe(422);
    // Invalid UTF-8 in JSON is decoded with replacement characters: the NUL after it is still refused.
    expect((await send(reqs[5])).body).toMatchObject({ code: 'validation_failed', errors: [{ path: 'body.label' }] });
    // A raw NUL byte inside a JSON string is not JSON.
    expect((await send(reqs[6])).body).toMatchObject({ status: 422, code: 'malformed_body' });
    expect((await send(reqs[7])).body).toMatchObject({ code: 'validation_failed', errors: [{ path: 'body.identifier' }] });
  });

  it('answers what is not parsable HTTP with problem+json too: an oversized request line, garbage bytes', async () => {
    const long = await send({ method: 'GET', path: `/keys/${'a'.repeat(100_000)}`, token: owner.token });
    expect([long.status, long.type]).toEqual([431, expect.stringMatching(/^application\/problem\+json/)]);
    expect(long.body).toMatchObject({ status: 431, code: 'headers_too_large' });
    const { port, hostname } = new URL(s.url);
    const raw = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(port), hostname, () => socket.end('\u0000\u0001 NOT HTTP\r\n\r\n'));
      let got = '';
      socket
        .on('data', (d) => (got += d.toString('utf8')))
        .on('end', () => resolve(got))
        .on('error', reject);
    });
    expect(raw).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(raw).toMatch(/content-type: application\/problem\+json/i);
    expect(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4))).toMatchObject({ status: 400, code: 'malformed_request' });
  });

  it('refuses deeply nested bodies with 422 (the check used to run out of stack: 500)', async () => {
    const deep = (n: number) => Buffer.from('['.repeat(n) + ']'.repeat(n));
    for (const n of [33, 100_000]) {
      const a = await send({ method: 'POST', path: `/keys/${key.fingerprint}/rotate`, token: owner.token, raw: { body: deep(n), type: 'application/json' } });
      expect(a.status, `${n} levels`).toBe(422);
      expect(a.body).toMatchObject({ code: 'validation_failed', errors: [{ message: expect.stringContaining('nested too deeply') }] });
    }
    // At the limit the value reaches the schema, which refuses it for what it is (not an object).
    const atLimit = await send({
      method: 'POST',
      path: `/keys/${key.fingerprint}/rotate`,
      token: owner.token,
      raw: { body: deep(32), type: 'application/json' },
    });
    expect(atLimit.status).toBe(422);
    expect(JSON.stringify(atLimit.body)).not.toContain('nested too deeply');
  });
});
