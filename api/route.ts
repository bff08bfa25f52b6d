import type { Router, RouterMiddleware } from '@koa/router';
import { z } from 'zod';
import { OpenAPIRegistry, OpenApiGeneratorV31, type RouteConfig, type ZodContentObject } from '@asteasolutions/zod-to-openapi';
import type { Container } from '../lib/container';
import type { Logger } from '../lib/logger';
import { AppError, invalidFields, type FieldError } from '../lib/errors';
import { fieldMessage } from './field-messages';
import { authenticate, requireRecentSignIn, requireScope } from './middleware/auth';
import type { Access, AppContext, AppState, AuthUser } from './context';
import type { Scope } from '../lib/auth/scopes';
import { requireAdmin } from './middleware/admin';
import { Problem } from './schemas/common';
import type { RequestMeta } from '../db/audit';
import { readMultipart } from './middleware/multipart';
import { requestMeta } from './middleware/request-context';
import { receiveUpload, type Upload } from './upload';

/**
 * One declaration per route: method, path, access, and the zod schemas that validate and type its
 * input and output. The same declaration mounts the Koa handler and feeds /api/v1/openapi.json, so the
 * document cannot drift from what the code accepts. Responses are parsed through their schema before
 * they leave, so a field the schema does not name (a hash, a sealed secret) is stripped.
 */

type AnyObject = z.ZodType<Record<string, unknown>>;
type Infer<S> = S extends z.ZodType ? z.infer<S> : undefined;

export interface Reply {
  status?: number;
  body?: unknown;
  headers?: Record<string, string>;
}

interface ResponseSpec {
  description: string;
  schema?: z.ZodType;
  /** Content type for non-JSON answers (file downloads, armored keys). */
  contentType?: string;
}

export interface HandlerInput<A extends Access, P, Q, B, C = unknown> {
  ctx: AppContext;
  c: Container;
  params: P;
  query: Q;
  body: B;
  user: A extends 'public' ? AuthUser | undefined : AuthUser;
  log: Logger;
  /** What audit rows need to know about the request. */
  meta: RequestMeta;
  /** Multipart routes with files: the uploads, stored as inputs of job `upload.id` (api/upload.ts). */
  upload: Upload;
  /**
   * The answer of the route's multipart `check` for this request: made before the files when the fields
   * sent ahead of them already form a valid body, else on the first call. Once per request either way, so
   * its lookup, audit row and spent rate-limit point happen once.
   */
  checked: () => Promise<C>;
  /**
   * The container to read with where a little lag is fine (lists, exports, analytics): its `db` is the
   * replica when lib/replica-reads.ts allows it for this caller, else `c` itself. Only reads go through
   * it; what may write (an audit row of a refused lookup) takes `c`.
   */
  reader: () => Promise<Container>;
}

/**
 * multipart/form-data: `body` validates the text fields. With `files`, uploaded files (form field
 * `files`, repeatable) stream into the blob store as the inputs of a job with id `upload.id`.
 */
export interface MultipartSpec<B = unknown, C = unknown> {
  description: string;
  files?: boolean;
  textFileFields?: string[];
  /** Small binary parts, repeatable (readMultipart's `binaryFields`): the handler finds them in `upload.parts`. */
  binaryFields?: string[];
  /**
   * The request's check on its fields (the key it names, a passphrase, a signer), run before any file is
   * stored when the fields sent ahead of the files (readMultipart's beforeFiles) form a valid body; its
   * answer reaches the handler through `checked`.
   */
  check?(body: B, input: { c: Container; user: AuthUser; meta: RequestMeta; parts: Record<string, Buffer[]> }): Promise<C>;
}

/** `when` sees the valid body and the caller (a change is judged against what the account already holds). */
export type RecentSignIn<B> = true | { when(body: B, user: AuthUser): boolean; description: string };

