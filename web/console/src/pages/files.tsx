import { useEffect, useState } from 'preact/hooks';
import { api, followJob, ok, outputUrl, uploadFiles, type Job, type Schemas, type UploadProgress } from '../api';
import { bytes, formValues, ProblemText, Submit, useAction } from '../ui';
import { JobProgress } from './keys';

type Mode = 'encrypt' | 'decrypt' | 'rewrap';

const MODES: Record<Mode, { label: string; done: string; path: '/keys/encrypt' | '/keys/decrypt' | '/keys/rewrap' }> = {
  encrypt: { label: 'Encrypt', done: 'encrypted', path: '/keys/encrypt' },
  decrypt: { label: 'Decrypt', done: 'decrypted', path: '/keys/decrypt' },
  rewrap: { label: 'Rewrap to the current generation', done: 'rewrapped', path: '/keys/rewrap' },
};

const RECENT = 10;

/** The account's recent file jobs, from the event history (the API has no job list): newest first. */
async function recentJobs(): Promise<Job[]> {
  const history = await ok(api.GET('/events/history', { params: { query: { types: 'job.completed,job.failed', page_size: RECENT } } }));
  const ids = [...new Set(history.items.map((e) => e.data.job_id).filter((id): id is string => typeof id === 'string'))];
  const jobs = await Promise.all(ids.map((job_id) => api.GET('/jobs/{job_id}', { params: { path: { job_id } } }).then((r) => r.data)));
  return jobs.filter((j): j is Job => j !== undefined && (j.kind === 'encrypt' || j.kind === 'decrypt' || j.kind === 'rewrap'));
}

export function Files() {
  const action = useAction();
  const [keys, setKeys] = useState<Schemas['Key'][]>([]);
  const [mode, setMode] = useState<Mode>('encrypt');
  const [files, setFiles] = useState<File[]>([]);
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
            const fields: Record<string, string> = mode === 'encrypt' ? { fingerprint: v.fingerprint! } : { fingerprint: v.fingerprint!, passphrase: v.passphrase! };
            const started = await uploadFiles(MODES[mode].path, fields, files, setUpload);
            remember(started);
            const done = await followJob(started.job_id, remember);
            return done.state === 'completed' ? `${files.length} file${files.length === 1 ? '' : 's'} ${MODES[mode].done}.` : undefined;
          });
        }}
      >
        <fieldset>
          <legend>What to do</legend>
          {(Object.keys(MODES) as Mode[]).map((m) => (
            <label class="check" key={m}>
              <input type="radio" name="mode" value={m} checked={mode === m} onChange={() => setMode(m)} /> {MODES[m].label}
            </label>
          ))}
        </fieldset>
        <label>
          Key
          <select name="fingerprint" required>
            {keys.map((k) => (
              <option key={k.fingerprint} value={k.fingerprint}>
                {k.label} ({k.environment}, …{k.fingerprint.slice(-16)})
              </option>
            ))}
          </select>
        </label>
        {mode !== 'encrypt' && (
          <label>
            Passphrase of the key
            <input type="password" name="passphrase" autocomplete="current-password" required maxLength={1024} />
          </label>
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
            </tr>
          </thead>
          <tbody>
            {recent.map((j) => (
              <tr key={j.job_id} data-job={j.job_id}>
                <td class="mono">{j.job_id}</td>
                <td>{j.kind}</td>
                <td>{j.state}</td>
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
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </>
  );
}
