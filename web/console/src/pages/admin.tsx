import { useEffect, useState } from 'preact/hooks';
import { api, ok, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction, when } from '../ui';

/** A flat object's numbers and strings as a definition list (nested values as JSON). */
function Facts({ of }: { of: Record<string, unknown> }) {
  return (
    <dl class="facts">
      {Object.entries(of).map(([k, v]) => (
        <div key={k}>
          <dt>{k.replaceAll('_', ' ')}</dt>
          <dd class="mono">{typeof v === 'string' ? v : JSON.stringify(v)}</dd>
        </div>
      ))}
    </dl>
  );
}

type QueueName = Schemas['QueueSummary']['queue'];
type JobState = 'waiting' | 'active' | 'delayed' | 'prioritized' | 'failed' | 'completed';
const COUNTED = ['waiting', 'active', 'delayed', 'prioritized', 'failed', 'completed'] as const;
const STATE_CHOICES: { value: JobState | ''; label: string }[] = [
  { value: '', label: 'All states' },
  ...COUNTED.map((s) => ({ value: s, label: s[0].toUpperCase() + s.slice(1) })),
];

/** The queues on BullMQ's own API: counts by state, one queue's recent jobs with their reasons, retry. */
function Queues() {
  const load = useAction();
  const jobsAction = useAction();
  const retry = useAction();
  const [queues, setQueues] = useState<Schemas['QueueSummary'][]>();
  const [dashboard, setDashboard] = useState<string>('off');
  const [shown, setShown] = useState<QueueName>();
  const [state, setState] = useState<JobState | ''>('failed');
  const [jobs, setJobs] = useState<Schemas['QueueJob'][]>();

  const refresh = () =>
    load.run(async () => {
      const body = await ok(api.GET('/admin/queues'));
      setQueues(body.queues);
      setDashboard(body.dashboard);
    });
  const showJobs = (queue: QueueName, which: JobState | '') =>
    jobsAction.run(async () => {
      const body = await ok(api.GET('/admin/queues/{queue}/jobs', { params: { path: { queue }, query: { state: which || undefined, limit: 20 } } }));
      setShown(queue);
      setJobs(body.jobs);
    });
  useEffect(() => void refresh(), []);

  return (
    <section aria-labelledby="queues-title">
      <h2 id="queues-title">Queues</h2>
      <ProblemText action={load} />
      {queues && (
        <table class="counts">
          <caption class="muted">Jobs by state in each queue</caption>
          <thead>
            <tr>
              <th scope="col">Queue</th>
              {COUNTED.map((s) => (
                <th scope="col" key={s}>
                  {s}
                </th>
              ))}
              <th scope="col">Jobs</th>
            </tr>
          </thead>
          <tbody>
            {queues.map((q) => (
              <tr key={q.queue}>
                <th scope="row">
                  {q.queue}
                  {q.paused && <span class="muted"> (paused)</span>}
                </th>
                {COUNTED.map((s) => (
                  <td key={s} data-label={s} class={s === 'failed' && q.counts.failed > 0 ? 'bad' : undefined}>
                    {q.counts[s]}
                  </td>
                ))}
                <td>
                  <button type="button" class="secondary" disabled={jobsAction.busy} onClick={() => void showJobs(q.queue, state)}>
                    Jobs of {q.queue}
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <button type="button" class="secondary" disabled={load.busy} onClick={() => void refresh()}>
        Refresh the counts
      </button>

      {shown && (
        <>
          <h3>Recent jobs of {shown}</h3>
          <label class="short">
            State
            <select
              value={state}
              onChange={(e) => {
                const which = e.currentTarget.value as JobState | '';
                setState(which);
                void showJobs(shown, which);
              }}
            >
              {STATE_CHOICES.map((c) => (
                <option key={c.value} value={c.value}>
                  {c.label}
                </option>
              ))}
            </select>
          </label>
          <ProblemText action={jobsAction} />
          <ProblemText action={retry} />
          {jobs && jobs.length === 0 && <p class="muted">No {state || ''} jobs in this queue (ended jobs are kept for a day).</p>}
          {jobs && jobs.length > 0 && (
            <table>
              <caption class="muted">Newest first</caption>
              <thead>
                <tr>
                  <th scope="col">Job</th>
                  <th scope="col">Kind</th>
                  <th scope="col">State</th>
                  <th scope="col">Attempts</th>
                  <th scope="col">Why it failed</th>
                  <th scope="col">Created</th>
                  <th scope="col">Ended</th>
                  <th scope="col">Action</th>
                </tr>
              </thead>
              <tbody>
                {jobs.map((j) => (
                  <tr key={j.job_id} data-job={j.job_id}>
                    <td class="mono" data-label="Job">
                      {j.job_id}
                    </td>
                    <td data-label="Kind">{j.name}</td>
                    <td data-label="State">{j.state}</td>
                    <td data-label="Attempts">{j.attempts_made}</td>
                    <td data-label="Why it failed" class="reason">
                      {j.failed_reason ?? '—'}
                    </td>
                    <td data-label="Created">{when(j.created_at)}</td>
                    <td data-label="Ended">{when(j.finished_at)}</td>
                    <td data-label="Action">
                      {j.state === 'failed' && (
                        <button
                          type="button"
                          disabled={retry.busy}
                          onClick={() =>
                            retry.run(async () => {
                              await ok(api.POST('/admin/queues/{queue}/jobs/{job_id}/retry', { params: { path: { queue: shown, job_id: j.job_id } } }));
                              await showJobs(shown, state);
                              void refresh();
                              return `Job ${j.job_id} is back in the queue ${shown}.`;
                            })
                          }
                        >
                          Retry job {j.job_id}
                        </button>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      )}

      {dashboard !== 'off' && (
        <p>
          <a href="/admin/queues">Open Bull Board</a> <span class="muted">(the BullMQ dashboard, {dashboard}; opens with this session)</span>
        </p>
      )}
    </section>
  );
}

export function Admin() {
  const action = useAction();
  const metrics = useAction();
  const [status, setStatus] = useState<Schemas['Status']>();
  const [health, setHealth] = useState<Record<string, unknown>>();
  const [keyMetrics, setKeyMetrics] = useState<Record<string, unknown>>();
  useEffect(
    () =>
      void action.run(async () => {
        setStatus(await ok(api.GET('/status')));
        setHealth(await ok(api.GET('/keys/health')));
      }),
    [],
  );
  return (
    <>
      <h1>Administration</h1>
      <ProblemText action={action} />
      {status && (
        <p>
          Version {status.version}, up {Math.round(status.uptime_seconds / 60)} min. Postgres {status.postgres.state}, Redis {status.redis.state}.{' '}
          {status.workers.length} worker process{status.workers.length === 1 ? '' : 'es'}.
        </p>
      )}
      <Queues />
      <h2>Key health</h2>
      {health && <Facts of={health} />}
      <form
        class="inline"
        onSubmit={(e) => {
          const v = formValues(e);
          void metrics.run(async () => setKeyMetrics(await ok(api.GET('/keys/{key_id}/metrics', { params: { path: { key_id: v.key_id } } }))));
        }}
      >
        <Field label="Key (fingerprint or lineage id)" name="key_id" required action={metrics} />
        <Submit action={metrics} class="secondary">
          Show its metrics
        </Submit>
      </form>
      <ProblemText action={metrics} />
      {keyMetrics && <Facts of={keyMetrics} />}
    </>
  );
}
