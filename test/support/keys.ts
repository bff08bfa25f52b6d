import { expect } from 'vitest';
import type { ApiClient, FormFile } from './service';

export const PASSPHRASE = 'correct horse battery staple';

export async function createKey(api: ApiClient, token: string, fields: Record<string, string> = {}) {
  const res = await api('POST', '/keys/generate-key', {
    token,
    form: { label: 'main', environment: 'production', name: 'Ann Example', email: 'ann@example.test', passphrase: PASSPHRASE, ...fields },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { lineage_id: string; fingerprint: string; status: string };
}

/** Submits a job and waits for it to end (Prefer: wait); returns the finished job. */
export async function runJob(
  api: ApiClient,
  token: string,
  path: '/keys/encrypt' | '/keys/decrypt' | '/keys/sign' | '/keys/verify' | '/keys/rewrap',
  form: Record<string, string | FormFile | FormFile[]>,
) {
  const res = await api('POST', path, { token, form, headers: { prefer: 'wait=30' } });
  expect([200, 202], JSON.stringify(res.body)).toContain(res.status);
  return waitJob(api, token, res.body.job_id);
}

export async function waitJob(api: ApiClient, token: string, jobId: string) {
  for (;;) {
    const job = await api('GET', `/jobs/${jobId}`, { token, headers: { prefer: 'wait=30' } });
    if (job.body.state === 'completed' || job.body.state === 'failed') return job.body;
  }
}

export async function download(api: ApiClient, token: string, jobId: string, n = 0): Promise<Buffer> {
  const res = await api('GET', `/jobs/${jobId}/files/${n}`, { token });
  expect(res.status).toBe(200);
  return res.body as Buffer;
}

export async function encrypt(api: ApiClient, token: string, fingerprint: string, files: FormFile[], extra: Record<string, string> = {}) {
  const job = await runJob(api, token, '/keys/encrypt', { fingerprint, files, ...extra });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return job;
}
