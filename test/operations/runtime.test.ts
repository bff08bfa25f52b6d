/**
 * The service runs on the Node LTS that package.json's `engines` names, whatever Node the machine has:
 * the `node` package from the npm registry puts that build in node_modules/.bin, which npm scripts put
 * first on PATH, so `npm start` and `npm test` (and the tsx and vitest they start) run on it.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { hash, verify } from '@node-rs/argon2';
import { describe, expect, it } from 'vitest';

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  engines: { node: string };
  dependencies: Record<string, string>;
};

/** `>=24 <25` → 24: the one major the service is tested on. */
function supportedMajor(range: string): number {
  const m = /^>=(\d+)(?:\.\d+){0,2} <(\d+)$/.exec(range.trim());
  if (!m || Number(m[2]) !== Number(m[1]) + 1) throw new Error(`engines.node should name one major, as ">=24 <25": ${range}`);
  return Number(m[1]);
}

describe('runtime', () => {
  it('runs on the Node major that engines names, the one the node package brings', () => {
    const major = supportedMajor(pkg.engines.node);
    expect(Number(process.versions.node.split('.')[0]), `process.version ${process.version}`).toBe(major);
    expect(pkg.dependencies.node).toMatch(new RegExp(`^\\^${major}\\.`));
  });

  it('loads the native addons on this Node (argon2, msgpackr-extract)', async () => {
    const stored = await hash('a long password', { memoryCost: 1024, timeCost: 1 });
    expect(await verify(stored, 'a long password')).toBe(true);
    expect(await verify(stored, 'another password')).toBe(false);
    // BullMQ's msgpackr loads the native extractor beside it; a build for another ABI would throw here.
    const fromMsgpackr = createRequire(createRequire(import.meta.url).resolve('msgpackr'));
    const extract = fromMsgpackr('msgpackr-extract') as { extractStrings?: unknown };
    expect(typeof extract.extractStrings).toBe('function');
  });
});
