/** docs/routes.md is generated (scripts/route-index.ts): this fails when a route, its file, scope, job or tests moved on without it. */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ROUTE_INDEX, routeIndex } from '../../scripts/route-index';

describe('docs/routes.md', () => {
  it('is what `npm run docs:routes` writes today', async () => {
    const fresh = await routeIndex();
    expect(readFileSync(ROUTE_INDEX, 'utf8'), 'docs/routes.md is stale: run `npm run docs:routes` and commit it').toBe(fresh);
    expect(fresh).not.toContain('| ? |');
  }, 120_000);
});
