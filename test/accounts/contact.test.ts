import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';

/** The contact form as SPEC.md names it: name, email and message; a subject is optional. */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url, SUPPORT_EMAIL: 'help-desk@example.test' } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

/** Takes the next mail to support out of the inbox (each test sends one). */
async function nextSupportMail() {
  const mail = await smtp.waitFor('help-desk@example.test');
  smtp.received.splice(smtp.received.indexOf(mail), 1);
  return mail;
}

describe('POST /auth/contact', () => {
  it('takes a request without a subject and files it under a default one, in the store and the mail', async () => {
    const res = await s.api('POST', '/auth/contact', { body: { name: 'Ann', email: 'ann@example.test', message: 'I need help with keys.' } });
    expect(res.status).toBe(202);
    const stored = await s.c.db('contact_requests').where({ id: res.body.reference }).first();
    expect(stored).toMatchObject({ name: 'Ann', subject: 'Contact request from Ann', message: 'I need help with keys.' });
    const mail = await nextSupportMail();
    expect(mail.subject).toBe(`[contact ${res.body.reference}] Contact request from Ann`);
    expect(mail.text).toContain('I need help with keys.');
  });

  it('keeps a subject that is given, and still refuses an empty one', async () => {
    const res = await s.api('POST', '/auth/contact', { body: { name: 'Bo', email: 'bo@example.test', subject: 'Billing', message: 'Invoice question.' } });
    expect(res.status).toBe(202);
    expect((await nextSupportMail()).subject).toBe(`[contact ${res.body.reference}] Billing`);
    const empty = await s.api('POST', '/auth/contact', { body: { name: 'Bo', email: 'bo@example.test', subject: ' ', message: 'x' } });
    expect(empty.status).toBe(422);
    expect(empty.body.errors.map((e: { path: string }) => e.path)).toEqual(['body.subject']);
  });
});
