import { createWriteStream, openAsBlob } from 'node:fs';
import { request, type IncomingMessage, type RequestOptions } from 'node:http';
import { basename } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { multipartBody, partsOf } from '../../client/uploads';
import { MiB, randomId } from './util';

/** The parts of GET /jobs/{id} the bench reads. */
export interface JobView {
  job_id: string;
  state: 'queued' | 'active' | 'completed' | 'failed';
  progress: { bytes_done?: number; bytes_total?: number };
  result: { files?: { n: number; name: string; size: number; download_url: string }[] } | null;
  error: { code: string; message: string } | null;
  started_at: string | null;
  finished_at: string | null;
}

/** Whom an encryption is to: a stored key's fingerprint, or an armored public key the caller supplies. */
export type Recipient = string | { publicKey: string };

/** A failed API call, with the problem+json body (code, detail) when there is one. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly request: string,
    readonly body: string,
  ) {
    super(`${request} → HTTP ${status}: ${body.slice(0, 2000)}`);
  }
}

/** Long polling, as the client library waits: `Prefer: wait=N` answers as soon as the job ends. */
const WAIT_SECONDS = 5;

/**
 * How files travel. `http` (default): node:http with a multipart body built around a 1 MiB-chunk file
 * stream. `fetch`: FormData + fs.openAsBlob and fetch's web-stream body; it streams too, but costs the
 * client about 3× the CPU (measured: ~1.6 s of bench CPU per 256 MiB uploaded, upload ~130 MiB/s),
 * which on a 2-core machine makes the bench, not the service, the bottleneck.
 */
export type Transfer = 'http' | 'fetch';

/** A minimal client of the KMS API (/api/v1), one account. */
export class Api {
  private token = '';

  constructor(
    readonly base: string,
    readonly transfer: Transfer = 'http',
  ) {}

  /** A fresh partner account; its session token authenticates every later call. */
  async register(): Promise<void> {
    const id = randomId();
    const body = { username: `bench_${id}`, email: `bench-${id}@example.com`, password: `bench-password-${id}`, company_name: 'KMS bench' };
    const reply = await this.call<{ session: { token: string } }>('POST', '/partners/register', { json: body }, 201);
    this.token = reply.session.token;
  }

  /** A curve25519 key held by the service; returns its fingerprint. */
  async generateKey(passphrase: string): Promise<string> {
    const form = new FormData();
    for (const [k, v] of Object.entries({ label: 'bench', name: 'KMS Bench', email: 'bench@example.com', passphrase, algorithm: 'curve25519' }))
      form.append(k, v);
    return (await this.call<{ fingerprint: string }>('POST', '/keys/generate-key', { form }, 201)).fingerprint;
  }

  /**
   * Uploads the file (streamed from disk) for encryption to a stored key's fingerprint or a supplied armored
   * public key; resolves with the job once the API answered 202.
   */
  submitEncrypt(file: string, to: Recipient, onJob?: (jobId: string) => void): Promise<JobView> {
    return this.upload('/keys/encrypt', typeof to === 'string' ? { fingerprint: to } : { public_key: to.publicKey }, file, onJob);
  }

  /**
   * Uploads the file for encryption and downloads its ciphertext to `dest` as it is produced (`?follow=true`,
   * from the 103 Early Hints that name the job, during the upload): the job once the API answered, and the
   * download's byte count once it has ended.
   */
  async submitEncryptFollowed(file: string, to: Recipient, dest: string): Promise<{ job: JobView; downloaded: Promise<number> }> {
    let downloaded: Promise<number> | undefined;
    const job = await this.submitEncrypt(file, to, (id) => {
      downloaded = this.download(`/api/v1/jobs/${id}/files/0?follow=true`, dest);
    });
    if (!downloaded) throw new Error('the API sent no 103 Early Hints naming the job');
    return { job, downloaded };
  }

  /** Imports an armored secret key (unprotected as sent), to be held under `passphrase`; returns its fingerprint. */
  async importKey(armored: string, passphrase: string): Promise<string> {
    const form = new FormData();
    for (const [k, v] of Object.entries({ key: armored, passphrase, label: 'bench-import' })) form.append(k, v);
    return (await this.call<{ fingerprint: string }>('POST', '/keys/import', { form }, 201)).fingerprint;
  }

  submitDecrypt(file: string, fingerprint: string, passphrase: string): Promise<JobView> {
    return this.upload('/keys/decrypt', { fingerprint, passphrase }, file);
  }

  /**
   * Asks for an immediate rotation as the client library does (client/helpers.ts `rotate`): with
   * `Prefer: wait`, so the answer is the finished job when it ends within WAIT_SECONDS, else the queued one.
   */
  rotate(fingerprint: string): Promise<JobView> {
    return this.call<JobView>('POST', `/keys/${fingerprint}/rotate`, { json: {} }, [200, 202], { prefer: `wait=${WAIT_SECONDS}` });
  }

