import { useEffect, useState } from 'preact/hooks';
import { api, followJob, ok, postForm, problemOf, saveText, type FormPart, type Job, type Schemas } from '../api';
import { confirmEnd, Field, formValues, ProblemText, Submit, useAction, useFieldError, when, type Action } from '../ui';
import { KeyDetail, PROFILE_NAMES, ShareAnalytics } from './key-detail';
import { Fragment } from 'preact';

type Key = Schemas['Key'];
type Profile = Key['profile'];

/** Why a failed job failed: its error's words, and its code unless they name it already; empty for any other job. */
export function failureOf(job: Job): string {
  if (job.state !== 'failed' || !job.error) return '';
  const { message, code } = job.error;
  return message.includes(code) ? message : `${message} (${code})`;
}

/** A job's state and progress; a failed job's bar turns to the error colour, stops where the job did, and its reason is said. */
export function JobProgress({ job }: { job: Job | undefined }) {
  if (!job) return null;
  const p = job.progress;
  const total = p?.bytes_total ?? 0;
  const failed = job.state === 'failed';
  return (
    <p role="status" class={failed ? 'job failed' : 'job'} data-state={job.state}>
      Job <code>{job.job_id}</code> ({job.kind}): {job.state}
      {failed && <span class="error failure">: {failureOf(job) || 'no reason given'}</span>}
      {total > 0 && (
        <progress
          class={failed ? 'failed' : undefined}
          max={total}
          value={p?.bytes_done ?? 0}
          aria-label={failed ? `${job.kind} progress, stopped: the job failed` : `${job.kind} progress`}
        />
      )}
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
  const keyError = useFieldError(action, 'key');
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
          <textarea name="key" rows={4} spellcheck={false} {...keyError.attrs} />
        </label>
        {keyError.message}
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

/**
 * A table of keys. An inherited key (a teammate's, through team access) names its owner and offers only
 * what the API grants a teammate: its public key (details, rotate and disable are the owner's: 404).
 */
function KeyTable(props: {
  caption: string;
  keys: Key[];
  row: Action;
  open: string | undefined;
  setOpen: (fingerprint: string | undefined) => void;
  reload: () => Promise<void>;
  onJob: (job: Job) => void;
}) {
  const { caption, keys, row, open, setOpen, reload: load, onJob: setJob } = props;
  const shared = keys.some((k) => k.inherited);
  return (
    <table>
      <caption class="muted">{caption}</caption>
      <thead>
        <tr>
          <th scope="col">Label</th>
          {shared && <th scope="col">Owner</th>}
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
              {shared && <td>{k.owner?.username ?? 'a former teammate'}</td>}
              <td>{k.environment}</td>
              <td class="mono">{k.fingerprint}</td>
              <td>
                {kindOf(k)}, {PROFILE_NAMES[k.profile]}
              </td>
              <td>{k.status}</td>
              <td>{k.generation}</td>
              <td>{when(k.expires_at)}</td>
              <td class="actions">
                {!k.inherited && (
                  <button
                    type="button"
                    class="secondary"
                    aria-expanded={open === k.fingerprint}
                    aria-label={`Details of ${k.label}`}
                    onClick={() => setOpen(open === k.fingerprint ? undefined : k.fingerprint)}
                  >
                    Details
                  </button>
                )}
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
                {k.active && k.kind === 'managed' && !k.inherited && (
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Rotate ${k.label} now`}
                    onClick={() =>
                      confirmEnd(
                        `Rotate "${k.label}" now?`,
                        `A new ${PROFILE_NAMES[k.rotation_profile]} generation encrypts from now on; generation ${k.generation} still decrypts its files but encrypts no more, and partners need the new public key.`,
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
                {k.active && !k.inherited && (
                  <button
                    type="button"
                    class="danger"
                    aria-label={`Disable ${k.label}`}
                    onClick={() =>
                      confirmEnd(
                        `Disable the key "${k.label}"?`,
                        'It stops encrypting and rotating for good (there is no undo); it still decrypts its files. Its share links stop answering and teammates linked to you lose it.',
                      ) &&
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
                <td colSpan={shared ? 9 : 8}>
                  <KeyDetail k={k} onChange={load} />
                </td>
              </tr>
            )}
          </Fragment>
        ))}
      </tbody>
    </table>
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
  const own = keys?.filter((k) => !k.inherited);
  const shared = keys?.filter((k) => k.inherited);

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
      {own && own.length === 0 && <p>No keys yet: generate one below.</p>}
      {own && own.length > 0 && <KeyTable caption="Your keys" keys={own} row={row} open={open} setOpen={setOpen} reload={load} onJob={setJob} />}
      {shared && shared.length > 0 && (
        <>
          <h2>Shared with you</h2>
          <p class="muted">
            Teammates' keys you inherit through team access: you encrypt to them, share them and download their public keys, and decrypt with the key's own
            passphrase. Rotation, schedules and disabling stay with their owner.
          </p>
          <KeyTable caption="Keys shared with you by teammates" keys={shared} row={row} open={open} setOpen={setOpen} reload={load} onJob={setJob} />
        </>
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