export interface RouteDef<A extends Access = Access, P = unknown, Q = unknown, B = unknown> {
  method: 'get' | 'post' | 'put' | 'patch' | 'delete';
  path: string;
  summary: string;
  tags: string[];
  access: A;
  /**
   * What a managed API key needs to call this route (access 'auth' only, where it is required). Sessions
   * and the partner key hold every scope; 'session' and 'admin' routes never take a managed key.
   */
  scope?: Scope;
  /**
   * Sudo mode: the route adds or renews a way into the account (or moves or deletes it), so a session
   * must have signed in recently (requireRecentSignIn). `when` marks only some requests by their valid
   * body (a profile update that changes the email), as `description` says in the OpenAPI document.
   */
  recentSignIn?: RecentSignIn<B>;
  params?: AnyObject;
  query?: AnyObject;
  body?: z.ZodType;
  multipart?: MultipartSpec;
  responses: Record<number, ResponseSpec>;
  handler(input: HandlerInput<A, P, Q, B>): Promise<Reply | void>;
}

/** Every route an API key can reach names its scope: leaving it out is a compile error, never an open door. */
type ScopeField<A extends Access> = A extends 'auth' ? { scope: Scope } : { scope?: never };

/** Declares a route; the generic parameters are inferred from the schemas. */
export function route<
  A extends Access,
  PS extends AnyObject | undefined = undefined,
  QS extends AnyObject | undefined = undefined,
  BS extends z.ZodType | undefined = undefined,
  C = undefined,
>(
  def: Omit<RouteDef<A>, 'params' | 'query' | 'body' | 'handler' | 'scope' | 'recentSignIn' | 'multipart'> &
    ScopeField<A> & {
      params?: PS;
      query?: QS;
      body?: BS;
      multipart?: MultipartSpec<Infer<BS>, C>;
      recentSignIn?: RecentSignIn<Infer<BS>>;
      handler(input: HandlerInput<A, Infer<PS>, Infer<QS>, Infer<BS>, C>): Promise<Reply | void>;
    },
): RouteDef {
  return { ...def, query: def.query && closed(def.query), body: def.body && closed(def.body) };
}

/**
 * One rule for every request: a field the route does not name is refused (422 `validation_failed`, the
 * field named), in JSON bodies, multipart text fields and query strings alike, never dropped in silence.
 * Plain objects at the top of a request schema are closed here (the OpenAPI document then says
 * `additionalProperties: false`); an object declared loose (z.looseObject: WebAuthn's browser JSON) stays open.
 */
function closed<S extends z.ZodType>(schema: S): S {
  if (schema instanceof z.ZodObject) return (schema._zod.def.catchall ? schema : schema.strict()) as unknown as S;
  if (schema instanceof z.ZodPipe)
    return schema.clone({ ...schema._zod.def, in: closed(schema._zod.def.in as z.ZodType), out: closed(schema._zod.def.out as z.ZodType) });
  if (schema instanceof z.ZodUnion) return schema.clone({ ...schema._zod.def, options: schema._zod.def.options.map((o) => closed(o as z.ZodType)) });
  return schema;
}

function issues(error: z.ZodError, where: string): FieldError[] {
  return error.issues.flatMap((i) =>
    i.code === 'unrecognized_keys'
      ? i.keys.map((k) => ({ path: [where, ...i.path.map(String), k].join('.'), message: 'is not a field of this request' }))
      : [{ path: [where, ...i.path.map(String)].join('.'), message: i.message }],
  );
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Deeper request values are refused: no request of this API nests beyond a few levels. */
const MAX_NESTING = 32;

/**
 * Strings Postgres cannot store are refused here, once for every route and request part: U+0000
 * (SQLSTATE 22021 in text) and lone UTF-16 surrogates (22P02 in jsonb; JSON can carry them as \ud800).
 * So are values nested deeper than MAX_NESTING, before this walk (or a schema's) runs out of stack.
 */
function unstorableStrings(value: unknown, path: string[], out: FieldError[]): FieldError[] {
  if (typeof value === 'string') {
    if (value.includes('\u0000')) out.push({ path: path.join('.'), message: 'must not contain the NUL character (U+0000)' });
    else if (LONE_SURROGATE.test(value)) out.push({ path: path.join('.'), message: 'must be well-formed Unicode (a lone surrogate was sent)' });
  } else if (value && typeof value === 'object' && path.length > MAX_NESTING) {
    out.push({ path: path.join('.'), message: `is nested too deeply (more than ${MAX_NESTING} levels)` });
  } else if (Array.isArray(value)) {
    value.forEach((v, i) => unstorableStrings(v, [...path, String(i)], out));
  } else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) unstorableStrings(v, [...path, k], out);
  }
  return out;
}

type RequestPart = 'params' | 'query' | 'body';

