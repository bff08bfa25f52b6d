import { useEffect, useState } from 'preact/hooks';
import { api, followJob, ok, problemOf, saveText, type Job, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction, when } from '../ui';
import { KeyDetail, ShareAnalytics } from './key-detail';
import { Fragment } from 'preact';

type Key = Schemas['Key'];

export function JobProgress({ job }: { job: Job | undefined }) {
  if (!job) return null;
  const p = job.progress;
  const total = p?.bytes_total ?? 0;
  return (
    <p role="status" class="job" data-state={job.state}>
      Job <code>{job.job_id}</code> ({job.kind}): {job.state}
      {job.state === 'failed' && job.error && `: ${job.error.message}`}
      {total > 0 && <progress max={total} value={p?.bytes_done ?? 0} aria-label={`${job.kind} progress`} />}
    </p>
  );
}

export function Keys() {
  const [filters, setFilters] = useState<{ environment?: string; label?: string; active?: 'true' | 'false' }>({});
  const [keys, setKeys] = useState<Key[]>();
  const list = useAction();
  const generate = useAction();
  const row = useAction();
  const [job, setJob] = useState<Job>();
  const [open, setOpen] = useState<string>();
  const load = () => list.run(async () => setKeys((await ok(api.GET('/keys/list', { params: { query: { ...filters, page_size: 100 } } }))).items));
  useEffect(() => void load(), [filters]);

  return (
    <>
      <h1>Keys</h1>
      <form
        class="inline"
        role="search"
        aria-label="Filter keys"
        onSubmit={(e) => {
          const v = formValues(e);
          setFilters({ environment: v.environment || undefined, label: v.label || undefined, active: (v.active || undefined) as 'true' | 'false' | undefined });
        }}
      >
        <Field label="Environment" name="environment" action={list} />
        <Field label="Label" name="label" action={list} />
        <label>
          State
          <select name="active">
            <option value="">All</option>
            <option value="true">Active</option>
            <option value="false">Not active</option>
          </select>
        </label>
        <Submit action={list} class="secondary">
          Filter
        </Submit>
      </form>
      <ProblemText action={list} />
      <ProblemText action={row} />
      {keys && keys.length === 0 && <p>No keys yet: generate one below.</p>}
      {keys && keys.length > 0 && (
        <table>
          <caption class="muted">Your keys</caption>
          <thead>
            <tr>
              <th scope="col">Label</th>
              <th scope="col">Environment</th>
              <th scope="col">Fingerprint</th>
              <th scope="col">State</th>
              <th scope="col">Generation</th>
              <th scope="col">Expires</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {keys.map((k) => (
              <Fragment key={k.fingerprint}>
              <tr data-fingerprint={k.fingerprint}>
                <td>{k.label}</td>
                <td>{k.environment}</td>
                <td class="mono">{k.fingerprint}</td>
                <td>{k.status}</td>
                <td>{k.generation}</td>
                <td>{when(k.expires_at)}</td>
                <td class="actions">
                  <button type="button" class="secondary" aria-expanded={open === k.fingerprint} aria-label={`Details of ${k.label}`} onClick={() => setOpen(open === k.fingerprint ? undefined : k.fingerprint)}>
                    Details
                  </button>
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Public key (.asc) of ${k.label}`}
                    onClick={() =>
                      row.run(async () => {
                        const pk = await ok(api.POST('/keys/get-public-key', { body: { fingerprint: k.fingerprint } }));
                        saveText(`${k.label}-${k.fingerprint.slice(-16)}.asc`, pk.public_key, 'application/pgp-keys');
                      })
                    }
                  >
                    Public key (.asc)
                  </button>
                  {k.active && (
                    <button
                      type="button"
                      class="secondary"
                      aria-label={`Rotate ${k.label} now`}
                      onClick={() =>
                        row.run(async () => {
                          const started = await ok(api.POST('/keys/{fingerprint}/rotate', { params: { path: { fingerprint: k.fingerprint } }, body: {} }));
                          const done = await followJob(started.job_id, setJob);
                          await load();
                          return done.state === 'completed' ? `${k.label} rotated.` : undefined;
                        })
                      }
                    >
                      Rotate
                    </button>
                  )}
                  {k.active && (
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Disable ${k.label}`}
                      onClick={() =>
                        confirm(`Disable the key "${k.label}"? It stops encrypting and decrypting.`) &&
                        row.run(async () => {
                          await ok(api.POST('/keys/disable-key', { body: { fingerprint: k.fingerprint } }));
                          await load();
                          return `${k.label} disabled.`;
                        })
                      }
                    >
                      Disable
                    </button>
                  )}
                </td>
              </tr>
              {open === k.fingerprint && (
                <tr>
                  <td colSpan={7}>
                    <KeyDetail k={k} onChange={load} />
                  </td>
                </tr>
              )}
              </Fragment>
            ))}
          </tbody>
        </table>
      )}

      <h2>Generate a key</h2>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          const form = e.currentTarget as HTMLFormElement;
          void generate.run(async () => {
            const body = { label: v.label!, name: v.name!, email: v.email!, passphrase: v.passphrase!, algorithm: v.algorithm as 'curve25519' | 'rsa3072' | 'rsa4096', ...(v.environment ? { environment: v.environment } : {}) };
            const { data, error, response } = await api.POST('/keys/generate-key', { body });
            if (!response.ok) throw problemOf(response, error);
            form.reset();
            if (data && 'job_id' in data) {
              const done = await followJob(data.job_id, setJob);
              await load();
              return done.state === 'completed' ? `Key "${body.label}" generated.` : undefined;
            }
            await load();
            return `Key "${body.label}" generated.`;
          });
        }}
      >
        <Field label="Key label" name="label" required maxLength={100} action={generate} />
        <Field label="Environment (optional)" name="environment" action={generate} />
        <Field label="Name in the key" name="name" required maxLength={100} action={generate} />
        <Field label="Email in the key" name="email" type="email" required action={generate} />
        <Field label="Passphrase" name="passphrase" type="password" autocomplete="new-password" required minLength={12} maxLength={1024} hint="At least 12 characters; needed to decrypt. The service cannot recover it." action={generate} />
        <label>
          Algorithm
          <select name="algorithm">
            <option value="curve25519">Curve25519 (at once)</option>
            <option value="rsa3072">RSA 3072 (a job, seconds)</option>
            <option value="rsa4096">RSA 4096 (a job, seconds)</option>
          </select>
        </label>
        <Submit action={generate}>Generate</Submit>
        <ProblemText action={generate} />
      </form>
      <JobProgress job={job} />

      <h2>Sharing</h2>
      <ShareAnalytics />
    </>
  );
}
