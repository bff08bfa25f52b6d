import { z } from 'zod';
import type { Config } from './config';

/** Plain-text emails the service sends; one place to read and change their wording. */
export const MailTemplate = z.enum([
  'password-reset',
  'password-reset-done',
  'password-changed',
  'contact-received',
  'contact-forward',
  'key-expiring',
  'email-confirm',
  'email-verify',
  'email-changed',
  'key-shared',
  'passkey-added',
  'organization-invite',
]);
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
    case 'password-reset-done': {
      const n = (count: string | undefined, one: string, many: string) => `${count ?? '0'} ${count === '1' ? one : many}`;
      const ended = [
        '- every session: signed out',
        v.partner_keys !== '0' && `- ${n(v.partner_keys, 'partner API key', 'partner API keys')}: revoked (rotate to get a new one)`,
        v.api_keys !== '0' && `- ${n(v.api_keys, 'managed API key', 'managed API keys')}: revoked (generate new ones where you need them)`,
        v.api_key_shares !== '0' && `- ${n(v.api_key_shares, 'API key share link', 'API key share links')}: revoked`,
        v.passkeys !== '0' && `- ${n(v.passkeys, 'passkey', 'passkeys')}: deactivated (sign in and make active again the ones you recognise)`,
      ].filter(Boolean);
      // Access the account gave others shortly before the reset, undone until the owner reviews it.
      const review = v.review
        ? [
            '',
            `Access given to others in the ${v.review_days ?? '7'} days before the reset was undone until you review it:`,
            '',
            v.review,
            '',
            `Sign in and keep or remove each at ${config.publicUrl}/recovery-review`,
          ]
        : [];
      return {
        subject: 'Your password was reset',
        text: [
          `Hello ${v.username ?? ''},`,
          '',
          `The password of your account was reset at ${v.at}. Every other way into the account was ended:`,
          '',
          ...ended,
          ...review,
          '',
          'If this was not you, reset your password again at once and contact support.',
        ].join('\n'),
      };
    }
    case 'password-changed':
      return {
        subject: 'Your password was changed',
        text: `Hello ${v.username ?? ''},\n\nThe password of your account was changed at ${v.at}. All earlier sessions were signed out and any partner API key revoked; your managed API keys and passkeys stay.\nIf this was not you, reset your password at once (a reset ends them all) and contact support.`,
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
    case 'email-verify':
      return {
        subject: 'Confirm your email address',
        text: [
          `Hello ${v.username ?? ''},`,
          '',
          `An account was made with this email address. To confirm that it is yours, use this token within ${v.ttl_hours ?? '48'} hours:`,
          '',
          `Confirmation token: ${v.token}`,
          `Or open: ${config.publicUrl}/confirm-email#token=${encodeURIComponent(v.token ?? '')}`,
          '',
          'If you did not make an account, ignore this email.',
        ].join('\n'),
      };
    case 'email-confirm':
      return {
        subject: 'Confirm your new email address',
        text: [
          `Hello ${v.username ?? ''},`,
          '',
          `Someone asked to change the email address of your account to this one. To confirm, use this token within ${v.ttl_minutes ?? '30'} minutes:`,
          '',
          `Confirmation token: ${v.token}`,
          `Or open: ${config.publicUrl}/confirm-email#token=${encodeURIComponent(v.token ?? '')}`,
          '',
          'If you did not ask for this, ignore this email: nothing changes.',
        ].join('\n'),
      };
    case 'email-changed':
      return {
        subject: 'The email address of your account was changed',
        text: `Hello ${v.username ?? ''},\n\nThe email address of your account was changed to ${v.new_email} at ${v.at}. Mail about the account now goes there.\nIf this was not you, contact support at once.`,
      };
    case 'key-shared':
      return {
        subject: `${v.owner ?? 'Someone'} shared an OpenPGP public key with you`,
        text: [
          `${v.owner ?? 'Someone'} shared the OpenPGP public key "${v.label ?? ''}" with you through ${config.publicUrl}.`,
          '',
          `Fingerprint: ${v.fingerprint}`,
          `Link: ${v.link}`,
          '',
          // The fingerprint is the check: a key fetched from the link must carry it (compare it with the sender).
          'Compare the fingerprint with the sender over another channel before you encrypt anything to the key.',
          `The link works until ${v.expires_at || 'it is revoked'}${v.max_views ? `, for ${v.max_views} view(s)` : ''}.`,
          `Import it with: curl -sH 'Accept: application/pgp-keys' '${v.link}' | gpg --import`,
        ].join('\n'),
      };
    case 'passkey-added':
      return {
        subject: 'A passkey was added to your account',
        text: `Hello ${v.username ?? ''},\n\nA passkey named "${v.name}" was added to your account at ${v.at}. It can now sign in to the account without a password.\nIf this was not you, delete it from your passkeys, change your password and contact support at once.`,
      };
    case 'organization-invite':
      return {
        subject: `${v.inviter ?? 'Someone'} invited you to the organization "${v.organization ?? ''}"`,
        text: [
          `${v.inviter ?? 'Someone'} invited this email address to join the organization "${v.organization ?? ''}" as ${v.role ?? 'member'}.`,
          '',
          `Sign in to the account with this email address and accept within ${v.ttl_hours ?? '72'} hours with this token:`,
          '',
          `Invitation token: ${v.token}`,
          `Or open: ${config.publicUrl}/accept-invitation#token=${encodeURIComponent(v.token ?? '')}`,
          '',
          'Joining moves your account into that organization. If you do not know the sender, ignore this email.',
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
