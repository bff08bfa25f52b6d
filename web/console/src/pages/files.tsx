import { useEffect, useState } from 'preact/hooks';
import { api, followJob, ok, outputUrl, postForm, type FormPart, type Job, type Schemas, type UploadProgress } from '../api';
import { bytes, formValues, ProblemText, Submit, useAction, when } from '../ui';
import { failureOf, JobProgress } from './keys';

type Mode = 'encrypt' | 'decrypt' | 'rewrap' | 'sign' | 'verify';
type Key = Schemas['Key'];

const MODES: Record<Mode, { label: string; done: string }> = {
  encrypt: { label: 'Encrypt', done: 'encrypted' },
  decrypt: { label: 'Decrypt', done: 'decrypted' },
  rewrap: { label: 'Rewrap to the current generation', done: 'rewrapped' },
  sign: { label: 'Sign', done: 'signed' },
  verify: { label: 'Verify signatures', done: 'checked' },
};
const FILE_JOBS: readonly Job['kind'][] = ['encrypt', 'decrypt', 'rewrap', 'sign', 'verify'];

/** What the form holds besides its named text fields: the files, detached signatures, a signer's public key. */
interface Upload {
  files: File[];
  signatures: File[];
  publicKey?: File;
}

/**
 * Starts the mode's job: text fields first, then the small binary parts (signatures), files last, as
 * the API reads them. Each mode's field names are checked against its route's form (FormPart).
 */
function startJob(mode: Mode, v: Record<string, string>, up: Upload, onProgress: (p: UploadProgress) => void): Promise<Job> {
  const files = up.files.map((f) => ['files', f] as const);
  const yes = (name: string) => (v[name] ? 'true' : 'false');
  switch (mode) {
    case 'encrypt': {
      const parts: FormPart<'/keys/encrypt'>[] = [['fingerprint', v.fingerprint]];
      if (v.sign_with) parts.push(['sign_with', v.sign_with], ['passphrase', v.passphrase]);
      return postForm('/keys/encrypt', [...parts, ...files], onProgress);
    }
    case 'decrypt': {
      const parts: FormPart<'/keys/decrypt'>[] = [
        ['fingerprint', v.fingerprint],
        ['passphrase', v.passphrase],
      ];
      if (v.verify_with) parts.push(['verify_with', v.verify_with]);
      if (v.require_signature) parts.push(['require_signature', 'true']);
      return postForm('/keys/decrypt', [...parts, ...files], onProgress);
    }
    case 'rewrap':
      return postForm('/keys/rewrap', [['fingerprint', v.fingerprint], ['passphrase', v.passphrase], ...files], onProgress);
    case 'sign':
      return postForm(
        '/keys/sign',
        [['fingerprint', v.fingerprint], ['passphrase', v.passphrase], ['detached', yes('detached')], ['armor', yes('armor')], ...files],
        onProgress,
      );
    case 'verify': {
      const signer: FormPart<'/keys/verify'> = up.publicKey ? ['public_key', up.publicKey] : ['fingerprint', v.fingerprint];
      return postForm('/keys/verify', [signer, ...up.signatures.map((f) => ['signatures', f] as const), ...files], onProgress);
    }
  }
}

/** Each file's signature verdict (verify, and decrypt with a key to verify with). */
function SignatureChecks({ checks }: { checks: Schemas['SignatureCheck'][] | undefined }) {
  if (!checks?.length) return null;
  return (
    <ul class="signatures">
      {checks.map((c) => (
        <li key={c.n} data-valid={String(c.valid)}>
          {c.name}:{' '}
          {c.valid ? (
            <>
              <strong class="notice">valid</strong>, signed by <span class="mono">{c.signer_fingerprint}</span> at {when(c.signed_at)}
            </>
          ) : (
            <>
              <strong class="error">not valid</strong> ({c.reason})
              {c.signer_fingerprint && (
                <>
                  , signer <span class="mono">{c.signer_fingerprint}</span>
                </>
              )}
            </>
          )}
        </li>
      ))}
    </ul>
  );
}

