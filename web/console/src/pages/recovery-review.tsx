import { useEffect, useState } from 'preact/hooks';
import { api, ok, type Schemas } from '../api';
import { ProblemText, useAction, when } from '../ui';

type Item = Schemas['RecoveryReviewItem'];

const KIND: Record<Item['kind'], string> = { invitation: 'Invitation', team_link: 'Team access link', webhook: 'Webhook', member: 'Member' };
const DONE: Record<Item['action'], string> = {
  revoked: 'revoked',
  returned_to_pending: 'back to awaiting approval (its inherited keys withdrawn)',
  paused: 'paused',
  demoted: 'made a plain member',
  listed: 'joined in that time',
};
const KEEP: Record<Item['kind'], string> = { invitation: 'Reopen', team_link: 'Approve again', webhook: 'Resume', member: 'Keep' };

/**
 * Review after recovery: what a password reset undid of the access given to others shortly before it
 * (GET /profile/recovery-review), each kept (restored) or removed once. Deciding needs a recent sign-in:
 * a stale session is led to sign in again (useAction) and comes back here.
 */
export function RecoveryReview() {
  const action = useAction();
  const [items, setItems] = useState<Item[]>();
  const load = () =>
    action.run(async () => {
      setItems((await ok(api.GET('/profile/recovery-review', { params: { query: { page_size: 100 } } }))).items);
    });
  useEffect(() => void load(), []);
  const decide = (item: Item, what: 'keep' | 'remove') =>
    action.run(async () => {
      const path = what === 'keep' ? '/profile/recovery-review/{item_id}/keep' : '/profile/recovery-review/{item_id}/remove';
      const done = await ok(api.POST(path, { params: { path: { item_id: item.item_id } } }));
      await load();
      return `${KIND[item.kind]} ${item.label}: ${done.decision === 'kept' ? 'kept' : 'removed'}.`;
    });
  const open = items?.filter((i) => !i.decision) ?? [];
  const decided = items?.filter((i) => i.decision) ?? [];
  return (
    <>
      <h1>Review after recovery</h1>
      <p>
        A password reset ends every way into the account and undoes the access it gave others in the days before: invitations are revoked, team access links go
        back to awaiting approval, webhooks are paused and admins invited then become plain members. Keep what you recognise; remove the rest.
      </p>
      <ProblemText action={action} />
      {items && !open.length && <p role="status">Nothing awaits your review.</p>}
      {open.length > 0 && (
        <table class="review">
          <caption class="muted">Awaiting your review</caption>
          <thead>
            <tr>
              <th scope="col">What</th>
              <th scope="col">Done at the reset</th>
              <th scope="col">When</th>
              <th scope="col">Decide</th>
            </tr>
          </thead>
          <tbody>
            {open.map((i) => (
              <tr key={i.item_id}>
                <td>
                  {KIND[i.kind]}: {i.label}
                </td>
                <td>{DONE[i.action]}</td>
                <td>{when(i.done_at)}</td>
                <td>
                  <button type="button" disabled={action.busy} aria-label={`${KEEP[i.kind]}: ${i.label}`} onClick={() => void decide(i, 'keep')}>
                    {KEEP[i.kind]}
                  </button>{' '}
                  <button type="button" class="danger" disabled={action.busy} aria-label={`Remove: ${i.label}`} onClick={() => void decide(i, 'remove')}>
                    Remove
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {decided.length > 0 && (
        <>
          <h2>Decided</h2>
          <ul>
            {decided.map((i) => (
              <li key={i.item_id}>
                {KIND[i.kind]} {i.label}: {i.decision} {when(i.decided_at)}
              </li>
            ))}
          </ul>
        </>
      )}
    </>
  );
}
