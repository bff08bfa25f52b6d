import { useEffect, useState } from 'preact/hooks';
import { ShareLink } from '../share-link';
import { api, ok, type Schemas } from '../api';
import { confirmEnd, Field, formValues, ProblemText, Submit, useAction, when, wholeNumber } from '../ui';

type Key = Schemas['Key'];

/** How the console names a profile (lib/pgp/profiles.ts). */
export const PROFILE_NAMES: Record<Key['profile'], string> = { rfc4880: 'v4', rfc9580: 'v6', pqc: 'v6 post-quantum' };

/** The destruction waiting period the API accepts (days), and its default. */
const DESTRUCTION_WAIT = { min: 7, max: 30, default: 30 };
/** The rotation interval the API accepts (days; api/routes/profile/account-profile.ts). */
const ROTATION_DAYS = { min: 1, max: 730 };

/** One key's lifecycle: rotation schedule, generations and their destruction, rotation history, share links. */
export function KeyDetail({ k, onChange }: { k: Key; onChange: () => void }) {
  const action = useAction();
  const path = { fingerprint: k.fingerprint };
  const [generations, setGenerations] = useState<Schemas['KeyGeneration'][]>([]);
  const [lifecycle, setLifecycle] = useState<{ destroy_after: string | null; min_decryption_generation: number }>();
  const [history, setHistory] = useState<Schemas['RotationEntry'][]>([]);
  const [shares, setShares] = useState<Schemas['KeyShare'][]>([]);
  const [link, setLink] = useState<string>();
  const [waitingDays, setWaitingDays] = useState(DESTRUCTION_WAIT.default);
  const load = () =>
    action.run(async () => {
      const g = await ok(api.GET('/keys/{fingerprint}/generations', { params: { path, query: { page_size: 100 } } }));
      setGenerations(g.items);
      setLifecycle({ destroy_after: g.destroy_after, min_decryption_generation: g.min_decryption_generation });
      setHistory((await ok(api.GET('/keys/{fingerprint}/rotation-history', { params: { path, query: { page_size: 20 } } }))).items);
      setShares((await ok(api.GET('/keys/share/', { params: { query: { fingerprint: k.fingerprint, page_size: 50 } } }))).items);
    });
  useEffect(() => void load(), [k.fingerprint]);
  const destroy = (generation: number | undefined, waitingDays: number) =>
    action.run(async () => {
      const d = await ok(
        api.POST('/keys/{fingerprint}/destruction', { params: { path }, body: { waiting_days: waitingDays, ...(generation ? { generation } : {}) } }),
      );
      await load();
      onChange();
      return `${generation ? `Generation ${generation}` : 'The whole key'} will be destroyed after ${when(d.destroy_after)}; until then it can be cancelled.`;
    });
  /** Generations below `min` are retired: they decrypt and rewrap no more (lowering it again undoes that). */
  const retireBelow = (min: number, said: string) =>
    action.run(async () => {
      await ok(api.PATCH('/keys/{fingerprint}/settings', { params: { path }, body: { min_decryption_generation: min } }));
      await load();
      return said;
    });
  const cancel = (generation: number | undefined) =>
    action.run(async () => {
      await ok(api.DELETE('/keys/{fingerprint}/destruction', { params: { path, query: generation ? { generation } : {} } }));
      await load();
      onChange();
      return 'Destruction cancelled.';
    });

  return (
    <section class="key-detail" aria-label={`Details of ${k.label}`}>
      {k.kind === 'managed' && (
        <>
          <h3>Rotation schedule</h3>
          <form
            class="inline"
            onSubmit={(e) => {
              const v = formValues(e);
              void action.run(async () => {
                const days = v.rotation_interval_days.trim();
                // Only an empty field turns scheduled rotation off: anything else not a number in range is refused here.
                const body =
                  days === 'policy'
                    ? { use_account_policy: true as const }
                    : { rotation_interval_days: days ? wholeNumber('rotation_interval_days', days, ROTATION_DAYS) : null };
                const s = await ok(api.POST('/keys/{fingerprint}/rotation-schedule', { params: { path }, body }));
                return s.next_rotation_at
                  ? `Next rotation ${when(s.next_rotation_at)} (${s.mode}).`
                  : `Scheduled rotation is ${s.mode === 'off' ? 'off' : s.mode}.`;
              });
            }}
          >
            <Field label="Rotate every (days; empty: off; 'policy': the account's)" name="rotation_interval_days" maxLength={6} action={action} />
            <Submit action={action} class="secondary">
              Set the schedule
            </Submit>
          </form>
          <form
            class="inline"
            onSubmit={(e) => {
              const profile = formValues(e).profile as Key['profile'];
              void action.run(async () => {
                await ok(api.POST('/keys/{fingerprint}/rotation-schedule', { params: { path }, body: { profile } }));
                onChange();
                return `Rotations from now on make ${PROFILE_NAMES[profile]} generations.`;
              });
            }}
          >
            <label>
              Next generations ({PROFILE_NAMES[k.profile]} now)
              <select name="profile" value={k.rotation_profile}>
                <option value="rfc4880">v4: every OpenPGP tool</option>
                <option value="rfc9580">v6: AEAD files</option>
                <option value="pqc">v6 post-quantum</option>
              </select>
            </label>
            <Submit action={action} class="secondary">
              Set the key type
            </Submit>
          </form>
        </>
      )}

      <h3>Generations</h3>
      {lifecycle && lifecycle.min_decryption_generation > 1 && (
        <p class="retired-note">Generations below {lifecycle.min_decryption_generation} are retired: they no longer decrypt or rewrap until brought back.</p>
      )}
      <Field
        label={`Waiting period before a destruction (days, ${DESTRUCTION_WAIT.min}–${DESTRUCTION_WAIT.max})`}
        name="waiting_days"
        type="number"
        min={DESTRUCTION_WAIT.min}
        max={DESTRUCTION_WAIT.max}
        value={String(waitingDays)}
        onInput={(e) => setWaitingDays(Number(e.currentTarget.value))}
        action={action}
      />
      <table class="generations">
        <thead>
          <tr>
            <th scope="col">Generation</th>
            <th scope="col">Fingerprint</th>
            <th scope="col">State</th>
            <th scope="col">Created</th>
            <th scope="col">Last decrypt</th>
            <th scope="col">Safe to retire</th>
            <th scope="col">Destroyed after</th>
            <th scope="col">Actions</th>
          </tr>
        </thead>
        <tbody>
          {generations.map((g) => (
            <tr key={g.generation} data-generation={g.generation}>
              <td>{g.generation}</td>
              <td class="mono">{g.fingerprint}</td>
              <td>{g.status}</td>
              <td>{when(g.created_at)}</td>
              <td>{when(g.usage.last_decrypt_at)}</td>
              <td>{g.status === 'rotated' ? (g.safe_to_retire ? 'yes' : 'not yet (rotated or used recently)') : '—'}</td>
              <td>{when(g.destroy_after)}</td>
              <td class="actions">
                {g.status === 'rotated' && (
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Retire generation ${g.generation}`}
                    onClick={() =>
                      confirm(
                        `Retire generation ${g.generation}${g.generation > 1 ? ' and the older ones' : ''}? Files encrypted to it can no longer be decrypted until it is brought back.`,
                      ) && retireBelow(g.generation + 1, `Generations up to ${g.generation} retired.`)
                    }
                  >
                    Retire
                  </button>
                )}
                {g.status === 'retired' && (
                  <>
                    <button
                      type="button"
                      class="secondary"
                      aria-label={`Bring back generation ${g.generation}`}
                      onClick={() => retireBelow(g.generation, `Generation ${g.generation} decrypts again.`)}
                    >
                      Bring back
                    </button>
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Destroy generation ${g.generation}`}
                      onClick={() =>
                        confirm(`Destroy generation ${g.generation} after ${waitingDays} days? Data encrypted to it can no longer be decrypted then.`) &&
                        destroy(g.generation, waitingDays)
                      }
                    >
                      Destroy ({waitingDays}-day wait)
                    </button>
                  </>
                )}
                {g.status === 'pending_destruction' && (
                  <button type="button" class="secondary" aria-label={`Cancel destruction of generation ${g.generation}`} onClick={() => cancel(g.generation)}>
                    Cancel destruction
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {lifecycle?.destroy_after ? (
        <p class="warning">
          The whole key is scheduled for destruction after {when(lifecycle.destroy_after)}.{' '}
          <button type="button" class="secondary" onClick={() => cancel(undefined)}>
            Cancel
          </button>
        </p>
      ) : (
        <p>
          <button
            type="button"
            class="danger"
            onClick={() => confirm(`Destroy the key "${k.label}" and every generation after a ${waitingDays}-day wait?`) && destroy(undefined, waitingDays)}
          >
            Destroy the whole key ({waitingDays}-day wait)
          </button>
        </p>
      )}

      <h3>Rotation history</h3>
      {history.length === 0 ? (
        <p class="muted">Never rotated.</p>
      ) : (
        <ul class="history">
          {history.map((h) => (
            <li key={h.rotation_id}>
              {when(h.created_at)}: generation {h.from_generation} → {h.new_fingerprint ? <span class="mono">{h.new_fingerprint}</span> : '—'} ({h.trigger},{' '}
              {h.status})
            </li>
          ))}
        </ul>
      )}

      <h3>Share links</h3>
      <form
        class="inline"
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            const made = await ok(
              api.POST('/keys/share/create', {
                body: {
                  fingerprint: k.fingerprint,
                  ...(v.hours ? { expires_in_hours: Number(v.hours) } : {}),
                  ...(v.recipient ? { recipient_email: v.recipient } : {}),
                },
              }),
            );
            setLink(made.url);
            await load();
            return v.recipient ? `Share link created and mailed to ${v.recipient}.` : 'Share link created.';
          });
        }}
      >
        <Field label="Valid for (hours, optional)" name="hours" type="number" min={1} max={8760} action={action} />
        <Field label="Notify by email (optional)" name="recipient" type="email" action={action} />
        <Submit action={action} class="secondary">
          Create a share link
        </Submit>
      </form>
      {link && (
        <p>
          New link: <ShareLink url={link} name="the new share link" />
        </p>
      )}
      <ul class="shares">
        {shares.map((s) => (
          <li key={s.share_id}>
            {s.state}, {s.view_count} view(s){s.recipient_email ? `, sent to ${s.recipient_email}` : ''}, until {when(s.expires_at)}{' '}
            {s.url && <ShareLink url={s.url} name={`the share link made ${when(s.created_at)}`} />}{' '}
            {s.state === 'active' && (
              <button
                type="button"
                class="secondary"
                onClick={() =>
                  confirmEnd('Revoke this share link?', 'Whoever has the link can no longer fetch the public key through it.') &&
                  action.run(async () => {
                    await ok(api.DELETE('/keys/share/{share_id}', { params: { path: { share_id: s.share_id } } }));
                    await load();
                    return 'Share link revoked.';
                  })
                }
              >
                Revoke
              </button>
            )}
          </li>
        ))}
      </ul>
      <ProblemText action={action} />
    </section>
  );
}

