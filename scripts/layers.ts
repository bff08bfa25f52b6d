/**
 * Where each layer's files are, for the checks that read them (test/codebase/layering.test.ts and
 * scripts/route-index.ts). Routes: api/routes/<first path segment>/*.ts. Services: lib/*.ts and the files
 * of lib/'s area folders (lib/keys/, lib/accounts/, lib/teams/, …), but for the folders of building blocks
 * that hold no service: OpenPGP, the blob store, and the root of trust (which keeps its keyring's own queries).
 * Workers: workers/ and its processors (workers/jobs/), held to the services' rules.
 * Paths are relative to the repository root.
 */
import { readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** lib/'s folders that hold building blocks, not services. */
export const NOT_SERVICES = ['pgp', 'blob', 'root-of-trust'];

const tsOf = (dir: string) =>
  readdirSync(join(root, dir))
    .filter((n) => n.endsWith('.ts'))
    .sort()
    .map((n) => join(dir, n));

const foldersOf = (dir: string) =>
  readdirSync(join(root, dir), { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name)
    .sort();

/** The route files (one folder per first path segment under /api/v1). */
export const routeModules = (): string[] => [...tsOf('api/routes'), ...foldersOf('api/routes').flatMap((f) => tsOf(join('api/routes', f)))];

/** The worker side: the worker's own modules and one processor per job (workers/jobs/), services as lib/'s are. */
export const workerModules = (): string[] => [...tsOf('workers'), ...tsOf('workers/jobs')];

/** The service modules. */
export const serviceModules = (): string[] => [
  ...tsOf('lib'),
  ...foldersOf('lib')
    .filter((f) => !NOT_SERVICES.includes(f))
    .flatMap((f) => tsOf(join('lib', f))),
];
