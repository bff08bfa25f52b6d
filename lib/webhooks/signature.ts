import { createHmac, randomBytes } from 'node:crypto';

/**
 * Standard Webhooks signing (https://www.standardwebhooks.com): secrets are `whsec_` + base64 of 24–64
 * random bytes; a signature is `v1,` + base64(HMAC-SHA256(secret bytes, `{id}.{timestamp}.{body}`)).
 * Several signatures are sent space-separated, so a receiver holding either the old or the new secret
 * verifies a delivery made during a rotation's grace period.
 */
const PREFIX = 'whsec_';

export function newWebhookSecret(): string {
  return PREFIX + randomBytes(32).toString('base64');
}

function secretBytes(secret: string): Buffer {
  if (!secret.startsWith(PREFIX)) throw new Error('webhook secret: missing the whsec_ prefix');
  return Buffer.from(secret.slice(PREFIX.length), 'base64');
}

function signatureHeader(secrets: string[], msgId: string, timestampSeconds: number, body: string): string {
  const content = `${msgId}.${timestampSeconds}.${body}`;
  return secrets.map((s) => 'v1,' + createHmac('sha256', secretBytes(s)).update(content).digest('base64')).join(' ');
}

/** The three headers of one attempt: the id stays the same across retries, the timestamp is the attempt's. */
export function webhookHeaders(secrets: string[], msgId: string, at: Date, body: string): Record<string, string> {
  const timestamp = Math.floor(at.getTime() / 1000);
  return {
    'webhook-id': msgId,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': signatureHeader(secrets, msgId, timestamp, body),
  };
}