/** The keys a mode may name: a recipient key (someone's public key) encrypts and verifies only. */
const usable = (mode: Mode, keys: Key[]) => (mode === 'encrypt' || mode === 'verify' ? keys : keys.filter((k) => k.kind === 'managed'));

function KeyOptions({ keys }: { keys: Key[] }) {
  return (
    <>
      {keys.map((k) => (
        <option key={k.fingerprint} value={k.fingerprint}>
          {k.label} ({k.environment}
          {k.kind === 'recipient' ? ', recipient' : ''}, …{k.fingerprint.slice(-16)})
        </option>
      ))}
    </>
  );
}

const RECENT = 10;

/** The account's recent file jobs, from the event history (the API has no job list): newest first. */
async function recentJobs(): Promise<Job[]> {
  const history = await ok(api.GET('/events/history', { params: { query: { types: 'jobs.completed,jobs.failed', page_size: RECENT } } }));
  const ids = [...new Set(history.items.map((e) => e.data.job_id).filter((id): id is string => typeof id === 'string'))];
  const jobs = await Promise.all(ids.map((job_id) => api.GET('/jobs/{job_id}', { params: { path: { job_id } } }).then((r) => r.data)));
  return jobs.filter((j): j is Job => j !== undefined && FILE_JOBS.includes(j.kind));
}

