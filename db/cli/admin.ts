import { loadConfig } from '../../lib/config';
import { openDatabase } from '../knex';
import { findUserByLogin, updateUser } from '../users';
import { recordAudit } from '../audit';

/**
 * Grants or revokes the admin role: `npm run admin -- grant <username|email>` (or `revoke`).
 * Admin is never granted through the API; this command (run by an operator with database access)
 * and ADMIN_EMAILS are the only ways.
 */
const [action, identifier] = process.argv.slice(2);
if ((action !== 'grant' && action !== 'revoke') || !identifier) {
  console.error('usage: npm run admin -- grant|revoke <username|email>');
  process.exit(2);
}
const db = openDatabase(loadConfig(), { max: 1 });
try {
  const user = await findUserByLogin(db, identifier);
  if (!user) {
    console.error(`no account "${identifier}"`);
    process.exitCode = 1;
  } else {
    await db.transaction(async (trx) => {
      await updateUser(trx, user.id, { role: action === 'grant' ? 'admin' : 'user' });
      await recordAudit(trx, { user_id: user.id, action: action === 'grant' ? 'user.promote' : 'user.demote', status: 'success', target: user.id, details: { via: 'admin-cli' } });
    });
    console.log(`${user.username}: role ${action === 'grant' ? 'admin' : 'user'}`);
  }
} finally {
  await db.destroy();
}
