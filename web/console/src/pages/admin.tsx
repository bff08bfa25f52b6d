import { useEffect, useState } from 'preact/hooks';
import { api, CONSOLE_HEADER, ok, problemOf, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction } from '../ui';

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

export function Admin() {
  const action = useAction();
  const dashboard = useAction();
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
        <>
          <p>
            Version {status.version}, up {Math.round(status.uptime_seconds / 60)} min. Postgres {status.postgres.state}, Redis {status.redis.state}.
          </p>
          <table>
            <caption class="muted">Queues</caption>
            <thead>
              <tr>
                <th scope="col">Queue</th>
                <th scope="col">Details</th>
              </tr>
            </thead>
            <tbody>
              {status.queues.map((q) => (
                <tr key={q.queue}>
                  <td>{q.queue}</td>
                  <td class="mono">{JSON.stringify({ ...q, queue: undefined })}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
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

      <h2>Queue dashboard</h2>
      <p>Opens the BullMQ dashboard with this session (it gets its own cookie, scoped to the dashboard).</p>
      <button
        type="button"
        disabled={dashboard.busy}
        onClick={() =>
          dashboard.run(async () => {
            const res = await fetch('/admin/queues/session', { method: 'POST', headers: { [CONSOLE_HEADER]: '1' }, credentials: 'same-origin' });
            if (!res.ok) throw problemOf(res, await res.json().catch(() => undefined));
            location.assign('/admin/queues');
          })
        }
      >
        Open the queue dashboard
      </button>
      <ProblemText action={dashboard} />
    </>
  );
}
