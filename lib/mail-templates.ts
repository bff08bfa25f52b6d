import { z } from 'zod';
import type { Config } from './config';

/** Plain-text emails the service sends; one place to read and change their wording. */
export const MailTemplate = z.enum(['password-reset', 'password-changed', 'contact-received', 'contact-forward', 'key-expiring']);
export type MailTemplate = z.infer<typeof MailTemplate>;

type Vars = Record<string, string>;

export function renderMail(template: MailTemplate, v: Vars, config: Pick<Config, 'publicUrl'>): { subject: string; text: string; replyTo?: string } {
  switch (template) {
    case 'password-reset':
      return {
        subject: 'Reset your password',
        text: [
          `Hello ${v.username ?? ''},`,
          '',
          'Someone asked to reset the password of your account. To choose a new password, use this token',
          `within ${v.ttl_minutes ?? '30'} minutes:`,
          '',
          `Reset token: ${v.token}`,
          // In the fragment, never the query string: a fragment is not sent to servers (logs, Referer).
          `Or open: ${config.publicUrl}/reset-password#token=${encodeURIComponent(v.token ?? '')}`,
          '',
          'If you did not ask for this, ignore this email: your password stays as it is.',
        ].join('\n'),
      };
    case 'password-changed':
      return {
        subject: 'Your password was changed',
        text: `Hello ${v.username ?? ''},\n\nThe password of your account was changed at ${v.at}. All earlier sessions were signed out.\nIf this was not you, reset your password at once and contact support.`,
      };
    case 'contact-received':
      return {
        subject: `We received your request: ${v.subject}`,
        text: `Hello ${v.name ?? ''},\n\nThank you for writing to us. Your request (reference ${v.reference}) reached our support team, who will answer by email.`,
      };
    case 'key-expiring':
      return {
        subject: `Your key "${v.label}" expires ${v.expires_at?.slice(0, 10)}`,
        text: [
          `Your OpenPGP key "${v.label}" (fingerprint ${v.fingerprint}) expires at ${v.expires_at}.`,
          '',
          'After that it no longer encrypts (it still decrypts what was encrypted to it). Rotate it to get a',
          'fresh generation with a new lifetime: POST /api/v1/keys/{fingerprint}/rotate.',
        ].join('\n'),
      };
    case 'contact-forward':
      return {
        subject: `[contact ${v.reference}] ${v.subject}`,
        text: `From: ${v.name} <${v.email}>\nReference: ${v.reference}\n\n${v.message}`,
        replyTo: v.email,
      };
  }
}