export function Files() {
  const action = useAction();
  const [keys, setKeys] = useState<Schemas['Key'][]>([]);
  const [mode, setMode] = useState<Mode>('encrypt');
  const [files, setFiles] = useState<File[]>([]);
  const [signatures, setSignatures] = useState<File[]>([]);
  const [publicKey, setPublicKey] = useState<File>();
  const [signWith, setSignWith] = useState('');
  const [over, setOver] = useState(false);
  const [upload, setUpload] = useState<UploadProgress>();
  const [job, setJob] = useState<Job>();
  const [recent, setRecent] = useState<Job[]>([]);
  useEffect(
    () =>
      void action.run(async () => {
        setKeys((await ok(api.GET('/keys/list', { params: { query: { active: 'true', page_size: 100 } } }))).items);
        const earlier = await recentJobs();
        setRecent((mine) => [...mine, ...earlier.filter((j) => !mine.some((m) => m.job_id === j.job_id))]);
      }),
    [],
  );

  const changeMode = (m: Mode) => {
    setMode(m);
    setSignatures([]);
    setPublicKey(undefined);
  };
  const remember = (j: Job) => {
    setJob(j);
    setRecent((list) => (list.some((r) => r.job_id === j.job_id) ? list.map((r) => (r.job_id === j.job_id ? j : r)) : [j, ...list]));
  };

  return (
    <>
      <h1>Files</h1>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            if (!files.length) return 'Choose or drop at least one file first.';
            const started = await startJob(mode, v, { files, signatures, publicKey }, setUpload);
            remember(started);
            const done = await followJob(started.job_id, remember);
            if (done.state !== 'completed') return undefined;
            const checks = done.result?.signatures;
            const verdict = checks?.length ? ` Signatures: ${checks.filter((c) => c.valid).length} of ${checks.length} valid.` : '';
            return `${files.length} file${files.length === 1 ? '' : 's'} ${MODES[mode].done}.${verdict}`;
          });
        }}
      >
        <fieldset>
          <legend>What to do</legend>
          {(Object.keys(MODES) as Mode[]).map((m) => (
            <label class="check" key={m}>
              <input type="radio" name="mode" value={m} checked={mode === m} onChange={() => changeMode(m)} /> {MODES[m].label}
            </label>
          ))}
        </fieldset>
        <label>
          Key
          <select name="fingerprint" required={!(mode === 'verify' && publicKey)}>
            <KeyOptions keys={usable(mode, keys)} />
          </select>
        </label>
        {mode === 'encrypt' && (
          <label>
            Sign with (optional)
            <select name="sign_with" value={signWith} onChange={(e) => setSignWith(e.currentTarget.value)}>
              <option value="">Do not sign</option>
              <KeyOptions keys={usable('sign', keys)} />
            </select>
          </label>
        )}
        {(mode !== 'encrypt' && mode !== 'verify') || (mode === 'encrypt' && signWith) ? (
          <label>
            {mode === 'encrypt' ? 'Passphrase of the signing key' : 'Passphrase of the key'}
            <input type="password" name="passphrase" autocomplete="current-password" required maxLength={1024} />
          </label>
        ) : null}
        {mode === 'decrypt' && (
          <>
            <label>
              Verify with (optional)
              <select name="verify_with">
                <option value="">Do not verify</option>
                <KeyOptions keys={keys} />
              </select>
            </label>
            <label class="check">
              <input type="checkbox" name="require_signature" /> Require a valid signature (a file without one fails, and nothing is published)
            </label>
          </>
        )}
        {mode === 'sign' && (
          <>
            <label class="check">
              <input type="checkbox" name="detached" defaultChecked /> Detached signatures (unchecked: a signed message holding each file)
            </label>
            <label class="check">
              <input type="checkbox" name="armor" /> ASCII armor (.asc)
            </label>
          </>
        )}
        {mode === 'verify' && (
          <>
            <label>
              Or the signer's public key file (instead of a stored key)
              <input
                type="file"
                name="public_key"
                accept=".asc,.gpg,.pgp,.key,application/pgp-keys"
                onChange={(e) => setPublicKey(e.currentTarget.files?.[0])}
              />
            </label>
            <label>
              Detached signatures (one per file, in the order of the files; none for signed messages)
              <input type="file" name="signatures" multiple accept=".sig,.asc" onChange={(e) => setSignatures([...(e.currentTarget.files ?? [])])} />
            </label>
          </>
        )}
        <div
          class={over ? 'drop over' : 'drop'}
          onDragOver={(e) => {
            e.preventDefault();
            setOver(true);
          }}
          onDragLeave={() => setOver(false)}
          onDrop={(e) => {
            e.preventDefault();
            setOver(false);
            setFiles([...(e.dataTransfer?.files ?? [])]);
          }}
        >
          <label>
            Files (choose, or drop them here)
            <input type="file" name="files" multiple onChange={(e) => setFiles([...(e.currentTarget.files ?? [])])} />
          </label>
          {files.length > 0 && (
            <p class="muted">
              {files.length} file{files.length === 1 ? '' : 's'}, {bytes(files.reduce((n, f) => n + f.size, 0))}
            </p>
          )}
          {mode === 'verify' && signatures.length > 0 && (
            <ol class="pairs muted" aria-label="Files and their signatures">
              {files.map((f, i) => (
                <li key={i}>
                  {f.name} ← {signatures[i]?.name ?? 'no signature'}
                </li>
              ))}
            </ol>
          )}
        </div>
        <Submit action={action}>{MODES[mode].label}</Submit>
        <ProblemText action={action} />
      </form>
      {upload && upload.total > 0 && (
        <p>
          Upload: {bytes(upload.loaded)} of {bytes(upload.total)} <progress max={upload.total} value={upload.loaded} aria-label="Upload progress" />
        </p>
      )}
      <JobProgress job={job} />

      <h2>Recent jobs</h2>
      {recent.length === 0 ? (
        <p class="muted">No file jobs yet.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th scope="col">Job</th>
              <th scope="col">Kind</th>
              <th scope="col">State</th>
              <th scope="col">Outputs</th>
              <th scope="col">Signatures</th>
            </tr>
          </thead>
          <tbody>
            {recent.map((j) => (
              <tr key={j.job_id} data-job={j.job_id}>
                <td class="mono">{j.job_id}</td>
                <td>{j.kind}</td>
                <td>
                  {j.state}
                  {j.state === 'failed' && <span class="error failure">: {failureOf(j) || 'no reason given'}</span>}
                </td>
                <td>
                  <ul class="outputs">
                    {(j.result?.files ?? []).map((f) => (
                      <li key={f.n}>
                        <a href={outputUrl(j.job_id, f.n)} download={f.name}>
                          {f.name}
                        </a>{' '}
                        <span class="muted">({bytes(f.size)})</span>
                      </li>
                    ))}
                  </ul>
                </td>
                <td>
                  <SignatureChecks checks={j.result?.signatures} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </>
  );
}
