import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, inject } from 'vitest';
import { Redis } from 'ioredis';
import { loadConfig, type Config } from '../../lib/config';
import { createContainer, type Container } from '../../lib/container';
import { createLogger } from '../../lib/logger';
import { ManualClock, type Clock } from '../../lib/clock';
import { startService, type Role } from '../../lib/main';
import { ensureDatabase, dropDatabase } from '../../db/knex';
import { deleteKeysMatching } from '../../lib/redis';

export interface TestService {
  url: string;
  c: Container;
  config: Config;
  /** Environment that starts another process (a worker) on the same database, Redis prefix and blobs. */
  env: Record<string, string>;
  api: ApiClient;
  stop(): Promise<void>;
}

/**
 * A whole service for one test file: its own database cloned from the run's migrated template, its
 * own Redis prefix, blob folder and mail folder, the API on a free port, and (unless told otherwise)
 * workers in-process. `stop` removes everything it made.
 */
export async function startTestService(opts: { roles?: Role[]; env?: Record<string, string>; clock?: Clock; dbHost?: string } = {}): Promise<TestService> {
  const id = `${inject('runId')}_${randomBytes(3).toString('hex')}`;
  const dir = await mkdtemp(join(tmpdir(), `${id}-`));
  const dbUrl = new URL(inject('pgBase'));
  dbUrl.pathname = `/${id}`;
  const env: Record<string, string> = {
    NODE_ENV: 'test',
    PORT: '0',
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent',
    DATABASE_URL: dbUrl.toString(),
    REDIS_URL: inject('redisUrl'),
    REDIS_PREFIX: id,
    BLOB_STORE_URL: join(dir, 'blobs'),
    MAIL_DIR: join(dir, 'mail'),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
    WORKER_QUEUES: 'crypto=2,rotation=2,notify=2,billing=1,team-sync=1,maintenance=1',
    // Test receivers listen on loopback (the SSRF guard's own test turns this off).
    WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
    ...opts.env,
  };
  await ensureDatabase(env.DATABASE_URL, inject('templateDb'));
  if (opts.dbHost) {
    dbUrl.host = opts.dbHost;
    env.DATABASE_URL = dbUrl.toString();
  }
  const config = loadConfig(env);
  const container = await createContainer(config, { clock: opts.clock ?? new ManualClockFollowingTime(), log: createLogger(config.logLevel, { test: id }) });
  const service = await startService(opts.roles ?? ['web', 'worker'], config, container);
  const url = `http://127.0.0.1:${service.port}/api/v1`;
  return {
    url,
    c: container,
    config,
    env,
    api: apiClient(url),
    async stop() {
      await service.stop();
      dbUrl.host = new URL(inject('pgBase')).host;
      await dropDatabase(dbUrl.toString());
      await removeRedisKeys(env.REDIS_URL, id);
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Real time by default, but tests may jump it forward (expiry, lockout, schedules). */
export class ManualClockFollowingTime extends ManualClock {
  private offset = 0;
  override now() {
    return new Date(Date.now() + this.offset);
  }
  override advance(ms: number) {
    this.offset += ms;
  }
  override set(date: Date) {
    this.offset = date.getTime() - Date.now();
  }
}

/** Runs `fn` with the clock moved `ms` ahead, then moves it back (tokens issued before stay valid). */
export async function withClockAhead<T>(clock: ManualClockFollowingTime, ms: number, fn: () => Promise<T>): Promise<T> {
  clock.advance(ms);
  try {
    return await fn();
  } finally {
    clock.advance(-ms);
  }
}

export interface ApiResponse<T = any> {
  status: number;
  headers: Headers;
  body: T;
}

interface RequestOptions {
  token?: string;
  body?: unknown;
  headers?: Record<string, string>;
  raw?: RequestInit['body'];
  /** multipart/form-data: field → value; a Blob/Buffer value (or array of them) is sent as file(s). */
  form?: Record<string, string | FormFile | FormFile[]>;
}

export interface FormFile {
  name: string;
  data: Buffer | Blob;
}

function toFormData(fields: NonNullable<RequestOptions['form']>): FormData {
  const form = new FormData();
  // The files last, as the API asks (fields after them are refused): a job starts at its first file.
  const entries = Object.entries(fields).sort(([a], [b]) => Number(a === 'files') - Number(b === 'files'));
  for (const [key, value] of entries) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (typeof v === 'string') form.append(key, v);
      else form.append(key, v.data instanceof Blob ? v.data : new Blob([v.data]), v.name);
    }
  }
  return form;
}

export type ApiClient = <T = any>(method: string, path: string, opts?: RequestOptions) => Promise<ApiResponse<T>>;

export function apiClient(base: string): ApiClient {
  return async (method, path, opts = {}) => {
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    let body: RequestInit['body'] = opts.raw ?? (opts.form ? toFormData(opts.form) : undefined);
    if (opts.body !== undefined) {
      headers['content-type'] ??= 'application/json';
      body = JSON.stringify(opts.body);
    }
    const res = await fetch(base + path, { method, headers, body });
    const type = res.headers.get('content-type') ?? '';
    const parsed = type.includes('json')
      ? await res.json()
      : type.startsWith('text/') || type.includes('pgp-keys')
        ? await res.text()
        : Buffer.from(await res.arrayBuffer());
    return { status: res.status, headers: res.headers, body: parsed as never };
  };
}

let counter = 0;
/** A new session token for an account (password login). */
export async function login(api: ApiClient, u: { username: string; password: string }): Promise<string> {
  const res = await api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
  expect(res.status).toBe(200);
  return res.body.session.token as string;
}

/** A fresh account through the public API: its session token, partner API key and ids. */
export async function registerUser(api: ApiClient, over: Partial<{ username: string; email: string; password: string }> = {}) {
  const n = `${Date.now().toString(36)}${(counter++).toString(36)}${randomBytes(2).toString('hex')}`;
  const input = { username: `user_${n}`, email: `user_${n}@example.test`, password: 'correct horse battery', company_name: 'Acme', ...over };
  const res = await api('POST', '/partners/register', { body: input });
  if (res.status !== 201) throw new Error(`register failed: ${res.status} ${JSON.stringify(res.body)}`);
  return { ...input, id: res.body.user.user_id as string, token: res.body.session.token as string, apiKey: res.body.partner_api_key.api_key as string };
}

/** Deletes the keys of the Redis at `url` whose names contain `fragment` (a run's or a service's prefix). */
export async function removeRedisKeys(url: string, fragment: string): Promise<void> {
  const redis = new Redis(url);
  try {
    await deleteKeysMatching(redis, `*${fragment}*`);
  } finally {
    redis.disconnect();
  }
}
