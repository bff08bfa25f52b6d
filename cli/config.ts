import { chmod, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { apiBase } from '../client/index.js';

/** What `kms login` stores: one service and one credential. */
export interface Credentials {
  url: string;
  token: string;
  kind: 'session' | 'api_key';
  username?: string;
  expires_at?: string | null;
}

export const DEFAULT_URL = 'http://localhost:3000';

/** `$XDG_CONFIG_HOME/kms/credentials.json`, else `~/.config/kms/credentials.json` (XDG Base Directory). */
export function credentialsPath(env: NodeJS.ProcessEnv = process.env): string {
  const base = env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME.startsWith('/') ? env.XDG_CONFIG_HOME : join(env.HOME || homedir(), '.config');
  return join(base, 'kms', 'credentials.json');
}

async function loadCredentials(): Promise<Credentials | undefined> {
  let text: string;
  try {
    text = await readFile(credentialsPath(), 'utf8');
  } catch {
    return undefined;
  }
  try {
    const value = JSON.parse(text) as Partial<Credentials>;
    return typeof value.url === 'string' && typeof value.token === 'string' ? (value as Credentials) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Writes the credentials readable by the user alone: folder 0700, file 0600, written to a temporary
 * file (created 0600, so the secret is never readable by others even for a moment) and renamed.
 */
export async function saveCredentials(creds: Credentials): Promise<string> {
  const path = credentialsPath();
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(creds, null, 2)}\n`, { mode: 0o600 });
  await chmod(tmp, 0o600);
  await rename(tmp, path);
  return path;
}

export async function removeCredentials(): Promise<boolean> {
  const existed = (await loadCredentials()) !== undefined;
  await rm(credentialsPath(), { force: true });
  return existed;
}

export interface Resolved {
  url: string;
  token?: string;
  source: 'KMS_API_KEY' | 'credentials' | 'none';
  creds?: Credentials;
}

/**
 * Which service and credential a command uses: `--url`, then KMS_URL, then the stored URL; KMS_API_KEY,
 * then the stored token. A stored token is only sent to the URL it was issued by, never to another.
 */
export async function resolveTarget(flagUrl?: string, env: NodeJS.ProcessEnv = process.env): Promise<Resolved> {
  const creds = await loadCredentials();
  const url = apiBase(flagUrl || env.KMS_URL || creds?.url || DEFAULT_URL);
  if (env.KMS_API_KEY) return { url, token: env.KMS_API_KEY.trim(), source: 'KMS_API_KEY', creds };
  if (creds && apiBase(creds.url) === url) return { url, token: creds.token, source: 'credentials', creds };
  return { url, source: 'none', creds };
}
