import { useEffect, useId, useState } from 'preact/hooks';
import { api, followJob, ok, postForm, problemOf, saveText, type FormPart, type Job, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction, when } from '../ui';
import { KeyDetail, PROFILE_NAMES, ShareAnalytics } from './key-detail';
import { Fragment } from 'preact';

type Key = Schemas['Key'];
type Profile = Key['profile'];

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

/** A managed key holds its private key; a recipient key is someone else's public key (encrypt and verify only). */
const kindOf = (k: Key) => (k.kind === 'recipient' ? 'recipient (public key only)' : k.imported ? 'managed (imported)' : 'managed');

/** POST /keys/import: a secret key becomes a managed key, a public key a recipient key. */
function ImportKey({ onImported }: { onImported: () => void }) {
  const action = useAction();
  const [file, setFile] = useState<File>();
  const [imported, setImported] = useState<Key>();
  const keyError = useId();
  return (
    <>
      <h2>Import a key</h2>
      <p class="muted">
        A secret key (gpg --export-secret-keys, sq key generate) becomes a managed key; a public key becomes a recipient key, which encrypts and verifies but
        never decrypts, signs or rotates.
      </p>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          const form = e.currentTarget;
          void action.run(async () => {
            const parts: FormPart<'/keys/import'>[] = [['label', v.label]];
            if (v.environment) parts.push(['environment', v.environment]);
            if (v.key_passphrase) parts.push(['key_passphrase', v.key_passphrase]);
            if (v.passphrase) parts.push(['passphrase', v.passphrase]);
            if (file) parts.push(['key', file]);
            else if (v.key) parts.push(['key', v.key]);
            else return 'Choose a key file or paste an armored key first.';
            const key = await postForm<'/keys/import', Key>('/keys/import', parts);
            setImported(key);
            setFile(undefined);
            form.reset();
            onImported();
            return `Key "${key.label}" imported as a ${key.kind} key.`;
          });
        }}
      >
        <label>
          Key file (armored or binary)
          <input type="file" name="key_file" accept=".asc,.gpg,.pgp,.key,application/pgp-keys" onChange={(e) => setFile(e.currentTarget.files?.[0])} />
        </label>
        <label>
          Or paste an armored key
          <textarea
            name="key"
            rows={4}
            spellcheck={false}
            aria-invalid={action.fields.key ? 'true' : undefined}
            aria-describedby={action.fields.key ? keyError : undefined}
          />
        </label>
        {action.fields.key && (
          <span class="field-error" id={keyError}>
            {action.fields.key}
          </span>
        )}
        <Field label="Label of the imported key" name="label" required maxLength={100} action={action} />
        <Field label="Its environment (optional; default production)" name="environment" action={action} />
        <Field
          label="Passphrase the key has now (if protected)"
          name="key_passphrase"
          type="password"
          autocomplete="off"
          maxLength={1024}
          hint="Used once to unlock it; never stored."
          action={action}
        />
        <Field
          label="New passphrase here (secret keys)"
          name="passphrase"
          type="password"
          autocomplete="new-password"
          minLength={12}
          maxLength={1024}
          hint="At least 12 characters; needed to decrypt and sign. Not needed for a public key."
          action={action}
        />
        <Submit action={action}>Import</Submit>
        <ProblemText action={action} />
      </form>
      {imported && (
        <dl class="facts imported" aria-label="Imported key">
          <div>
            <dt>Label</dt>
            <dd>{imported.label}</dd>
          </div>
          <div>
            <dt>Kind</dt>
            <dd>{kindOf(imported)}</dd>
          </div>
          <div>
            <dt>Fingerprint</dt>
            <dd class="mono">{imported.fingerprint}</dd>
          </div>
          <div>
            <dt>User id</dt>
            <dd>{imported.uid}</dd>
          </div>
          <div>
            <dt>Algorithm</dt>
            <dd>{imported.algorithm}</dd>
          </div>
          <div>
            <dt>Environment</dt>
            <dd>{imported.environment}</dd>
          </div>
          <div>
            <dt>Expires</dt>
            <dd>{when(imported.expires_at)}</dd>
          </div>
        </dl>
      )}
    </>
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
              <th scope="col">Kind</th>
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
                  <td>
                    {kindOf(k)}, {PROFILE_NAMES[k.profile]}
                  </td>
                  <td>{k.status}</td>
                  <td>{k.generation}</td>
                  <td>{when(k.expires_at)}</td>
                  <td class="actions">
                    <button
                      type="button"
                      class="secondary"
                      aria-expanded={open === k.fingerprint}
                      aria-label={`Details of ${k.label}`}
                      onClick={() => setOpen(open === k.fingerprint ? undefined : k.fingerprint)}
                    >
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
                    {k.active && k.kind === 'managed' && (
                      <button
                        type="button"
                        class="secondary"
                        aria-label={`Rotate ${k.label} now`}
                        onClick={() =>
                          confirm(
                            `Rotate "${k.label}" now? A new ${PROFILE_NAMES[k.rotation_profile]} generation encrypts from now on; generation ${k.generation} still decrypts its files.`,
                          ) &&
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
                    <td colSpan={8}>
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
          const form = e.currentTarget;
          void generate.run(async () => {
            const [profile, algorithm] = v.type.split(':') as [Profile, 'curve25519' | 'rsa3072' | 'rsa4096' | undefined];
            const body = {
              label: v.label,
              name: v.name,
              email: v.email,
              passphrase: v.passphrase,
              profile,
              ...(algorithm ? { algorithm } : {}),
              ...(v.environment ? { environment: v.environment } : {}),
            };
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
        <Field
          label="Passphrase"
          name="passphrase"
          type="password"
          autocomplete="new-password"
          required
          minLength={12}
          maxLength={1024}
          hint="At least 12 characters; needed to decrypt. The service cannot recover it."
          action={generate}
        />
        <label>
          Key type
          <select name="type" aria-describedby="key-type-hint">
            <option value="rfc4880:curve25519">v4 Curve25519: every OpenPGP tool reads it (gpg 2.2 and later)</option>
            <option value="rfc9580">v6 Ed25519/X25519: AEAD files (OpenPGP.js 6, Sequoia 2, Bouncy Castle; not GnuPG)</option>
            <option value="pqc">v6 post-quantum: ML-KEM-768 + X25519 (RFC 9980 readers)</option>
            <option value="rfc4880:rsa3072">v4 RSA 3072 (a job, seconds)</option>
            <option value="rfc4880:rsa4096">v4 RSA 4096 (a job, seconds)</option>
          </select>
        </label>
        <p id="key-type-hint" class="muted">
          Pick v4 when partners decrypt with gpg 2.2 or other older tools; post-quantum for files kept for years. A rotation can move a key to another type
          later.
        </p>
        <Submit action={generate}>Generate</Submit>
        <ProblemText action={generate} />
      </form>
      <JobProgress job={job} />

      <ImportKey onImported={load} />

      <h2>Sharing</h2>
      <ShareAnalytics />
    </>
  );
}
