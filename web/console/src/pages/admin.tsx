import { useEffect, useState } from 'preact/hooks';
import { api, CONSOLE_HEADER, ok, problemOf, type Schemas } from '../api';
import { ProblemText, useAction } from '../ui';

export function Admin() {
  const action = useAction();
  const dashboard = useAction();
  const [status, setStatus] = useState<Schemas['Status']>();
  useEffect(() => void action.run(async () => setStatus(await ok(api.GET('/status')))), []);
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
