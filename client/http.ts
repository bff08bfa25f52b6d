import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import createClient, { type Client } from 'openapi-fetch';
import type { paths } from './openapi.js';
import { ClientError, ProblemError, problemOf, retryAfterSeconds } from './errors.js';

export const CLIENT_VERSION = '0.1.0';

export interface KmsOptions {
  /** The service: its root (`http://localhost:3000`) or its API base (`…/api/v1`). */
  url: string;
  /** A session token (JWT) or an API key (`kms_pk_…`, `kms_sk_…`), sent as `Authorization: Bearer`. */
  token?: string;
  /** Retries after a network error or a 503 (replayable requests only), and after a 429. Default 4. */
  retries?: number;
  /** A 429 whose Retry-After is longer than this (seconds) is not waited for but thrown. Default 60. */
  maxRetryAfterSeconds?: number;
  /** Sent as User-Agent (the service classes clients by it). */
  userAgent?: string;
  /** Told before each retry: what failed and how long we wait. */
  onRetry?(info: { attempt: number; delayMs: number; reason: string }): void;
}

const API_PREFIX = '/api/v1';
const IDEMPOTENT = new Set(['GET', 'HEAD', 'PUT', 'DELETE', 'OPTIONS']);

/** `http://host:3000`, `http://host:3000/`, `http://host:3000/api/v1` → `http://host:3000/api/v1`. */
export function apiBase(url: string): string {
  const u = new URL(url);
  const path = u.pathname.replace(/\/+$/, '');
  u.pathname = path.endsWith(API_PREFIX) ? path : path + API_PREFIX;
  u.search = '';
  u.hash = '';
  return u.toString().replace(/\/+$/, '');
}

/** A new Idempotency-Key: every retry of one logical submission sends the same one. */
export const newIdempotencyKey = () => `kms-${randomUUID()}`;

export interface RawRequestOptions {
  /** Destroys the request after this long without data (ms). Default 120 s. */
  idleMs?: number;
  signal?: AbortSignal;
  /** Told each 1xx answer that comes before the response (e.g. 103 Early Hints). */
  onInformation?(status: number, headers: http.IncomingHttpHeaders): void;
}

/** What one attempt ended with, to the retry loop. */
type Outcome<T> = { ok: T } | { retry: unknown; afterMs?: number; final: () => T };

/**
 * One connection to the service: the typed OpenAPI client (`api`, openapi-fetch over the generated
 * types) for JSON calls, and the retry policy shared with the streaming calls (uploads, downloads,
 * events) that go through node:http, which moves large bodies at a fraction of fetch's CPU cost.
 */
export class Kms {
  readonly apiUrl: string;
  readonly api: Client<paths>;
  token: string | undefined;
  private readonly opts: Required<Pick<KmsOptions, 'retries' | 'maxRetryAfterSeconds' | 'userAgent'>> & KmsOptions;

  constructor(options: KmsOptions) {
    this.apiUrl = apiBase(options.url);
    this.token = options.token;
    this.opts = { retries: 4, maxRetryAfterSeconds: 60, userAgent: `kms-client/${CLIENT_VERSION} node/${process.versions.node}`, ...options };
    this.api = createClient<paths>({ baseUrl: this.apiUrl, fetch: (req) => this.fetchWithRetries(req) });
    this.api.use({ onRequest: ({ request }) => this.decorate(request) });
  }

