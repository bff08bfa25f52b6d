import { describe, expect, it } from 'vitest';
import { compileErrors, validate } from '@readme/openapi-parser';
import { routes } from '../../api/app';
import { openApiDocument } from '../../api/route';

/**
 * The OpenAPI document is generated from the route declarations; these tests hold it to what the API
 * accepts: a valid OpenAPI 3.1 document (checked by an independent, maintained validator), every route
 * present, path parameters required, uploads declared as binary files, and patterns a client can use.
 */
type Json = Record<string, any>;
const doc = openApiDocument(routes, { title: 'test', version: '1.0.0', serverUrl: 'http://localhost/api/v1' }) as unknown as Json;
const clone = () => JSON.parse(JSON.stringify(doc)) as Json;
const operations = () =>
  Object.entries(doc.paths as Json).flatMap(([path, item]) =>
    Object.entries(item as Json)
      .filter(([m]) => ['get', 'put', 'post', 'delete', 'patch'].includes(m))
      .map(([method, op]) => ({ path, method, op: op as Json })),
  );
const resolve = (schema: Json): Json => (schema?.$ref ? doc.components.schemas[schema.$ref.split('/').pop()] : schema);
const isBinary = (s: Json) => s?.type === 'string' && (s.contentMediaType === 'application/octet-stream' || s.format === 'binary');

