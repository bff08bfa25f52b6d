import { describe, expect, it } from 'vitest';
import { prepared, preparedStatements } from '../../db/knex';
// The modules that define the service's prepared statements.
import '../../db/jobs';
import '../../db/keys';
import '../../db/teams';
import '../../db/users';

describe('prepared statements', () => {
  it('name every column they read or return: a prepared * breaks when a migration adds a column under a running process', () => {
    expect(preparedStatements.size).toBeGreaterThan(10);
    for (const [name, sql] of preparedStatements) {
      const star = sql.replace(/count\(\*\)/gi, '').match(/\*/);
      expect(star, `${name}: ${sql}`).toBeNull();
    }
  });

  it('refuse a name defined twice (the driver would reject the second text on a connection that has the first)', () => {
    const [name] = preparedStatements.keys();
    expect(() => prepared(name!, 'SELECT 1')).toThrow(/defined twice/);
  });
});
