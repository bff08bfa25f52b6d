import { loadConfig } from '../../lib/config';
import { ensureDatabase, openDatabase } from '../knex';
import { migrateLatest, migrateRollback } from '../migrate';

/** `npm run migrate` applies pending migrations; `npm run migrate -- rollback` undoes the last batch. */
const config = loadConfig();
await ensureDatabase(config.databaseUrl);
const db = openDatabase(config, { max: 1 });
try {
  const done = process.argv[2] === 'rollback' ? await migrateRollback(db) : await migrateLatest(db);
  console.log(done.length ? `${process.argv[2] === 'rollback' ? 'rolled back' : 'applied'}: ${done.join(', ')}` : 'nothing to do');
} finally {
  await db.destroy();
}