describe('OpenAPI document', () => {
  it('is a valid OpenAPI 3.1 document', async () => {
    expect(doc.openapi).toMatch(/^3\.1\./);
    const result = await validate(clone() as Parameters<typeof validate>[0], { validate: { errors: { colorize: false } } });
    expect(result.valid ? '' : compileErrors(result)).toBe('');
    expect(result.warnings).toEqual([]);
  });

  it('lists every route, once, with its method', () => {
    const listed = operations().map((o) => `${o.method.toUpperCase()} ${o.path}`);
    const declared = routes.map((r) => `${r.method.toUpperCase()} ${r.path}`);
    expect(new Set(declared).size).toBe(declared.length);
    expect(listed.sort()).toEqual([...declared].sort());
  });

  it('declares every path template parameter as a required path parameter, never null', () => {
    for (const { path, method, op } of operations()) {
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
      const params = ((op.parameters ?? []) as Json[]).filter((p) => p.in === 'path');
      expect(params.map((p) => p.name).sort(), `${method} ${path}`).toEqual([...names].sort());
      for (const p of params) {
        expect(p.required, `${method} ${path} {${p.name}}`).toBe(true);
      }
      // A value in a URL (path or query) is text; it is never JSON null.
      for (const p of (op.parameters ?? []) as Json[]) {
        expect(JSON.stringify(p.schema), `${method} ${path} ${p.in} ${p.name}`).not.toContain('"null"');
      }
    }
    const n = (doc.paths['/jobs/{job_id}/files/{n}'].get.parameters as Json[]).find((p) => p.name === 'n')!;
    expect(n).toMatchObject({ in: 'path', required: true, schema: { type: 'integer', minimum: 0 } });
  });

  it('declares the uploads of encrypt and decrypt: `files`, an array of binary files, required; public_key as text or a file', () => {
    for (const path of ['/keys/encrypt', '/keys/decrypt']) {
      const body = doc.paths[path].post.requestBody;
      expect(body.required, path).toBe(true);
      const media = body.content['multipart/form-data'];
      const schema = resolve(media.schema);
      expect(schema.required, path).toContain('files');
      const files = schema.properties.files;
      expect(files.type, path).toBe('array');
      expect(files.minItems).toBe(1);
      expect(isBinary(files.items), JSON.stringify(files.items)).toBe(true);
      expect(files.items.contentMediaType).toBe('application/octet-stream');
      expect(media.encoding?.files?.contentType).toBeTruthy();
    }
    const encrypt = resolve(doc.paths['/keys/encrypt'].post.requestBody.content['multipart/form-data'].schema);
    const publicKey = encrypt.properties.public_key as Json;
    const variants = (publicKey.anyOf ?? publicKey.oneOf ?? []) as Json[];
    expect(variants.some(isBinary), JSON.stringify(publicKey)).toBe(true);
    expect(
      variants.some((v) => v.type === 'string' && !isBinary(v)),
      JSON.stringify(publicKey),
    ).toBe(true);
  });

  it('derives uploads from the route declaration: every route with files declares them, the others do not', () => {
    for (const def of routes) {
      const content = doc.paths[def.path][def.method].requestBody?.content ?? {};
      const multipart = content['multipart/form-data'];
      expect(Boolean(multipart), `${def.method} ${def.path}`).toBe(Boolean(def.multipart));
      if (!def.multipart) continue;
      const props = resolve(multipart.schema).properties ?? {};
      expect(Boolean(props.files), `${def.method} ${def.path}`).toBe(Boolean(def.multipart.files));
      for (const field of def.multipart.textFileFields ?? []) {
        expect(((props[field]?.anyOf ?? []) as Json[]).some(isBinary), `${def.path} ${field}`).toBe(true);
      }
      // A form without files is accepted as JSON with the same fields too (mountRoutes reads JSON when sent).
      if (!def.multipart.files) expect(content['application/json']?.schema, def.path).toEqual(multipart.schema);
    }
  });

  it('marks a request body required when the route refuses an empty one', () => {
    for (const def of routes) {
      const body = doc.paths[def.path][def.method].requestBody;
      if (!def.body) continue;
      const emptyOk = !def.multipart?.files && def.body.safeParse({}).success;
      expect(Boolean(body.required), `${def.method} ${def.path}`).toBe(!emptyOk);
    }
  });

  it('has patterns that are ECMAScript regular expressions matching what the service accepts', () => {
    const patterns: string[] = [];
    const walk = (v: unknown) => {
      if (Array.isArray(v)) v.forEach(walk);
      else if (v && typeof v === 'object') {
        for (const [k, x] of Object.entries(v)) {
          if (k === 'pattern' && typeof x === 'string') patterns.push(x);
          else walk(x);
        }
      }
    };
    walk(doc);
    expect(patterns.length).toBeGreaterThan(0);
    for (const p of patterns) {
      expect(p, 'no regex flags left in the pattern').not.toMatch(/(?<!\\)\/[dgimsuvy]+$/);
      expect(() => new RegExp(p, 'u'), p).not.toThrow();
    }
    const label = doc.paths['/keys'].post.requestBody.content['application/json'].schema.properties.label;
    const re = new RegExp(label.pattern, 'u');
    expect(re.test('Quarterly reports 2026')).toBe(true);
    expect(re.test('a\u0001b')).toBe(false);
  });

  /**
   * One spelling per field (docs/api-conventions.md, "Names"): identifiers are `<resource>_id`, a key's state is `status`,
   * a rotation interval is `rotation_interval_days`, a session is one `Session` object, lists are pages.
   * Third-party shapes keep their own names: WebAuthn options and credentials, and the event envelope.
   */
  it('names fields one way in every response: <resource>_id, status on keys, rotation_interval_days, sessions and pages', () => {
    const THIRD_PARTY = /^(Passkey(Creation|Request)Options|Passkey(Registration|Authentication)Credential|Event)$/;
    const KEY_SCHEMAS = /^(Key|KeyGeneration|ManagedApiKey.*|PartnerApiKeyStatus|SharedPublicKey|SharedApiKey)$/;
    const found: string[] = [];
    const lists: string[] = [];
    const seen = new Set<string>();
    const walk = (schema: Json | undefined, where: string, name: string) => {
      if (!schema || typeof schema !== 'object') return;
      if (schema.$ref) {
        const ref = schema.$ref.split('/').pop() as string;
        if (THIRD_PARTY.test(ref) || seen.has(`${where}>${ref}`)) return;
        seen.add(`${where}>${ref}`);
        return walk(doc.components.schemas[ref], `${where}>${ref}`, ref);
      }
      for (const k of ['anyOf', 'oneOf', 'allOf']) for (const v of (schema[k] ?? []) as Json[]) walk(v, where, name);
      if (schema.items) walk(schema.items, `${where}[]`, name);
      const props = (schema.properties ?? {}) as Json;
      if ('items' in props && !['page', 'page_size', 'total'].every((k) => k in props)) lists.push(where);
      for (const [prop, v] of Object.entries(props)) {
        const at = `${where}.${prop}`;
        if (prop === 'id' || prop === 'key_state' || prop === 'rotation_days' || prop === 'interval_days') found.push(at);
        if (prop === 'token' && name !== 'Session') found.push(at);
        if (prop === 'state' && KEY_SCHEMAS.test(name)) found.push(at);
        walk(v as Json, at, name);
      }
    };
    for (const { path, method, op } of operations()) {
      for (const [status, res] of Object.entries((op.responses ?? {}) as Json)) {
        for (const media of Object.values(((res as Json).content ?? {}) as Json)) walk((media as Json).schema, `${method.toUpperCase()} ${path} ${status}`, '');
      }
    }
    expect(found).toEqual([]);
    expect(lists).toEqual([]);
  });
});
