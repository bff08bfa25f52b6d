import { startRegistration } from '@simplewebauthn/browser';
import { useEffect, useState } from 'preact/hooks';
import { EVENT_TYPES, SCOPES } from '../../../../client/openapi';
import { api, asJson, ok, type Schemas } from '../api';
import { confirmEnd, CopyButton, Field, formValues, ProblemText, Submit, useAction, useFieldError, when } from '../ui';
import { ShareLink } from '../share-link';

/** A secret the API shows once, with the warning and a copy button. */
function ShownOnce({ label, value }: { label: string; value: string | null }) {
  if (value === null) return <p class="muted">{label}: its value is no longer available (revoked or expired).</p>;
  return (
    <div class="warning" role="alert">
      <p>{label}: shown this once. Copy it now; it cannot be shown again.</p>
      <p class="secret">{value}</p>
      <CopyButton text={value} label="Copy" />
    </div>
  );
}

function PartnerKey() {
  const action = useAction();
  const [status, setStatus] = useState<Schemas['PartnerApiKeyStatus']>();
  const [issued, setIssued] = useState<string>();
  const load = () => action.run(async () => setStatus(await ok(api.GET('/partners/api-key-status'))));
  useEffect(() => void load(), []);
  /** A key that works now: rotating it ends it. Without one (none yet, revoked by a reset, expired) the same call creates one. */
  const live = status?.status === 'active';
  return (
    <section aria-labelledby="partner-h">
      <h2 id="partner-h">Partner API key</h2>
      {status && (
        <p>
          {status.status === 'none'
            ? 'No partner key.'
            : `Key ${status.prefix}… is ${status.status}; expires ${when(status.expires_at)}${status.days_remaining !== null ? ` (${status.days_remaining} days)` : ''}; last used ${when(status.last_used_at)}.`}
        </p>
      )}
      <button
        type="button"
        disabled={action.busy}
        onClick={() =>
          (!live || confirmEnd('Rotate the partner key?', `The key ${status.prefix ?? ''}… stops working at once: every client using it needs the new one.`)) &&
          action.run(async () => {
            setIssued((await ok(api.POST('/partners/rotate-api-key'))).api_key);
            await load();
          })
        }
      >
        {live ? 'Rotate the partner key' : 'Create a partner key'}
      </button>
      <ProblemText action={action} />
      {issued && <ShownOnce label="The new partner key" value={issued} />}
    </section>
  );
}

