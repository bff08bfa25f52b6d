import { loadConfig } from '../../lib/config';
import { openDatabase } from '../knex';
import { findUserByLogin, updateUser } from '../users';
import { recordAudit } from '../audit';
import { masterKeyCommand, MASTER_KEY_USAGE } from '../../lib/root-of-trust/admin';
import { backupCommand, BACKUP_USAGE } from '../../lib/operations/backup/backup-command';

/**
 * Operator commands, run with database access:
 * - `npm run admin -- grant|revoke <username|email>` grants or revokes the admin role. Admin is never
 *   granted through the API; this command and ADMIN_EMAILS are the only ways.
 * - `npm run admin -- master-key …` manages the root of trust (lib/root-of-trust/admin.ts).
 * - `npm run admin -- backup …` and `restore …` take, verify and restore backups (lib/operations/backup/).
 */
const [action, ...args] = process.argv.slice(2);
if (action === 'master-key') {
  process.exitCode = await masterKeyCommand(args, loadConfig());
} else if (action === 'backup' || action === 'restore') {
  process.exitCode = await backupCommand(action, args, loadConfig());
} else if ((action !== 'grant' && action !== 'revoke') || !args[0]) {
  console.error(`usage: npm run admin -- grant|revoke <username|email>\n       ${MASTER_KEY_USAGE}\n       ${BACKUP_USAGE}`);
  process.exit(2);
} else {
  const identifier = args[0];
  const db = openDatabase(loadConfig(), { max: 1 });
  try {
    const user = await findUserByLogin(db, identifier);
    if (!user) {
      console.error(`no account "${identifier}"`);
      process.exitCode = 1;
    } else {
      await db.transaction(async (trx) => {
        await updateUser(trx, user.id, { role: action === 'grant' ? 'admin' : 'user' });
        await recordAudit(trx, {
          user_id: user.id,
          action: action === 'grant' ? 'users.promote' : 'users.demote',
          status: 'success',
          target: user.id,
          details: { via: 'admin-cli' },
        });
      });
      console.log(`${user.username}: role ${action === 'grant' ? 'admin' : 'user'}`);
    }
  } finally {
    await db.destroy();
  }
}
