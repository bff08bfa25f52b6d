import { expect } from 'vitest';
import { registerUser, type TestService } from './service';
import type { startSmtpServer } from './smtp';

/** Organizations and team access through the API: accounts, invitations by mail, links and their approval. */
export type User = Awaited<ReturnType<typeof registerUser>>;
type Smtp = Awaited<ReturnType<typeof startSmtpServer>>;

export function teamHelpers(get: () => { s: TestService; smtp: Smtp }) {
  /** Registrations are limited per address; these files make many accounts from one. */
  async function newUser(): Promise<User> {
    const { s } = get();
    await Promise.all(['127.0.0.1', '::ffff:127.0.0.1', '::1'].map((ip) => s.c.limiters.publicIp.delete(`register:${ip}`)));
    return registerUser(s.api);
  }

  /** The invitation token from the newest mail to `email`. */
  async function mailedToken(email: string): Promise<string> {
    const { smtp } = get();
    await smtp.waitFor(email);
    const mails = smtp.received.filter((m) => JSON.stringify(m.to).includes(email));
    const token = /Invitation token: (kms_inv_[A-Za-z0-9_-]{43})/.exec(mails.at(-1)!.text ?? '')?.[1];
    expect(token, mails.at(-1)!.text).toBeTruthy();
    return token!;
  }

  async function invite(admin: User, email: string, role: 'member' | 'admin' = 'member') {
    const { s, smtp } = get();
    const before = smtp.received.length;
    const res = await s.api('POST', '/organization/invitations', { token: admin.token, body: { email, role } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    await expect.poll(() => smtp.received.slice(before).some((m) => JSON.stringify(m.to).includes(email.toLowerCase())), { timeout: 10_000 }).toBe(true);
    return { invitation: res.body, token: await mailedToken(email.toLowerCase()) };
  }

  /** An owner and members who joined its organization by invitation (as `roles` says; members by default). */
  async function team(size: number, roles: ('member' | 'admin')[] = []): Promise<User[]> {
    const { s } = get();
    const [owner, ...rest] = await Promise.all(Array.from({ length: size }, () => newUser()));
    for (const [i, m] of rest.entries()) {
      const { token } = await invite(owner, m.email, roles[i] ?? 'member');
      const res = await s.api('POST', '/organization/invitations/accept', { token: m.token, body: { token } });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    return [owner, ...rest];
  }

  const status = async (u: User) => (await get().s.api('GET', '/team-access/status', { token: u.token })).body;

  /** Waits until no sync is queued or running for `u` and answers the status. */
  async function settled(u: User) {
    await expect.poll(async () => (await status(u)).state, { timeout: 15_000, interval: 50 }).toMatch(/^(ok|failed|unlinked)$/);
    return status(u);
  }

  /** `u` asks to link to `source`; the link is requested, not yet approved. */
  async function requestLink(u: User, source: User) {
    const res = await get().s.api('POST', '/team-access/link', { token: u.token, body: { source_user_id: source.id } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body;
  }

  /** `by` (the source unless given) approves `u`'s link to `source`. */
  async function approve(u: User, source: User, by: User = source) {
    const res = await get().s.api('POST', `/team-access/links/${u.id}/approve`, { token: by.token, body: { source_user_id: source.id } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body;
  }

  /** `u` links to `source`, the source approves, and the sync has run. */
  async function link(u: User, source: User) {
    await requestLink(u, source);
    await approve(u, source);
    return settled(u);
  }

  return { newUser, mailedToken, invite, team, status, settled, requestLink, approve, link };
}
