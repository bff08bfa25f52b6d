import createClient from 'openapi-fetch';
import type { components, paths } from '../../../client/openapi';

export type Problem = components['schemas']['Problem'];
export type Schemas = components['schemas'];

/**
 * The header the API asks of every state-changing request the console's cookie signs in
 * (api/middleware/browser-session.ts): a cross-site page cannot send it.
 */
const CONSOLE_HEADER = 'x-kms-console';
export const API = '/api/v1';

/** The typed client over the OpenAPI document's types: the console and the API cannot drift apart. */
export const api = createClient<paths>({ baseUrl: API, headers: { [CONSOLE_HEADER]: '1' }, credentials: 'same-origin', cache: 'no-store' });

/** A refused request, carrying the API's problem details (RFC 9457) and, on 429/503, the wait it asked. */
export class ApiProblem extends Error {
  constructor(
    readonly status: number,
    readonly problem: Problem,
    readonly retryAfter?: number,
  ) {
    super(problem.detail);
  }
  get code(): string {
    return this.problem.code;
  }
  /** The problem's field errors by field name (`body.email` → `email`). */
  fields(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const e of this.problem.errors ?? []) out[e.path.split('.').slice(1).join('.') || e.path] ??= e.message;
    return out;
  }
}

function isProblem(v: unknown): v is Problem {
  return typeof v === 'object' && v !== null && typeof (v as Problem).code === 'string' && typeof (v as Problem).detail === 'string';
}

export function problemOf(response: Response, body: unknown): ApiProblem {
  const retry = Number(response.headers.get('retry-after'));
  const problem: Problem = isProblem(body)
    ? body
    : {
        type: 'about:blank',
        title: response.statusText,
        status: response.status,
        code: `http_${response.status}`,
        detail: `The service answered ${response.status} ${response.statusText}.`,
      };
  return new ApiProblem(response.status, problem, Number.isFinite(retry) && retry > 0 ? retry : undefined);
}

/** The answer's data, or its problem thrown as ApiProblem. */
export async function ok<D>(call: Promise<{ data?: D; error?: unknown; response: Response }>): Promise<NonNullable<D>> {
  let answer: { data?: D; error?: unknown; response: Response };
  try {
    answer = await call;
  } catch {
    throw new ApiProblem(0, {
      type: 'about:blank',
      title: 'Network error',
      status: 0,
      code: 'network_error',
      detail: 'The service could not be reached; check the connection and try again.',
    });
  }
  if (!answer.response.ok) throw problemOf(answer.response, answer.error);
  return answer.data as NonNullable<D>;
}

export type Job = Schemas['Job'];

/**
 * A WebAuthn response from @simplewebauthn/browser as the API's schema types it: the same JSON, with
 * its extension results as a plain object (an interface has no index signature; a copy does).
 */
export function asJson<T extends { clientExtensionResults: object }>(
  credential: T,
): Omit<T, 'clientExtensionResults'> & { clientExtensionResults: Record<string, unknown> } {
  // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-assertion -- the spread's type is `{}`, which the server's type does not take
  return { ...credential, clientExtensionResults: { ...credential.clientExtensionResults } as Record<string, unknown> };
}

export interface UploadProgress {
  loaded: number;
  total: number;
}

/** The routes that take a multipart form, and the field names each accepts (from the OpenAPI document). */
export type FormPath = '/keys/encrypt' | '/keys/decrypt' | '/keys/rewrap' | '/keys/sign' | '/keys/verify' | '/keys/import';
type FormFields<P extends FormPath> = keyof NonNullable<paths[P]['post']['requestBody']>['content']['multipart/form-data'] & string;
/** One part of a form, in the order sent: a text field, or a file (streamed from disk, never read whole). */
export type FormPart<P extends FormPath> = readonly [name: FormFields<P>, value: string | File];

/**
 * Posts a multipart form. The browser streams each File from disk into the request body: nothing is
 * read whole into the page. XMLHttpRequest rather than fetch, for upload progress. Parts go in the order
 * given: the API asks for text fields first, then small binary parts (signatures, a key), files last.
 */
export function postForm<P extends FormPath, T = Job>(path: P, parts: FormPart<P>[], onProgress?: (p: UploadProgress) => void): Promise<T> {
  const form = new FormData();
  for (const [name, value] of parts) {
    if (typeof value === 'string') form.append(name, value);
    else form.append(name, value, value.name);
  }
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('POST', API + path);
    xhr.setRequestHeader(CONSOLE_HEADER, '1');
    xhr.responseType = 'json';
    if (onProgress) xhr.upload.onprogress = (e) => onProgress({ loaded: e.loaded, total: e.total });
    xhr.onerror = () =>
      reject(
        new ApiProblem(0, { type: 'about:blank', title: 'Network error', status: 0, code: 'network_error', detail: 'The upload was cut off; try again.' }),
      );
    xhr.onload = () => {
      const headers = new Headers({ 'retry-after': xhr.getResponseHeader('retry-after') ?? '' });
      if (xhr.status >= 200 && xhr.status < 300) resolve(xhr.response as T);
      else reject(problemOf(new Response(null, { status: xhr.status, statusText: xhr.statusText, headers }), xhr.response));
    };
    xhr.send(form);
  });
}

/** Follows a job until it ends, telling each state on the way. */
export async function followJob(jobId: string, onUpdate: (job: Job) => void, signal?: AbortSignal): Promise<Job> {
  for (let delay = 250; ; delay = Math.min(delay * 1.5, 2000)) {
    const job = await ok(api.GET('/jobs/{job_id}', { params: { path: { job_id: jobId } }, signal }));
    onUpdate(job);
    if (job.state === 'completed' || job.state === 'failed') return job;
    await new Promise((r) => setTimeout(r, delay));
  }
}

/** Where a job's output file downloads from: the browser streams it to disk with the session cookie. */
export const outputUrl = (jobId: string, n: number) => `${API}/jobs/${encodeURIComponent(jobId)}/files/${n}`;

/** Saves small text (an armored public key) as a file. */
export function saveText(name: string, text: string, type: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
