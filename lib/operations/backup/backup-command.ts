import { resolve } from 'node:path';
import type { Config } from '../../config';
import { createContainer } from '../../container';
import { rootsOf } from '../../root-of-trust/keyring';
import { RootKeyError } from '../../root-of-trust/root-key';
import { BackupError, type Manifest } from './archive';
import { openArchive } from './open-archive';
import { restoreBackup } from './restore-backup';
import { takeBackup } from './take-backup';

export const BACKUP_USAGE = 'npm run admin -- backup --out FILE | backup verify FILE | restore FILE [--force]';

const summary = (m: Manifest) =>
  `backup ${m.backup_id} of ${m.created_at}: migration ${m.migrations.at(-1) ?? 'none'}, ${m.counts.users ?? 0} accounts, ` +
  `${m.counts.pgp_keys ?? 0} keys, ${m.counts.audit_logs ?? 0} audit rows, ${m.parts.length - 1} blobs, data keys ${m.keyring.map((k) => k.kid).join(', ')}`;

/**
 * `backup --out FILE` writes an archive of the running service; `backup verify FILE` opens and checks one
 * with the root key configured now, writing nothing; `restore FILE [--force]` restores one into the
 * configured database and blob store (lib/operations/backup/restore-backup.ts). Answers the exit code.
 */
export async function backupCommand(action: 'backup' | 'restore', args: string[], config: Config): Promise<number> {
  const usage = () => {
    console.error(`usage: ${BACKUP_USAGE}`);
    return 2;
  };
  try {
    if (action === 'restore') {
      const files = args.filter((a) => !a.startsWith('--'));
      if (files.length !== 1 || args.some((a) => a.startsWith('--') && a !== '--force')) return usage();
      const started = Date.now();
      const { manifest, blobs } = await restoreBackup(config, resolve(files[0]), { force: args.includes('--force') });
      console.log(`Restored ${summary(manifest)} (${blobs} blobs written) in ${((Date.now() - started) / 1000).toFixed(1)} s.`);
      console.log('Every session issued before is refused: users sign in again. Start the service (its scheduler registers the schedules again).');
      return 0;
    }
    if (args[0] === 'verify') {
      if (args.length !== 2) return usage();
      const roots = rootsOf(config.masterKeys);
      try {
        const { manifest } = await openArchive(resolve(args[1]), roots);
        console.log(`OK: ${summary(manifest)}; it opens with the root key configured here.`);
      } finally {
        await roots.close();
      }
      return 0;
    }
    if (args.length !== 2 || args[0] !== '--out') return usage();
    const c = await createContainer(config);
    try {
      const started = Date.now();
      const { path, bytes, manifest } = await takeBackup(c, resolve(args[1]));
      console.log(`Wrote ${path}: ${summary(manifest)}; ${bytes} bytes in ${((Date.now() - started) / 1000).toFixed(1)} s.`);
      if (manifest.blobs_gone.length) console.log(`${manifest.blobs_gone.length} blob(s) were purged while the backup ran and are not in it.`);
    } finally {
      await c.close();
    }
    return 0;
  } catch (err) {
    if (!(err instanceof BackupError || err instanceof RootKeyError)) throw err;
    console.error(err.message);
    return 1;
  }
}
