import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import createClient from 'openapi-fetch';
import type { paths } from '../../client/openapi';
import { SCOPES as CLIENT_SCOPES } from '../../client/openapi';
import { SCOPES } from '../../lib/auth/scopes';
import { openApiForTypes } from '../../scripts/openapi-types';
import { startTestService, type TestService } from '../support/service';

/**
 * The OpenAPI document is usable as it stands: TypeScript types generated from it (openapi-typescript,
 * committed in client/openapi.ts; test/interface/client.test.ts checks they are fresh) and openapi-fetch drive the service through a whole
 * encrypt/decrypt round trip. Every request and answer shape here comes from the generated types.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

/**
 * multipart/form-data from a request body: text fields first (the service checks them before it
 * stores the uploads), then files. Generic: it knows no request shape.
 */
function formData(body: Record<string, unknown>): FormData {
  const form = new FormData();
  const entries = Object.entries(body).filter(([, v]) => v !== undefined && v !== null);
  const hasFile = (v: unknown) => v instanceof Blob || (Array.isArray(v) && v.some((x) => x instanceof Blob));
  for (const [name, value] of [...entries.filter(([, v]) => !hasFile(v)), ...entries.filter(([, v]) => hasFile(v))]) {
    for (const v of Array.isArray(value) ? value : [value]) form.append(name, v instanceof Blob ? v : String(v));
  }
  return form;
}

describe('client generated from the OpenAPI document', () => {
  it('generates the types from the document the service serves', async () => {
    const served = (await (await fetch(`${s.url}/openapi.json`)).json()) as Record<string, unknown>;
    const { servers: _servedServers, ...rest } = served;
    const { servers: _localServers, ...local } = JSON.parse(JSON.stringify(openApiForTypes()));
    expect(rest).toEqual(local);
  });

  it("lists the service's scopes, in its order, for the CLI's and the console's choices", () => {
    expect(CLIENT_SCOPES).toEqual(SCOPES);
  });

  it('registers, makes a key, encrypts files (to the key and to its public key sent as a file) and decrypts them', async () => {
    const anon = createClient<paths>({ baseUrl: s.url });
    const n = randomBytes(4).toString('hex');
    const password = 'correct horse battery';
    const reg = await anon.POST('/partners/register', {
      body: { username: `gen_${n}`, email: `gen_${n}@example.test`, password, company_name: 'Generated Ltd' },
    });
    expect(reg.response.status, JSON.stringify(reg.error)).toBe(201);
    const login = await anon.POST('/auth/login', { body: { identifier: `gen_${n}`, password } });
    expect(login.data?.user.username).toBe(`gen_${n}`);

    const api = createClient<paths>({ baseUrl: s.url, headers: { authorization: `Bearer ${login.data!.session.token}` } });
    const passphrase = 'a passphrase for the generated client';
    const made = await api.POST('/keys/generate-key', { body: { label: 'generated', name: 'Gen Client', email: `gen_${n}@example.test`, passphrase } });
    expect(made.response.status, JSON.stringify(made.error)).toBe(201);
    const key = made.data!;
    if (!('fingerprint' in key)) throw new Error('expected the key (201), got a job');
    expect(key).toMatchObject({ label: 'generated', algorithm: 'curve25519', status: 'active' });

    /** Polls a job to its end with `Prefer: wait`. */
    const finished = async (jobId: string) => {
      for (let i = 0; i < 20; i++) {
        const { data, error } = await api.GET('/jobs/{job_id}', { params: { path: { job_id: jobId } }, headers: { prefer: 'wait=10' } });
        if (!data) throw new Error(JSON.stringify(error));
        if (data.state === 'completed' || data.state === 'failed') return data;
      }
      throw new Error(`job ${jobId} did not finish`);
    };
    const download = async (jobId: string, n: number) => {
      const { data, response } = await api.GET('/jobs/{job_id}/files/{n}', { params: { path: { job_id: jobId, n } }, parseAs: 'arrayBuffer' });
      expect(response.status).toBe(200);
      return Buffer.from(data!);
    };

    const plain = [randomBytes(50_000), Buffer.from('second file\n')];
    const enc = await api.POST('/keys/encrypt', {
      body: { fingerprint: key.fingerprint, files: [new File([plain[0]], 'report.bin'), new File([plain[1]], 'notes.txt')] },
      bodySerializer: formData,
    });
    expect([200, 202], JSON.stringify(enc.error)).toContain(enc.response.status);
    const encJob = await finished(enc.data!.job_id);
    expect(encJob.state, JSON.stringify(encJob.error)).toBe('completed');
    const encFiles = encJob.result?.files ?? [];
    expect(encFiles.map((f) => f.name)).toEqual(['report.bin.gpg', 'notes.txt.gpg']);
    const ciphertexts = await Promise.all(encFiles.map((f) => download(encJob.job_id, f.n)));

    // The public key as a file part (public_key is text or a file).
    const pub = await api.POST('/keys/get-public-key', { body: { fingerprint: key.fingerprint } });
    expect(pub.data?.public_key).toContain('BEGIN PGP PUBLIC KEY BLOCK');
    const toPublic = await api.POST('/keys/encrypt', {
      body: {
        public_key: new File([pub.data!.public_key], 'key.asc', { type: 'application/pgp-keys' }),
        armor: 'true',
        files: [new File([plain[1]], 'armored.txt')],
      },
      bodySerializer: formData,
    });
    expect([200, 202], JSON.stringify(toPublic.error)).toContain(toPublic.response.status);
    const armoredJob = await finished(toPublic.data!.job_id);
    expect(armoredJob.state, JSON.stringify(armoredJob.error)).toBe('completed');
    const armored = await download(armoredJob.job_id, armoredJob.result!.files![0].n);
    expect(armored.toString()).toMatch(/^-----BEGIN PGP MESSAGE-----/);

    const dec = await api.POST('/keys/decrypt', {
      body: {
        fingerprint: key.fingerprint,
        passphrase,
        files: [...ciphertexts.map((c, i) => new File([c], encFiles[i].name)), new File([armored], 'armored.txt.asc')],
      },
      bodySerializer: formData,
    });
    expect([200, 202], JSON.stringify(dec.error)).toContain(dec.response.status);
    const decJob = await finished(dec.data!.job_id);
    expect(decJob.state, JSON.stringify(decJob.error)).toBe('completed');
    const decFiles = decJob.result?.files ?? [];
    expect(decFiles.map((f) => f.name)).toEqual(['report.bin', 'notes.txt', 'armored.txt']);
    expect(Buffer.compare(await download(decJob.job_id, decFiles[0].n), plain[0])).toBe(0);
    expect(Buffer.compare(await download(decJob.job_id, decFiles[1].n), plain[1])).toBe(0);
    expect(Buffer.compare(await download(decJob.job_id, decFiles[2].n), plain[1])).toBe(0);

    // Errors arrive typed as problem details.
    const wrong = await api.POST('/keys/decrypt', {
      body: { fingerprint: key.fingerprint, passphrase: 'not the passphrase', files: [new File([ciphertexts[0]], 'x.gpg')] },
      bodySerializer: formData,
    });
    expect(wrong.response.status).toBe(422);
    expect(wrong.error?.code).toBe('wrong_passphrase');
  });
});
