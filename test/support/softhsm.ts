import { execFileSync, spawn } from 'node:child_process';
import { mkdtemp, mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pkcs11js from 'pkcs11js';
import { inject } from 'vitest';

/**
 * A SoftHSM2 token of its own for one test file (SOFTHSM2_CONF points every process of the file at its
 * token folder: this one, the service's, the CLI's), as an HSM would hold the root key. Call `stop` in afterAll.
 */
export const SOFTHSM_MODULE = '/usr/lib/softhsm/libsofthsm2.so';
export const TOKEN_PIN = '1234-token-pin';

export interface SoftHsm {
  dir: string;
  /** A MASTER_KEY_URI for `object` in the token, its PIN read from the file `pin` (`pin` or `wrong-pin`). */
  uri(object: string, pin?: 'pin' | 'wrong-pin'): string;
  /** The labels of the token's secret keys. */
  labels(): string[];
  /** Deletes the keys labelled `label` from the token, as an operator with the PIN could. */
  destroyKey(label: string): void;
  /**
   * Runs `fn` with this process logged out of the token and its PIN file gone (every session of a process
   * shares one login), then puts both back: the token answers as one whose login was lost.
   */
  loggedOut<T>(fn: () => Promise<T>): Promise<T>;
  /**
   * Runs `fn` with the token's folder immutable (chattr +i, which holds for root too): the token keeps
   * its objects but refuses to store a new one, as a full or write-protected token does.
   */
  full<T>(fn: () => Promise<T>): Promise<T>;
  stop(): Promise<void>;
}

export async function startSoftHsm(): Promise<SoftHsm> {
  const dir = await mkdtemp(join(tmpdir(), 'kms-softhsm-'));
  await mkdir(join(dir, 'tokens'));
  await writeFile(join(dir, 'softhsm2.conf'), `directories.tokendir = ${join(dir, 'tokens')}\nobjectstore.backend = file\nlog.level = ERROR\n`);
  await writeFile(join(dir, 'pin'), `${TOKEN_PIN}\n`);
  await writeFile(join(dir, 'wrong-pin'), 'not-the-pin\n');
  process.env.SOFTHSM2_CONF = join(dir, 'softhsm2.conf');
  execFileSync('softhsm2-util', ['--init-token', '--free', '--label', 'kms', '--pin', TOKEN_PIN, '--so-pin', '5678-so-pin'], { stdio: 'ignore' });
  /** A session of this process on the token, logged in (the service in this process may have done both already). */
  const withSession = <T>(use: (p: pkcs11js.PKCS11, session: pkcs11js.Handle) => T): T => {
    const p = new pkcs11js.PKCS11();
    p.load(SOFTHSM_MODULE);
    try {
      p.C_Initialize();
    } catch (err) {
      if (!String(err).includes('CKR_CRYPTOKI_ALREADY_INITIALIZED')) throw err;
    }
    const slot = p.C_GetSlotList(true).find((x) => p.C_GetTokenInfo(x).label.trim() === 'kms')!;
    const session = p.C_OpenSession(slot, pkcs11js.CKF_SERIAL_SESSION | pkcs11js.CKF_RW_SESSION);
    try {
      try {
        p.C_Login(session, pkcs11js.CKU_USER, TOKEN_PIN);
      } catch (err) {
        if (!String(err).includes('CKR_USER_ALREADY_LOGGED_IN')) throw err;
      }
      return use(p, session);
    } finally {
      p.C_CloseSession(session);
    }
  };
  const find = (p: pkcs11js.PKCS11, session: pkcs11js.Handle, template: pkcs11js.Template) => {
    p.C_FindObjectsInit(session, template);
    try {
      return p.C_FindObjects(session, 10_000);
    } finally {
      p.C_FindObjectsFinal(session);
    }
  };
  return {
    dir,
    uri: (object, pin = 'pin') => `pkcs11:token=kms;object=${object}?module-path=${SOFTHSM_MODULE}&pin-source=file:${join(dir, pin)}`,
    labels: () =>
      withSession((p, session) =>
        find(p, session, [{ type: pkcs11js.CKA_CLASS, value: pkcs11js.CKO_SECRET_KEY }]).map((h) =>
          p.C_GetAttributeValue(session, h, [{ type: pkcs11js.CKA_LABEL }])[0].value.toString(),
        ),
      ),
    destroyKey: (label) =>
      withSession((p, session) => find(p, session, [{ type: pkcs11js.CKA_LABEL, value: label }]).forEach((h) => p.C_DestroyObject(session, h))),
    async loggedOut(fn) {
      withSession((p, session) => p.C_Logout(session));
      await rename(join(dir, 'pin'), join(dir, 'pin.away'));
      try {
        return await fn();
      } finally {
        await rename(join(dir, 'pin.away'), join(dir, 'pin'));
        withSession(() => undefined);
      }
    },
    async full(fn) {
      const folders = (await readdir(join(dir, 'tokens'))).map((f) => join(dir, 'tokens', f));
      execFileSync('chattr', ['+i', ...folders]);
      try {
        return await fn();
      } finally {
        execFileSync('chattr', ['-i', ...folders]);
      }
    },
    stop: () => rm(dir, { recursive: true, force: true }),
  };
}

/** A database of this run for commands given none (`master-key init` writes its audit row there), never the machine's default. */
const scratchDatabase = () => {
  const url = new URL(inject('pgBase'));
  url.pathname = `/${inject('runId')}_admin`;
  return url.toString();
};

/** `npm run admin -- …` as an operator runs it. */
export function admin(args: string[], env: Record<string, string>): Promise<{ code: number | null; out: string; err: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'db/cli/admin.ts', ...args], {
    env: { ...process.env, DATABASE_URL: scratchDatabase(), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (err += c.toString()));
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, out, err })));
}
