import { useEffect, useId, useState } from 'preact/hooks';
import { api, ok, type Schemas } from '../api';
import { useSession } from '../session';
import { confirmEnd, Field, formValues, ProblemText, Submit, useAction, useFieldError, when } from '../ui';

function Organization() {
  const action = useAction();
  const [org, setOrg] = useState<Schemas['Organization']>();
  const [members, setMembers] = useState<Schemas['OrganizationMember'][]>([]);
  const [invitations, setInvitations] = useState<Schemas['OrganizationInvitation'][]>([]);
  const load = () =>
    action.run(async () => {
      const o = await ok(api.GET('/organization'));
      setOrg(o);
      setMembers((await ok(api.GET('/organization/members', { params: { query: { page_size: 100 } } }))).items);
      if (o.role !== 'member')
        setInvitations((await ok(api.GET('/organization/invitations', { params: { query: { state: 'pending', page_size: 100 } } }))).items);
    });
  useEffect(() => void load(), []);
  return (
    <section aria-labelledby="org-h">
      <h2 id="org-h">Organization{org ? `: ${org.name}` : ''}</h2>
      {org && (
        <p>
          You are its {org.role}; it has {org.member_count} member(s).
        </p>
      )}
      <table class="members">
        <caption class="muted">Members</caption>
        <thead>
          <tr>
            <th scope="col">Username</th>
            <th scope="col">Email</th>
            <th scope="col">Role</th>
            {org && org.role !== 'member' && <th scope="col">Actions</th>}
          </tr>
        </thead>
        <tbody>
          {members.map((m) => (
            <tr key={m.user_id}>
              <td>{m.username}</td>
              <td>{m.email}</td>
              <td>{m.role}</td>
              {org && org.role !== 'member' && (
                <td>
                  {m.role !== 'owner' && (
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Remove ${m.username}`}
                      onClick={() =>
                        confirmEnd(
                          `Remove ${m.username} from the organization?`,
                          `${m.username} loses the organization at once: team-access links to and from them end, with the keys inherited through them.`,
                        ) &&
                        action.run(async () => {
                          await ok(api.DELETE('/organization/members/{user_id}', { params: { path: { user_id: m.user_id } } }));
                          await load();
                          return `${m.username} removed.`;
                        })
                      }
                    >
                      Remove
                    </button>
                  )}
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      {org && org.role !== 'member' && (
        <>
          <form
            class="inline"
            onSubmit={(e) => {
              const v = formValues(e);
              const form = e.currentTarget;
              void action.run(async () => {
                await ok(api.POST('/organization/invitations', { body: { email: v.email, role: v.role as 'admin' | 'member' } }));
                form.reset();
                await load();
                return `Invitation sent to ${v.email}.`;
              });
            }}
          >
            <Field label="Invite by email" name="email" type="email" required action={action} />
            <label>
              Role
              <select name="role">
                <option value="member">Member</option>
                <option value="admin">Admin</option>
              </select>
            </label>
            <Submit action={action}>Send the invitation</Submit>
          </form>
          <ul class="invitations">
            {invitations.map((i) => (
              <li key={i.invitation_id}>
                {i.email} as {i.role}, until {when(i.expires_at)}{' '}
                <button
                  type="button"
                  class="secondary"
                  aria-label={`Revoke the invitation of ${i.email}`}
                  onClick={() =>
                    confirmEnd(`Revoke the invitation of ${i.email}?`, 'Its emailed link stops working; inviting them again sends a new one.') &&
                    action.run(async () => {
                      await ok(api.DELETE('/organization/invitations/{invitation_id}', { params: { path: { invitation_id: i.invitation_id } } }));
                      await load();
                    })
                  }
                >
                  Revoke
                </button>
              </li>
            ))}
          </ul>
        </>
      )}
      <ProblemText action={action} />
    </section>
  );
}

function TeamAccess() {
  const { user } = useSession();
  const action = useAction();
  const [status, setStatus] = useState<Schemas['TeamAccessStatus']>();
  const [candidates, setCandidates] = useState<Schemas['OrganizationMember'][]>([]);
  const [pending, setPending] = useState<Schemas['TeamAccessLink'][]>([]);
  const [loaded, setLoaded] = useState(false);
  const load = () =>
    action.run(async () => {
      setStatus(await ok(api.GET('/team-access/status')));
      setCandidates((await ok(api.GET('/team-access/members', { params: { query: { page_size: 100 } } }))).items.filter((m) => m.user_id !== user?.user_id));
      setLoaded(true);
      setPending((await ok(api.GET('/team-access/links', { params: { query: { view: 'source', approval: 'pending', page_size: 100 } } }))).items);
    });
  useEffect(() => void load(), []);
  const source = useFieldError(action, 'source_user_id');
  /** Until the members are loaded, the picker waits; a team of one has no one to link to. */
  const someone = !loaded || candidates.length > 0;
  const noOneId = useId();
  return (
    <section aria-labelledby="team-h">
      <h2 id="team-h">Team access</h2>
      <p class="muted">Inherit access to a teammate's keys: the link waits for their approval (or an organization admin's), then keys sync.</p>
      {status && (
        <p role="status" class="team-status">
          {status.linked
            ? `Linked to ${status.source?.username ?? 'a former member'}: approval ${status.approval ?? 'n/a'}, sync ${status.state}.`
            : 'Not linked.'}
        </p>
      )}
      <form
        class="inline"
        onSubmit={(e) => {
          const v = formValues(e);
          void action.run(async () => {
            await ok(api.POST('/team-access/link', { body: { source_user_id: v.source } }));
            await load();
            return 'Link requested.';
          });
        }}
      >
        <label>
          Teammate
          <select
            name="source"
            required
            disabled={!someone}
            {...source.attrs}
            aria-describedby={source.attrs['aria-describedby'] ?? (someone ? undefined : noOneId)}
          >
            {candidates.map((m) => (
              <option key={m.user_id} value={m.user_id}>
                {m.username} ({m.email})
              </option>
            ))}
          </select>
        </label>
        {source.message}
        {!someone && (
          <p class="muted" id={noOneId}>
            There is no one to choose yet: you are the only member of your organization. Invite a teammate first.
          </p>
        )}
        <button type="submit" disabled={action.busy || !someone}>
          Link to this teammate
        </button>
      </form>
      {status?.linked && (
        <button
          type="button"
          class="secondary"
          onClick={() =>
            confirmEnd(
              `Remove the link to ${status.source?.username ?? 'your teammate'}?`,
              'Every key you inherit through it is gone at once: you no longer encrypt to, share or decrypt with them, and your share links of them stop answering.',
            ) &&
            action.run(async () => {
              await ok(api.DELETE('/team-access/link'));
              await load();
              return 'Unlinked.';
            })
          }
        >
          Remove the link
        </button>
      )}
      {pending.length > 0 && <h3>Waiting for your approval</h3>}
      <ul class="pending-links">
        {pending.map((l) => (
          <li key={l.grantee?.user_id}>
            {l.grantee?.username} asks to inherit {l.source?.username}'s keys (since {when(l.requested_at)}){' '}
            <button
              type="button"
              aria-label={`Approve ${l.grantee?.username}`}
              onClick={() =>
                action.run(async () => {
                  await ok(
                    api.POST('/team-access/links/{grantee_user_id}/approve', {
                      params: { path: { grantee_user_id: l.grantee!.user_id } },
                      body: { source_user_id: l.source!.user_id },
                    }),
                  );
                  await load();
                  return `Approved ${l.grantee?.username}.`;
                })
              }
            >
              Approve
            </button>
          </li>
        ))}
      </ul>
      <ProblemText action={action} />
    </section>
  );
}

function Billing() {
  const action = useAction();
  const [status, setStatus] = useState<Schemas['BillingStatus']>();
  useEffect(() => void action.run(async () => setStatus(await ok(api.GET('/billing/status')))), []);
  return (
    <section aria-labelledby="billing-h">
      <h2 id="billing-h">Billing</h2>
      {status && (
        <p>
          Plan {status.plan} (billing {status.mode}){status.limits_enforced ? ', limits enforced' : ''}.
        </p>
      )}
      {status && status.mode !== 'disabled' && (
        <p class="actions">
          {(['pro', 'business'] as const).map((plan) => (
            <button
              key={plan}
              type="button"
              onClick={() => action.run(async () => location.assign((await ok(api.POST('/billing/checkout', { body: { plan } }))).url))}
            >
              Upgrade to {plan}
            </button>
          ))}
          <button type="button" class="secondary" onClick={() => action.run(async () => location.assign((await ok(api.GET('/billing/portal'))).url))}>
            Customer portal
          </button>
        </p>
      )}
      <ProblemText action={action} />
    </section>
  );
}

export function Team() {
  return (
    <>
      <h1>Team and billing</h1>
      <Organization />
      <TeamAccess />
      <Billing />
    </>
  );
}
