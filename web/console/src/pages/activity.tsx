import { useEffect, useState } from 'preact/hooks';
import { EVENT_TYPES } from '../../../../client/openapi';
import { API, api, ok, type Schemas } from '../api';
import { Field, formValues, ProblemText, Submit, useAction, when } from '../ui';

type Entry = Schemas['AuditEntry'];
type ActionName = Schemas['AuditActions']['actions'][number];
interface LiveEvent {
  id: string;
  type: string;
  created_at?: string;
  data?: Record<string, unknown>;
}

/** The facts of an event worth a line, in words: what it names and how it ended, never raw JSON. */
function eventFacts(e: LiveEvent): string {
  const d = e.data ?? {};
  const text = (k: string) => (typeof d[k] === 'string' && d[k] ? d[k] : undefined);
  const fingerprint = text('fingerprint');
  return [
    text('label'),
    fingerprint && `key …${fingerprint.slice(-16)}`,
    text('kind'),
    text('action'),
    text('state') ?? text('status'),
    text('code') ?? text('reason'),
  ]
    .filter(Boolean)
    .join(', ');
}

const PAGE_SIZE = 25;

export function Activity() {
  const action = useAction();
  const [query, setQuery] = useState<{ action?: string; status?: 'success' | 'failure'; page: number }>({ page: 1 });
  const [rows, setRows] = useState<{ items: Entry[]; total: number }>();
  const [live, setLive] = useState<LiveEvent[]>([]);
  const [connected, setConnected] = useState(false);
  const [actions, setActions] = useState<ActionName[]>([]);
  useEffect(
    () =>
      void ok(api.GET('/audit-logs/actions')).then(
        (r) => setActions(r.actions),
        () => undefined,
      ),
    [],
  );
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
    for (const t of EVENT_TYPES) source.addEventListener(t, seen);
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
            {e.created_at && <time dateTime={e.created_at}>{when(e.created_at)}</time>} <strong>{e.type}</strong>
            {eventFacts(e) && <span> — {eventFacts(e)}</span>}
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
        <Field
          label="Action"
          name="action"
          placeholder="keys.rotate"
          hint="An action, or a prefix ending in . or * (keys.*)"
          list="audit-actions"
          maxLength={64}
          action={action}
        />
        <datalist id="audit-actions">
          {[...new Set(actions.map((a) => `${a.name.split('.')[0]}.*`))].map((prefix) => (
            <option key={prefix} value={prefix}>
              Every {prefix.slice(0, -2).replace(/_/g, ' ')} action
            </option>
          ))}
          {actions.map((a) => (
            <option key={a.name} value={a.name}>
              {a.label}
            </option>
          ))}
        </datalist>
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
                  <td title={r.target ?? undefined} class={r.target_label ? undefined : 'mono'}>
                    {r.target_label ?? r.target ?? ''}
                  </td>
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
