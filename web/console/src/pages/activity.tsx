import { useEffect, useState } from 'preact/hooks';
import { API, api, ok, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction, when } from '../ui';

type Entry = Schemas['AuditEntry'];
interface LiveEvent {
  id: string;
  type: string;
  data?: Record<string, unknown>;
}

const PAGE_SIZE = 25;

export function Activity() {
  const action = useAction();
  const [query, setQuery] = useState<{ action?: string; status?: 'success' | 'failure'; page: number }>({ page: 1 });
  const [rows, setRows] = useState<{ items: Entry[]; total: number }>();
  const [live, setLive] = useState<LiveEvent[]>([]);
  const [connected, setConnected] = useState(false);
  const load = () => action.run(async () => setRows(await ok(api.GET('/audit-logs', { params: { query: { ...query, page_size: PAGE_SIZE } } }))));
  useEffect(() => void load(), [query]);

  useEffect(() => {
    // GET /events is a read: the session cookie alone signs it in (no header needed), so EventSource works.
    const source = new EventSource(`${API}/events`);
    source.onopen = () => setConnected(true);
    source.onerror = () => setConnected(false);
    const seen = (e: MessageEvent<string>) => {
      const event = JSON.parse(e.data) as LiveEvent;
      setLive((l) => [event, ...l].slice(0, 50));
    };
    const types = [
      'keys.generated',
      'keys.disabled',
      'keys.rotated',
      'keys.rotation_failed',
      'keys.expiry_warned',
      'keys.expired',
      'jobs.completed',
      'jobs.failed',
    ];
    for (const t of types) source.addEventListener(t, seen);
    return () => source.close();
  }, []);

  const pages = rows ? Math.max(1, Math.ceil(rows.total / PAGE_SIZE)) : 1;
  return (
    <>
      <h1>Activity</h1>
      <h2>Live</h2>
      <p class="muted" role="status">
        {connected ? 'Following events as they happen.' : 'Connecting to the event stream…'}
      </p>
      <ul class="live" aria-live="polite">
        {live.map((e) => (
          <li key={e.id} data-type={e.type}>
            <strong>{e.type}</strong> <span class="mono">{JSON.stringify(e.data ?? {})}</span>
          </li>
        ))}
      </ul>

      <h2>Audit log</h2>
      <form
        class="inline"
        role="search"
        aria-label="Filter the audit log"
        onSubmit={(e) => {
          const v = formValues(e);
          setQuery({ action: v.action || undefined, status: (v.status || undefined) as 'success' | 'failure' | undefined, page: 1 });
        }}
      >
        <Field label="Action" name="action" placeholder="key.generate" maxLength={64} action={action} />
        <label>
          Outcome
          <select name="status">
            <option value="">Any</option>
            <option value="success">Success</option>
            <option value="failure">Failure</option>
          </select>
        </label>
        <Submit action={action} class="secondary">
          Filter
        </Submit>
      </form>
      <ProblemText action={action} />
      {rows && (
        <>
          <table class="audit">
            <caption class="muted">
              {rows.total} entries; page {query.page} of {pages}
            </caption>
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Action</th>
                <th scope="col">Outcome</th>
                <th scope="col">Target</th>
                <th scope="col">Address</th>
              </tr>
            </thead>
            <tbody>
              {rows.items.map((r) => (
                <tr key={r.audit_id}>
                  <td>{when(r.created_at)}</td>
                  <td>{r.action}</td>
                  <td>{r.status}</td>
                  <td class="mono">{r.target ?? ''}</td>
                  <td>{r.ip ?? ''}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <p class="actions">
            <button type="button" class="secondary" disabled={query.page <= 1} onClick={() => setQuery({ ...query, page: query.page - 1 })}>
              Newer
            </button>
            <button type="button" class="secondary" disabled={query.page >= pages} onClick={() => setQuery({ ...query, page: query.page + 1 })}>
              Older
            </button>
          </p>
        </>
      )}
    </>
  );
}