/** Refusals read as words (api/field-messages.ts), and the problem's detail names the first field refused. */
function parse<T>(schema: z.ZodType<T> | undefined, value: unknown, where: RequestPart): T {
  const unstorable = unstorableStrings(value, [where], []);
  if (unstorable.length) throw invalidFields(unstorable);
  if (!schema) return undefined as T;
  const result = schema.safeParse(value, { error: fieldMessage });
  if (!result.success) throw invalidFields(issues(result.error, where));
  return result.data;
}

/** What handlers of routes without uploads see as `upload`: nothing was sent. */
const noUpload: Upload = {
  id: '',
  dataKey: '',
  parts: {},
  streaming: false,
  begin() {},
  files: async () => [],
  stop() {},
};

/** A trailing slash never matters (SPEC writes `/keys/share/`): the router's optional trailing slash serves both spellings. */
const koaPath = (path: string) => path.replace(/\{(\w+)\}/g, ':$1').replace(/(.)\/$/, '$1');

/**
 * Whose writes a read must see (lib/replica-reads.ts): the session (a sign-in: its renewed tokens keep
 * their sign-in time), the partner key, or a managed API key. Ids only, never a credential.
 */
function principalOf(user: AuthUser): string {
  if (user.via === 'api_key') return `api_key:${user.apiKey?.id ?? user.id}`;
  if (user.via === 'partner_key') return `partner_key:${user.id}`;
  return `session:${user.id}:${(user.signedInAt?.getTime() ?? 0) / 1000}`;
}

export function mountRoutes(router: Router<AppState, { container: Container }>, routes: RouteDef[]): void {
  for (const def of routes) {
    const handler: RouterMiddleware<AppState, { container: Container }> = async (koaCtx) => {
      const ctx = koaCtx as unknown as AppContext;
      const c = ctx.container;
      if (def.access !== 'public' || ctx.get('authorization')) {
        const user = await authenticate(ctx, def.access);
        ctx.state.user = user;
        if (def.access === 'auth') await requireScope(ctx, def.scope);
      }
      if (def.access === 'admin') await requireAdmin(ctx, def.path);
      const params = parse(def.params, ctx.params, 'params');
      const query = parse(def.query, ctx.query, 'query');
      const user = ctx.state.user as AuthUser;
      const meta = requestMeta(ctx);
      let checking: Promise<unknown> | undefined;
      const check = (body: unknown, parts: Record<string, Buffer[]>) =>
        (checking ??= def.multipart?.check ? def.multipart.check(body, { c, user, meta, parts }) : Promise.resolve(undefined));
      let reading: Promise<Container> | undefined;
      let handedReplica = false;
      const reader = () =>
        (reading ??= c.reads.readerOf(c, user ? principalOf(user) : undefined).then((r) => {
          handedReplica = r !== c;
          return r;
        }));
      const run = async (body: unknown, upload: Upload = noUpload) => {
        if (def.recentSignIn === true || def.recentSignIn?.when(body, user)) await requireRecentSignIn(ctx);
        const input = { ctx, c, params, query, body, upload, user, log: ctx.state.log, meta, checked: () => check(body, upload.parts), reader };
        try {
          return await def.handler(input);
        } catch (err) {
          // A read the replica failed (lost, or a query cancelled by a conflict with its replay) runs again,
          // once, on the primary: never a 5xx for the replica. Only a GET: it wrote nothing to redo.
          if (!handedReplica || def.method !== 'get' || err instanceof AppError) throw err;
          c.reads.failed(err);
          return def.handler({ ...input, reader: () => Promise.resolve(c) });
        }
      };
      const answer = async (): Promise<Reply | void> => {
        if (def.multipart?.files && !ctx.is('json')) {
          const { textFileFields, binaryFields } = def.multipart;
          const early = def.multipart.check && def.body;
          return receiveUpload(
            ctx,
            c,
            {
              textFileFields,
              binaryFields,
              precheck:
                early &&
                (async (fields, parts) => {
                  const body = early.safeParse(fields);
                  if (body.success) await check(body.data, parts);
                }),
            },
            (fields, upload) => run(parse(def.body, fields, 'body'), upload),
          );
        }
        if (def.multipart && !ctx.is('json')) {
          const form = await readMultipart(ctx, {
            fileFields: [],
            textFileFields: def.multipart.textFileFields,
            binaryFields: def.multipart.binaryFields,
            maxFiles: 0,
            maxFileBytes: 0,
          });
          return run(parse(def.body, form.fields, 'body'), { ...noUpload, parts: form.parts });
        }
        return run(parse(def.body, ctx.request.body ?? {}, 'body'));
      };
      let reply: Reply | void;
      try {
        reply = await answer();
      } finally {
        // Before the answer leaves, so that the caller's next read already knows of the write.
        if (def.method !== 'get' && ctx.state.user && c.reads.configured) await c.reads.wrote(principalOf(ctx.state.user));
      }
      if (!reply) return; // the handler answered itself (streams)
      const status = reply.status ?? 200;
      for (const [k, v] of Object.entries(reply.headers ?? {})) ctx.set(k, v);
      ctx.status = status;
      const schema = def.responses[status]?.schema;
      ctx.body = schema ? schema.parse(reply.body) : reply.body;
    };
    router[def.method](koaPath(def.path), handler);
  }
}