  job(id: string, waitSeconds = 0): Promise<JobView> {
    return this.call<JobView>('GET', `/jobs/${id}`, {}, 200, waitSeconds ? { prefer: `wait=${waitSeconds}` } : {});
  }

  /**
   * Long-polls until the job has ended; a failed job rejects with its error. `check` throws to give up
   * early (a service process died); `timeoutMs` bounds the wait.
   */
  async waitForJob(id: string, timeoutMs: number, check: () => void = () => {}): Promise<JobView> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const job = await this.job(id, WAIT_SECONDS);
      if (job.state === 'completed') return job;
      if (job.state === 'failed') throw new Error(`job ${id} failed: ${job.error?.code}: ${job.error?.message}`);
      if (Date.now() > deadline) throw new Error(`job ${id} still ${job.state} after ${timeoutMs / 1000} s (progress ${JSON.stringify(job.progress)})`);
      check();
    }
  }

  /** Streams a download (`download_url` is a root-relative path) to a file; returns its size. */
  async download(downloadUrl: string, dest: string): Promise<number> {
    const url = new URL(downloadUrl, this.base).toString();
    const out = createWriteStream(dest, { highWaterMark: MiB });
    if (this.transfer === 'fetch') {
      const res = await fetch(url, { headers: this.auth() });
      if (res.status !== 200 || !res.body) throw new ApiError(res.status, `GET ${downloadUrl}`, await res.text());
      await pipeline(Readable.fromWeb(res.body as unknown as NodeReadableStream<Uint8Array>), out);
    } else {
      const res = await httpRequest(url, { method: 'GET', headers: this.auth() });
      if (res.statusCode !== 200) throw new ApiError(res.statusCode ?? 0, `GET ${downloadUrl}`, await text(res));
      await pipeline(res, out);
    }
    return out.bytesWritten;
  }

  /**
   * multipart/form-data: `fields`, then the file in the field `files`. `onJob` hears the job's id from the
   * 103 Early Hints the API sends, when asked (`Prefer: early-hints`), once the job runs, before the upload
   * ends (node:http only: fetch hides 1xx).
   */
  private async upload(path: string, fields: Record<string, string>, file: string, onJob?: (jobId: string) => void): Promise<JobView> {
    if (this.transfer === 'fetch') {
      const form = new FormData();
      for (const [k, v] of Object.entries(fields)) form.append(k, v);
      form.append('files', await openAsBlob(file), basename(file));
      return this.call<JobView>('POST', path, { form }, 202);
    }
    const body = multipartBody(fields, 'files', await partsOf([file])); // the client library's encoder
    const req = request(`${this.base}/api/v1${path}`, {
      method: 'POST',
      headers: { ...this.auth(), 'content-type': body.contentType, 'content-length': body.length, ...(onJob ? { prefer: 'early-hints' } : {}) },
    });
    const answer = new Promise<IncomingMessage>((resolve, reject) => req.once('response', resolve).once('error', reject));
    req.on('information', (info) => {
      const id = /\/jobs\/([0-9a-f-]{36})>/.exec(String(info.headers.link ?? ''))?.[1];
      if (info.statusCode === 103 && id) onJob?.(id);
    });
    // The API may answer (an error) before it has read everything; the answer is what counts then.
    const sent = pipeline(
      body.open(() => undefined),
      req,
    ).catch(() => undefined);
    const res = await answer;
    const reply = await text(res);
    await sent;
    if (res.statusCode !== 202) throw new ApiError(res.statusCode ?? 0, `POST ${path}`, reply);
    return JSON.parse(reply) as JobView;
  }

  /** The Authorization header of the account (empty before `register`). */
  auth(): Record<string, string> {
    return this.token ? { authorization: `Bearer ${this.token}` } : {};
  }

  private async call<T>(
    method: string,
    path: string,
    body: { json?: unknown; form?: FormData },
    expect: number | number[],
    extra: Record<string, string> = {},
  ): Promise<T> {
    const headers = { ...this.auth(), ...extra };
    if (body.json !== undefined) headers['content-type'] = 'application/json';
    const res = await fetch(`${this.base}/api/v1${path}`, {
      method,
      headers,
      body: body.form ?? (body.json === undefined ? undefined : JSON.stringify(body.json)),
    });
    const reply = await res.text();
    if (![expect].flat().includes(res.status)) throw new ApiError(res.status, `${method} ${path}`, reply);
    return JSON.parse(reply) as T;
  }
}

function httpRequest(url: string, opts: RequestOptions): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => request(url, opts, resolve).once('error', reject).end());
}

async function text(res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}
