import { createWriteStream, openAsBlob } from 'node:fs';
import { basename } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
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

/** A failed API call, with the problem+json body (code, detail) when there is one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly request: string,
    readonly body: string,
  ) {
    super(`${request} → HTTP ${status}: ${body.slice(0, 2000)}`);
  }
}

const POLL_MS = 100;

/** A minimal client of the KMS API (/api/v1), one account. */
export class Api {
  private token = '';

  constructor(readonly base: string) {}

  /** A fresh partner account; its session token authenticates every later call. */
  async register(): Promise<void> {
    const id = randomId();
    const body = { username: `bench_${id}`, email: `bench-${id}@example.com`, password: `bench-password-${id}`, company_name: 'KMS bench' };
    const reply = await this.call<{ session: { token: string } }>('POST', '/partners/register', { json: body }, 201);
    this.token = reply.session.token;
  }

  /** A curve25519 key held by the service; returns its fingerprint. */
  async generateKey(passphrase: string): Promise<string> {
    const form = formOf({ label: 'bench', name: 'KMS Bench', email: 'bench@example.com', passphrase, algorithm: 'curve25519' });
    return (await this.call<{ fingerprint: string }>('POST', '/keys/generate-key', { form }, 201)).fingerprint;
  }

  /** Uploads the file (streamed from disk) for encryption; resolves with the job once the API answered 202. */
  async submitEncrypt(file: string, fingerprint: string): Promise<JobView> {
    return this.call<JobView>('POST', '/keys/encrypt', { form: await withFile(formOf({ fingerprint }), file) }, 202);
  }

  async submitDecrypt(file: string, fingerprint: string, passphrase: string): Promise<JobView> {
    return this.call<JobView>('POST', '/keys/decrypt', { form: await withFile(formOf({ fingerprint, passphrase }), file) }, 202);
  }

  job(id: string): Promise<JobView> {
    return this.call<JobView>('GET', `/jobs/${id}`, {}, 200);
  }

  /** Polls every 100 ms until the job has ended; a failed job rejects with its error. */
  async waitForJob(id: string): Promise<JobView> {
    for (;;) {
      const job = await this.job(id);
      if (job.state === 'completed') return job;
      if (job.state === 'failed') throw new Error(`job ${id} failed: ${job.error?.code}: ${job.error?.message}`);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  /** Streams a download (`download_url` is a root-relative path) to a file; returns its size. */
  async download(downloadUrl: string, dest: string): Promise<number> {
    const res = await this.fetch('GET', new URL(downloadUrl, this.base).toString(), {});
    if (res.status !== 200 || !res.body) throw new ApiError(res.status, `GET ${downloadUrl}`, await res.text());
    const out = createWriteStream(dest, { highWaterMark: MiB });
    await pipeline(Readable.fromWeb(res.body as unknown as NodeReadableStream<Uint8Array>), out);
    return out.bytesWritten;
  }

  private async call<T>(method: string, path: string, body: { json?: unknown; form?: FormData }, expect: number): Promise<T> {
    const res = await this.fetch(method, `${this.base}/api/v1${path}`, body);
    const text = await res.text();
    if (res.status !== expect) throw new ApiError(res.status, `${method} ${path}`, text);
    return JSON.parse(text) as T;
  }

  private fetch(method: string, url: string, body: { json?: unknown; form?: FormData }): Promise<Response> {
    const headers: Record<string, string> = {};
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    if (body.json !== undefined) headers['content-type'] = 'application/json';
    return fetch(url, { method, headers, body: body.form ?? (body.json === undefined ? undefined : JSON.stringify(body.json)) });
  }
}

function formOf(fields: Record<string, string>): FormData {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  return form;
}

/** A file-backed Blob: fetch reads it from disk as it sends (nothing buffered). */
async function withFile(form: FormData, path: string): Promise<FormData> {
  form.append('files', await openAsBlob(path), basename(path));
  return form;
}