/** OpenAPI 3.1 lets a non-OAuth scheme list the roles a call needs: an 'auth' route lists its scope. */
const security = (def: RouteDef) => (def.access === 'public' ? [] : [{ bearer: def.scope ? [def.scope] : [] }]);

function accessNote(def: RouteDef): string | undefined {
  const who =
    def.access === 'admin'
      ? 'Administrators only (a session or the partner key; managed API keys are refused).'
      : def.access === 'session'
        ? 'Needs a user session (JWT); API keys are refused.'
        : def.access === 'auth' && def.scope
          ? `A session, the partner key, or a managed API key with the scope \`${def.scope}\`.`
          : undefined;
  if (!def.recentSignIn) return who;
  const which = def.recentSignIn === true ? 'A session' : `${def.recentSignIn.description}, a session`;
  const sudo = `${which} must have signed in within RECENT_SIGN_IN_MINUTES (default 10), else 403 \`reauthentication_required\`: sign in again and retry.`;
  return who ? `${who} ${sudo}` : sudo;
}

/** An uploaded file in a multipart form (OpenAPI 3.1: contentMediaType; `format: binary` for 3.0-minded tools). */
const BinaryFile = { type: 'string', format: 'binary', contentMediaType: 'application/octet-stream' } as const;

/** RFC 7240 preferences a file job's submission honours (lib/jobs/job-records.ts preferWait, preferEarlyHints). */
const UploadPreferences = z.object({
  prefer: z
    .string()
    .optional()
    .describe(
      '`wait=N` (N ≤ 30): answer 200 with the finished job if it ends within N seconds of the upload. `early-hints`: once the job exists, while the files still upload, send `103 Early Hints` with `Link: </api/v1/jobs/{id}>; rel="monitor"` (never sent without it). Both may be given: `wait=2, early-hints`.',
    ),
});

type JsonSchema = Record<string, unknown> & { type?: unknown; properties?: Record<string, JsonSchema>; required?: string[]; $ref?: string };
type Operation = { requestBody?: { content: Record<string, { schema?: JsonSchema }> } };

/**
 * Multipart forms with uploads: `files` (repeatable, one or more binary files, sent after the text
 * fields so they are checked before the upload) and text-or-file fields, added to the form's schema.
 */
function describeUploads(schema: JsonSchema, components: Record<string, JsonSchema>, multipart: NonNullable<RouteDef['multipart']>): JsonSchema {
  const ref = schema.$ref?.split('/').pop();
  const form: JsonSchema = structuredClone(ref ? (components[ref] ?? {}) : schema);
  form.type ??= 'object';
  const properties = { ...(form.properties ?? {}) };
  for (const field of multipart.binaryFields ?? []) {
    properties[field] = {
      type: 'array',
      items: { ...BinaryFile },
      description: properties[field]?.description ?? 'One or more binary parts (or text) under this name',
    };
  }
  for (const field of multipart.textFileFields ?? []) {
    const text = properties[field] ?? { type: 'string' };
    properties[field] = { anyOf: [text, { ...BinaryFile, description: 'The same text as a file part' }] };
  }
  if (multipart.files) {
    properties.files = {
      type: 'array',
      minItems: 1,
      items: BinaryFile,
      description:
        'The files, one form part each under the name `files`; the part’s file name names the output. Send them after every other field: the job starts at the first file and works on the files while they arrive, and a field sent after a file is refused (422 `field_after_files`).',
    };
    form.required = [...new Set([...(form.required ?? []), 'files'])];
  }
  form.properties = properties;
  return form;
}