function ApiKeys() {
  const action = useAction();
  const [items, setItems] = useState<Schemas['ManagedApiKey'][]>([]);
  const [shown, setShown] = useState<{ label: string; value: string | null }>();
  const [shares, setShares] = useState<{ keyId: string; items: Schemas['ApiKeyShare'][] }>();
  const load = () => action.run(async () => setItems((await ok(api.GET('/api-keys', { params: { query: { page_size: 100 } } }))).items));
  const loadShares = async (keyId: string) =>
    setShares({ keyId, items: (await ok(api.GET('/api-keys/{key_id}/shares', { params: { path: { key_id: keyId }, query: { page_size: 50 } } }))).items });
  useEffect(() => void load(), []);
  const scopesError = useFieldError(action, 'scopes');
  return (
    <section aria-labelledby="apikeys-h">
      <h2 id="apikeys-h">Managed API keys</h2>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          const scopes = SCOPES.filter((s) => e.currentTarget.querySelector<HTMLInputElement>(`input[value="${s}"]`)?.checked);
          void action.run(async () => {
            const made = await ok(
              api.POST('/api-keys/generate', { body: { name: v.name, scopes, ...(v.expires_in_days ? { expires_in_days: Number(v.expires_in_days) } : {}) } }),
            );
            setShown({ label: `The key "${made.name}"`, value: made.value });
            await load();
          });
        }}
      >
        <Field label="Name" name="name" required maxLength={100} action={action} />
        <fieldset {...scopesError.attrs}>
          <legend>Scopes</legend>
          {SCOPES.map((s) => (
            <label class="check" key={s}>
              <input type="checkbox" name="scope" value={s} /> {s}
            </label>
          ))}
          {scopesError.message}
        </fieldset>
        <Field label="Expires in days (optional)" name="expires_in_days" type="number" min={1} action={action} />
        <Submit action={action}>Generate an API key</Submit>
        <ProblemText action={action} />
      </form>
      {shown && <ShownOnce {...shown} />}
      <table>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Prefix</th>
            <th scope="col">Scopes</th>
            <th scope="col">State</th>
            <th scope="col">Actions</th>
          </tr>
        </thead>
        <tbody>
          {items.map((k) => (
            <tr key={k.key_id}>
              <td>{k.name}</td>
              <td class="mono">{k.prefix}</td>
              <td>{k.scopes.join(', ')}</td>
              <td>{k.status === 'revoked' ? `revoked ${when(k.revoked_at)}` : k.status}</td>
              <td class="actions">
                {/* Only an active key has a value to show, rotate or share; a revoked one has nothing left to revoke. */}
                {k.status === 'active' && (
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Show the value of ${k.name}`}
                    onClick={() =>
                      action.run(async () =>
                        setShown({
                          label: `The key "${k.name}"`,
                          value: (await ok(api.GET('/api-keys/{key_id}', { params: { path: { key_id: k.key_id } } }))).value,
                        }),
                      )
                    }
                  >
                    Show
                  </button>
                )}
                {k.status === 'active' && (
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Rotate ${k.name}`}
                    onClick={() =>
                      confirmEnd(
                        `Rotate the API key "${k.name}"?`,
                        `Its current value (${k.prefix}…) stops working in one hour: update every client using it.`,
                      ) &&
                      action.run(async () => {
                        const r = await ok(api.POST('/api-keys/{key_id}/rotate', { params: { path: { key_id: k.key_id } }, body: { grace_seconds: 3600 } }));
                        setShown({ label: `The new value of "${k.name}" (the old one works for one more hour)`, value: r.value });
                        await load();
                      })
                    }
                  >
                    Rotate
                  </button>
                )}
                {k.status === 'active' && (
                  <button
                    type="button"
                    class="secondary"
                    aria-label={`Share link of ${k.name}`}
                    onClick={() =>
                      action.run(async () => {
                        await ok(
                          api.POST('/api-keys/{key_id}/share', { params: { path: { key_id: k.key_id } }, body: { expires_in_hours: 24, max_views: 1 } }),
                        );
                        await loadShares(k.key_id);
                        return 'A one-view share link, valid 24 hours, is in the list below.';
                      })
                    }
                  >
                    Share link
                  </button>
                )}
                <button type="button" class="secondary" aria-label={`Share links of ${k.name}`} onClick={() => action.run(() => loadShares(k.key_id))}>
                  Links
                </button>
                {k.status !== 'revoked' && (
                  <button
                    type="button"
                    class="danger"
                    aria-label={`Revoke ${k.name}`}
                    onClick={() =>
                      confirmEnd(
                        `Revoke the API key "${k.name}"?`,
                        'Every value of it stops working at once, and its share links with it. There is no undo: a client needs a new key.',
                      ) &&
                      action.run(async () => {
                        await ok(api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: k.key_id } } }));
                        await load();
                      })
                    }
                  >
                    Revoke
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {shares && (
        <ul class="api-key-shares" aria-label="Share links of the key">
          {shares.items.length === 0 && <li class="muted">No share links.</li>}
          {shares.items.map((sh) => (
            <li key={sh.share_id}>
              {sh.key_name}: {sh.state}, {sh.view_count} view(s), until {when(sh.expires_at)}{' '}
              {sh.url && <ShareLink url={sh.url} name={`the share link of ${sh.key_name} made ${when(sh.created_at)}`} />}{' '}
              {sh.state === 'active' && (
                <button
                  type="button"
                  class="secondary"
                  onClick={() =>
                    confirmEnd('Revoke this share link?', 'Whoever has the link can no longer reveal the API key through it.') &&
                    action.run(async () => {
                      await ok(api.DELETE('/api-keys/shares/{share_id}', { params: { path: { share_id: sh.share_id } } }));
                      await loadShares(shares.keyId);
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
      )}
    </section>
  );
}

function Passkeys() {
  const action = useAction();
  const [items, setItems] = useState<Schemas['Passkey'][]>([]);
  const load = () => action.run(async () => setItems((await ok(api.GET('/auth/passkeys/list', { params: { query: { page_size: 100 } } }))).items));
  useEffect(() => void load(), []);
  return (
    <section aria-labelledby="passkeys-h">
      <h2 id="passkeys-h">Passkeys</h2>
      <form
        class="inline"
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            const begun = await ok(api.POST('/auth/passkeys/register/begin'));
            // The API's schema names transports as strings; the library's type narrows them to its known names.
            const credential = await startRegistration({ optionsJSON: begun.options as Parameters<typeof startRegistration>[0]['optionsJSON'] });
            const added = await ok(
              api.POST('/auth/passkeys/register/complete', {
                body: { challenge_id: begun.challenge_id, credential: asJson(credential), ...(v.name ? { name: v.name } : {}) },
              }),
            );
            await load();
            return `Passkey "${added.name}" added.`;
          });
        }}
      >
        <Field label="Passkey name" name="name" maxLength={100} action={action} />
        <Submit action={action}>Add a passkey</Submit>
      </form>
      <ProblemText action={action} />
      <ul class="passkeys">
        {items.map((p) => (
          <li key={p.passkey_id}>
            <span class="name">{p.name}</span> ({p.active ? 'active' : 'inactive'}, last used {when(p.last_used_at)}){' '}
            <button
              type="button"
              class="secondary"
              aria-label={`${p.active ? 'Deactivate' : 'Activate'} ${p.name}`}
              onClick={() =>
                action.run(async () => {
                  await ok(api.PATCH('/auth/passkeys/{passkey_id}', { params: { path: { passkey_id: p.passkey_id } }, body: { active: !p.active } }));
                  await load();
                })
              }
            >
              {p.active ? 'Deactivate' : 'Activate'}
            </button>{' '}
            <button
              type="button"
              class="danger"
              aria-label={`Delete ${p.name}`}
              onClick={() =>
                confirmEnd(`Delete the passkey "${p.name}"?`, 'It can no longer sign in to this account; adding it again means registering it anew.') &&
                action.run(async () => {
                  await ok(api.DELETE('/auth/passkeys/{passkey_id}', { params: { path: { passkey_id: p.passkey_id } } }));
                  await load();
                })
              }
            >
              Delete
            </button>
          </li>
        ))}
      </ul>
    </section>
  );
}

function Webhooks() {
  const action = useAction();
  const [items, setItems] = useState<Schemas['WebhookEndpoint'][]>([]);
  const [secret, setSecret] = useState<string>();
  const [deliveries, setDeliveries] = useState<{ id: string; items: Schemas['WebhookDelivery'][] }>();
  const load = () => action.run(async () => setItems((await ok(api.GET('/webhooks', { params: { query: { page_size: 100 } } }))).items));
  useEffect(() => void load(), []);
  return (
    <section aria-labelledby="webhooks-h">
      <h2 id="webhooks-h">Webhooks</h2>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          // None ticked: every type (the API's default).
          const types = EVENT_TYPES.filter((t) => e.currentTarget.querySelector<HTMLInputElement>(`input[name="event_type"][value="${t}"]`)?.checked);
          void action.run(async () => {
            const made = await ok(api.POST('/webhooks', { body: { url: v.url, event_types: types } }));
            setSecret(made.secret);
            await load();
          });
        }}
      >
        <Field label="Endpoint URL" name="url" type="url" required maxLength={2048} action={action} />
        <fieldset class="event-types">
          <legend>Event types (none ticked: every type)</legend>
          {EVENT_TYPES.map((t) => (
            <label class="check" key={t}>
              <input type="checkbox" name="event_type" value={t} /> {t}
            </label>
          ))}
        </fieldset>
        <Submit action={action}>Add an endpoint</Submit>
      </form>
      <ProblemText action={action} />
      {secret && <ShownOnce label="The signing secret" value={secret} />}
      <ul>
        {items.map((w) => (
          <li key={w.webhook_id}>
            <span class="mono">{w.url}</span> {w.enabled ? '' : `(disabled: ${w.disabled_reason ?? ''})`}{' '}
            <span class="muted">{w.event_types.length ? w.event_types.join(', ') : 'every event type'}</span>{' '}
            <button
              type="button"
              class="secondary"
              onClick={() =>
                action.run(async () =>
                  setSecret(
                    (await ok(api.POST('/webhooks/{webhook_id}/rotate-secret', { params: { path: { webhook_id: w.webhook_id } }, body: { grace_hours: 24 } })))
                      .secret,
                  ),
                )
              }
            >
              Rotate secret
            </button>{' '}
            <button
              type="button"
              class="secondary"
              onClick={() =>
                action.run(async () => {
                  const d = await ok(api.POST('/webhooks/{webhook_id}/test', { params: { path: { webhook_id: w.webhook_id } } }));
                  return `Test delivery ${d.state}.`;
                })
              }
            >
              Send a test
            </button>{' '}
            <button
              type="button"
              class="secondary"
              onClick={() =>
                action.run(async () =>
                  setDeliveries({
                    id: w.webhook_id,
                    items: (
                      await ok(api.GET('/webhooks/{webhook_id}/deliveries', { params: { path: { webhook_id: w.webhook_id }, query: { page_size: 20 } } }))
                    ).items,
                  }),
                )
              }
            >
              Deliveries
            </button>{' '}
            <button
              type="button"
              class="danger"
              onClick={() =>
                confirm('Delete this endpoint?') &&
                action.run(async () => {
                  await ok(api.DELETE('/webhooks/{webhook_id}', { params: { path: { webhook_id: w.webhook_id } } }));
                  await load();
                })
              }
            >
              Delete
            </button>
            {deliveries?.id === w.webhook_id && (
              <ul>
                {deliveries.items.length === 0 && <li class="muted">No deliveries yet.</li>}
                {deliveries.items.map((d) => (
                  <li key={d.delivery_id}>
                    {d.event_type}: {d.state} after {d.attempts} attempt(s){' '}
                    <button
                      type="button"
                      class="secondary"
                      onClick={() =>
                        action.run(async () => {
                          await ok(
                            api.POST('/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver', {
                              params: { path: { webhook_id: w.webhook_id, delivery_id: d.delivery_id } },
                            }),
                          );
                          return 'Redelivery queued.';
                        })
                      }
                    >
                      Redeliver
                    </button>
                  </li>
                ))}
              </ul>
            )}
          </li>
        ))}
      </ul>
    </section>
  );
}

export function Credentials() {
  return (
    <>
      <h1>Credentials and integrations</h1>
      <Passkeys />
      <ApiKeys />
      <PartnerKey />
      <Webhooks />
    </>
  );
}
