import { api, ok } from '../api';
import { Link, navigate } from '../router';
import { useSession } from '../session';
import { Field, formValues, ProblemText, Submit, useAction } from '../ui';

export function Profile() {
  const session = useSession();
  const user = session.user!;
  const details = useAction();
  const password = useAction();
  const rotation = useAction();
  const remove = useAction();
  const confirmation = useAction();
  return (
    <>
      <h1>Profile</h1>
      <h2>Account</h2>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void details.run(async () => {
            const body = {
              ...(v.username !== user.username ? { username: v.username } : {}),
              ...(v.email !== user.email ? { email: v.email, current_password: v.current_password } : {}),
              ...((v.company_name || null) !== user.company_name ? { company_name: v.company_name || null } : {}),
            };
            const updated = await ok(api.PUT('/profile/update', { body }));
            await session.refresh();
            return updated.pending_email
              ? `Saved. We sent a confirmation link to ${updated.pending_email}; the new address counts once you open it.`
              : 'Saved.';
          });
        }}
      >
        <Field label="Username" name="username" autocomplete="username" required minLength={3} maxLength={64} defaultValue={user.username} action={details} />
        <Field
          label="Email"
          name="email"
          type="email"
          autocomplete="email"
          required
          defaultValue={user.email}
          hint={user.email_verified ? 'Confirmed.' : 'Not confirmed yet.'}
          action={details}
        />
        <Field
          label="Current password (needed to change the email)"
          name="current_password"
          type="password"
          autocomplete="current-password"
          maxLength={256}
          action={details}
        />
        <Field label="Company" name="company_name" autocomplete="organization" maxLength={200} defaultValue={user.company_name ?? ''} action={details} />
        <Submit action={details}>Save</Submit>
        <ProblemText action={details} />
      </form>
      {!user.email_verified && (
        <form
          onSubmit={(e) => {
            e.preventDefault();
            void confirmation.run(async () => {
              const sent = await ok(api.POST('/profile/confirm-email/resend', { body: {} }));
              return `We sent a confirmation link to ${sent.email}.`;
            });
          }}
        >
          <p>Your email address is not confirmed yet: the link we mailed confirms it.</p>
          <Submit action={confirmation} class="secondary">
            Send the confirmation email again
          </Submit>
          <ProblemText action={confirmation} />
        </form>
      )}

      <h2>Password</h2>
      <form
        onSubmit={(e) => {
          const v = formValues(e);
          void password.run(async () => {
            const { session: fresh } = await ok(
              api.POST('/profile/change-password', { body: { current_password: v.current_password, new_password: v.new_password } }),
            );
            // Every other session ended: this page keeps the fresh one.
            await session.adopt(fresh.token);
            return 'Password changed; your other sessions were signed out.';
          });
        }}
      >
        <Field label="Current password" name="current_password" type="password" autocomplete="current-password" required maxLength={256} action={password} />
        <Field label="New password" name="new_password" type="password" autocomplete="new-password" required minLength={12} maxLength={256} action={password} />
        <Submit action={password}>Change the password</Submit>
        <ProblemText action={password} />
      </form>

      <p>
        After a password reset: <Link href="/recovery-review">review the access it undid</Link>.
      </p>

      <h2>Automatic rotation</h2>
      <form
        class="inline"
        onSubmit={(e) => {
          const v = formValues(e);
          void rotation.run(async () => {
            const days = v.days ? Number(v.days) : null;
            await ok(api.POST('/profile/update-rotation-days', { body: { rotation_interval_days: days } }));
            await session.refresh();
            return days ? `Keys following the account policy rotate every ${days} days.` : 'Automatic rotation is off.';
          });
        }}
      >
        <Field
          label="Rotate keys every (days, empty for off)"
          name="days"
          type="number"
          min={1}
          max={730}
          defaultValue={user.rotation_interval_days?.toString() ?? ''}
          action={rotation}
        />
        <Submit action={rotation}>Save</Submit>
      </form>
      <ProblemText action={rotation} />

      <h2>Delete the account</h2>
      {user.role === 'admin' ? (
        <p class="muted">Administrator accounts cannot be deleted.</p>
      ) : (
        <form
          onSubmit={(e) => {
            const v = formValues(e);
            if (!confirm('Delete your account and everything in it? This cannot be undone.')) return;
            void remove.run(async () => {
              await ok(api.POST('/profile/delete-account', { body: { password: v.password } }));
              await session.signOut();
              navigate('/sign-in');
            });
          }}
        >
          <Field label="Password" name="password" type="password" autocomplete="current-password" required maxLength={256} action={remove} />
          <Submit action={remove} class="danger">
            Delete my account
          </Submit>
          <ProblemText action={remove} />
        </form>
      )}
    </>
  );
}