  /** Authorization and User-Agent for a request. */
  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { 'user-agent': this.opts.userAgent, ...(this.token ? { authorization: `Bearer ${this.token}` } : {}), ...extra };
  }

  private decorate(request: Request): Request {
    for (const [k, v] of Object.entries(this.headers())) if (!request.headers.has(k)) request.headers.set(k, v);
    return request;
  }

  /**
   * The data of an openapi-fetch call, or its problem thrown as a ProblemError.
   *
   *   const keys = await kms.data(kms.api.GET('/keys/list', {}));
   */
  async data<T>(call: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
    const { data, error, response } = await call;
    if (!response.ok || error !== undefined)
      throw new ProblemError(response.status, problemOf(response.status, error), retryAfterSeconds(response.headers.get('retry-after')));
    return data as T;
  }

  /**
   * Runs `attempt` until it succeeds, retrying what it reports as retryable: back-off 0.5 s doubling
   * to 8 s (with jitter), or the service's Retry-After. After the last retry (`retries`, default the
   * client's), the outcome's `final`.
   */
  async retrying<T>(attempt: (n: number) => Promise<Outcome<T>>, retries = this.opts.retries): Promise<T> {
    for (let n = 0; ; n++) {
      const outcome = await attempt(n);
      if ('ok' in outcome) return outcome.ok;
      if (n >= retries) return outcome.final();
      const delayMs = outcome.afterMs ?? Math.min(8000, 500 * 2 ** n) * (0.5 + Math.random() / 2);
      this.opts.onRetry?.({ attempt: n + 1, delayMs, reason: describe(outcome.retry) });
      await sleep(delayMs);
    }
  }

  /**
   * The retry decision for one answer: 429 within `maxRetryAfterSeconds` is always retried (the service
   * refused before acting); 503 and network errors only when the request may be repeated (an idempotent
   * method, or an Idempotency-Key that makes the service answer a repeat with the first job), as is 409
   * `idempotency_key_in_use` (the first try with that key is still uploading: a cut upload the service
   * has not noticed yet).
   */
  classify(status: number | 'network', retryAfter: string | null | undefined, replayable: boolean, code?: string): { retry: boolean; afterMs?: number } {
    const after = retryAfterSeconds(retryAfter);
    if (status === 409 && code === 'idempotency_key_in_use') return { retry: replayable };
    if (status === 429)
      return after !== undefined && after > this.opts.maxRetryAfterSeconds
        ? { retry: false }
        : { retry: true, afterMs: after === undefined ? undefined : after * 1000 };
    if (status === 503 || status === 'network')
      return { retry: replayable, afterMs: after === undefined ? undefined : Math.min(after, this.opts.maxRetryAfterSeconds) * 1000 };
    return { retry: false };
  }

  private fetchWithRetries(request: Request): Promise<Response> {
    const replayable = IDEMPOTENT.has(request.method) || request.headers.has('idempotency-key');
    return this.retrying<Response>(async () => {
      let res: Response;
      try {
        res = await fetch(request.clone());
      } catch (err) {
        const { retry } = this.classify('network', null, replayable);
        const error = new ClientError('network_error', `${request.method} ${new URL(request.url).pathname}: ${describe(err)}.`, { cause: err });
        if (!retry) throw error;
        return {
          retry: err,
          final: () => {
            throw error;
          },
        };
      }
      const decision = this.classify(res.status, res.headers.get('retry-after'), replayable);
      if (!decision.retry) return { ok: res };
      await res.body?.cancel();
      return { retry: `HTTP ${res.status}`, afterMs: decision.afterMs, final: () => res };
    });
  }

  /**
   * One raw request through node:http(s), streaming `body` (a fresh stream per call) and answering the
   * response head and body stream. The caller consumes or destroys the response.
   */
  rawRequest(method: string, path: string, headers: Record<string, string>, body?: Readable, opts: RawRequestOptions = {}): Promise<http.IncomingMessage> {
    const url = new URL(this.apiUrl + path);
    const lib = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = lib.request(url, { method, headers: this.headers(headers), signal: opts.signal });
      req.setTimeout(opts.idleMs ?? 120_000, () => req.destroy(new Error('no data for too long')));
      if (opts.onInformation) req.on('information', (info) => opts.onInformation!(info.statusCode, info.headers));
      req.once('response', (res) => {
        // The service may answer (an error) before it has read the whole upload: the answer counts.
        // The request is then never finished, so its socket is closed once the answer has been read
        // (else it would hold the process open, and no other request could reuse it).
        if (body && !req.writableFinished) {
          body.unpipe(req);
          body.destroy();
          res.once('close', () => req.destroy());
        }
        resolve(res);
      });
      req.once('error', (err) => {
        body?.destroy();
        reject(new ClientError('network_error', `${method} ${url.pathname}: ${describe(err)}.`, { cause: err }));
      });
      if (body) {
        body.once('error', (err) => req.destroy(err));
        body.pipe(req);
      } else req.end();
    });
  }
}

/** The whole body of a response as text. */
export async function readText(res: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** A non-2xx node:http response as a ProblemError (reads its body). */
export async function problemFrom(res: http.IncomingMessage): Promise<ProblemError> {
  const text = await readText(res).catch(() => '');
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON: problemOf wraps the text */
  }
  const status = res.statusCode ?? 0;
  return new ProblemError(status, problemOf(status, body), retryAfterSeconds(header(res, 'retry-after')));
}

export const header = (res: http.IncomingMessage, name: string): string | undefined => {
  const v = res.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

export function describe(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: string }).code ?? (err.cause as { code?: string } | undefined)?.code;
    return code && !err.message.includes(code) ? `${err.message} (${code})` : err.message;
  }
  return String(err);
}