/**
 * zod-to-openapi writes a regex with flags as `source/flags` (/^[^\p{Cc}]*$/u becomes `^[^\p{Cc}]*$/u`),
 * a pattern nothing matches. A pattern is an ECMAScript regular expression without delimiters or flags;
 * the flag is dropped (\p{…} classes are read in Unicode mode, as JSON Schema validators do).
 */
function fixPatterns(value: unknown): void {
  if (Array.isArray(value)) value.forEach(fixPatterns);
  else if (value && typeof value === 'object') {
    const o = value as Record<string, unknown>;
    for (const [k, v] of Object.entries(o)) {
      if (k === 'pattern' && typeof v === 'string') o[k] = v.replace(/(?<!\\)\/[dgimsuvy]+$/, '');
      else fixPatterns(v);
    }
  }
}

export function openApiDocument(routes: RouteDef[], info: { title: string; version: string; serverUrl: string }) {
  const registry = new OpenAPIRegistry();
  registry.registerComponent('securitySchemes', 'bearer', {
    type: 'http',
    scheme: 'bearer',
    description:
      'A JWT from /auth/login, or an API key where the route accepts one: the partner key (`kms_pk_…`, every scope) or a managed key (`kms_sk_…`, the scopes it was given; a route lists the one it needs in its security requirement).',
  });
  for (const def of routes) {
    const request: RouteConfig['request'] = {};
    if (def.params) request.params = def.params as unknown as z.ZodObject;
    if (def.query) request.query = def.query as unknown as z.ZodObject;
    if (def.multipart?.files) request.headers = UploadPreferences;
    if (def.body || def.multipart?.files) {
      const schema = def.body ?? z.object({});
      // mountRoutes reads a JSON body too where it is sent; with uploads a form is the only useful way.
      const content: ZodContentObject = {};
      if (def.multipart) {
        content['multipart/form-data'] = def.multipart.files
          ? {
              schema,
              encoding: {
                files: { contentType: 'application/octet-stream' },
                ...Object.fromEntries(
                  [...(def.multipart.textFileFields ?? []), ...(def.multipart.binaryFields ?? [])].map((f) => [
                    f,
                    { contentType: 'text/plain, application/pgp-keys, application/pgp-signature, application/octet-stream' },
                  ]),
                ),
              },
            }
          : { schema };
      }
      if (!def.multipart?.files) content['application/json'] = { schema };
      // The server reads a missing body as {}: the body is required when {} is refused.
      request.body = { content, description: def.multipart?.description, required: Boolean(def.multipart?.files) || !schema.safeParse({}).success };
    }
    const responses: RouteConfig['responses'] = {};
    for (const [status, spec] of Object.entries(def.responses)) {
      responses[status] = spec.schema
        ? { description: spec.description, content: { [spec.contentType ?? 'application/json']: { schema: spec.schema } } }
        : { description: spec.description };
    }
    responses.default = { description: 'Error (RFC 9457 problem details)', content: { 'application/problem+json': { schema: Problem } } };
    registry.registerPath({
      method: def.method,
      path: def.path,
      summary: def.summary,
      tags: def.tags,
      security: security(def),
      description: accessNote(def),
      ...(def.recentSignIn ? { 'x-recent-sign-in': def.recentSignIn === true ? true : def.recentSignIn.description } : {}),
      request,
      responses,
    });
  }
  const doc = new OpenApiGeneratorV31(registry.definitions).generateDocument({
    openapi: '3.1.0',
    info: { title: info.title, version: info.version },
    servers: [{ url: info.serverUrl }],
  });
  const components = (doc.components?.schemas ?? {}) as Record<string, JsonSchema>;
  for (const def of routes) {
    const op = (doc.paths?.[def.path] as Record<string, Operation> | undefined)?.[def.method];
    if (!op) continue;
    const form = op.requestBody?.content['multipart/form-data'];
    // A form without files is the JSON body's schema (binary parts are described by their text field's description).
    if (form && def.multipart && (def.multipart.files || def.multipart.textFileFields?.length)) {
      form.schema = describeUploads(form.schema ?? {}, components, def.multipart);
    }
  }
  fixPatterns(doc);
  return doc;
}