/** The account's share analytics: totals and the last 30 days' views. */
export function ShareAnalytics() {
  const action = useAction();
  const [a, setA] = useState<Schemas['KeyShareAnalytics']>();
  useEffect(() => void action.run(async () => setA(await ok(api.GET('/keys/share/analytics')))), []);
  if (!a) return <ProblemText action={action} />;
  const last30 = a.views_by_day.reduce((n, d) => n + d.views, 0);
  return (
    <>
      <p>
        Share links: {a.totals.shares} ({a.totals.active} active, {a.totals.revoked} revoked, {a.totals.expired} expired, {a.totals.exhausted} used up);{' '}
        {a.totals.views} views, {last30} in the last 30 days.
      </p>
      <ViewsChart days={a.views_by_day} total={last30} />
    </>
  );
}

const CHART = { width: 360, height: 120, gap: 2, base: 110 };

/**
 * Views per UTC day as bars, oldest on the left, scaled to the busiest day; it scales down with its box
 * (fits 390 px). The picture is named by its totals, and a visually hidden table gives each day's count.
 */
function ViewsChart({ days, total }: { days: { day: string; views: number }[]; total: number }) {
  const max = Math.max(1, ...days.map((d) => d.views));
  const step = CHART.width / Math.max(1, days.length);
  const busiest = days.reduce((b, d) => (d.views > b.views ? d : b), days[0] ?? { day: '', views: 0 });
  const summary = `Share link views per day, last ${days.length} days: ${total} in all${busiest?.views ? `, most on ${busiest.day} (${busiest.views})` : ''}.`;
  return (
    <figure>
      <svg class="views-chart" viewBox={`0 0 ${CHART.width} ${CHART.height}`} role="img" aria-label={summary}>
        <title>{summary}</title>
        <line x1={0} y1={CHART.base + 0.5} x2={CHART.width} y2={CHART.base + 0.5} />
        {days.map((d, i) => {
          const h = (d.views / max) * (CHART.base - 4);
          return <rect key={d.day} x={i * step + CHART.gap / 2} y={CHART.base - h} width={Math.max(1, step - CHART.gap)} height={h} />;
        })}
      </svg>
      <figcaption class="muted">
        {days[0]?.day} to {days.at(-1)?.day} (UTC)
      </figcaption>
      <table class="visually-hidden">
        <caption>Share link views per day</caption>
        <thead>
          <tr>
            <th scope="col">Day (UTC)</th>
            <th scope="col">Views</th>
          </tr>
        </thead>
        <tbody>
          {days.map((d) => (
            <tr key={d.day}>
              <td>{d.day}</td>
              <td>{d.views}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </figure>
  );
}
