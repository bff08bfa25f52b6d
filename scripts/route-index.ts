/**
 * Writes docs/routes.md: every route of api/app.ts's list (method and path → route file, access or scope,
 * the job its handler enqueues, the test files that call its path). `npm run docs:routes` regenerates it;
 * test/codebase/route-index.test.ts fails when the committed file differs from what this prints.
 *
 * The route file is found by identity: each default import of api/app.ts is loaded and its declarations
 * matched against the route list. The job is read from the route's declaration in that file: a
 * `jobs.enqueue('name'` in it, or in a function it calls by name, of the same file or of a service module
 * (scripts/layers.ts: lib/ and its area folders, lib/keys/, lib/accounts/, …).
 * Test files are matched by the paths they write (`/keys/${fpr}/rotate` matches `/keys/{fingerprint}/rotate`;
 * a literal segment beats a parameter), and by method where the call names one.
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { RouteDef } from '../api/route';
import { serviceModules } from './layers';

const root = resolve(fileURLToPath(new URL('..', import.meta.url)));
export const ROUTE_INDEX = join(root, 'docs', 'routes.md');
const METHODS = ['get', 'post', 'put', 'patch', 'delete'] as const;

type Method = RouteDef['method'];
/** A job enqueued by name; the handler's text may come back from the TypeScript loader with either quote. */
const ENQUEUE = /\.enqueue\(\s*['"]([\w-]+)['"]/g;

/** Default imports of api/app.ts that come from a file of its own: `import x from './routes/x'`. */
async function routeFiles(): Promise<Array<{ file: string; defs: RouteDef[] }>> {
  const app = join(root, 'api', 'app.ts');
  const text = readFileSync(app, 'utf8');
  const out: Array<{ file: string; defs: RouteDef[] }> = [];
  for (const m of text.matchAll(/^import\s+\w+\s+from\s+'(\.[^']+)';/gm)) {
    const path = resolve(join(root, 'api'), m[1]) + '.ts';
    const mod = (await import(pathToFileURL(path).href)) as { default?: unknown };
    if (Array.isArray(mod.default)) out.push({ file: relative(root, path), defs: mod.default as RouteDef[] });
  }
  return out;
}

/** Job names enqueued per top-level function of a file (`function f` / `const f =`), and in the whole file. */
function enqueuesByFunction(source: string): Map<string, Set<string>> {
  const found = new Map<string, Set<string>>();
  // Every declaration starts at column 0; an enqueue belongs to the last one before it, if that names a function.
  const named = /^(?:export\s+)?(?:async\s+)?(?:function\s+(\w+)|const\s+(\w+)\s*=)/;
  const starts = [...source.matchAll(/^[a-z].*$/gm)].map((m) => ({ at: m.index, name: named.exec(m[0]) }));
  for (const m of source.matchAll(ENQUEUE)) {
    const owner = starts.filter((s) => s.at < m.index).at(-1)?.name;
    if (!owner) continue;
    const name = owner[1] ?? owner[2];
    if (!found.has(name)) found.set(name, new Set());
    found.get(name)!.add(m[1]);
  }
  return found;
}

/** Functions of the service modules that enqueue a job themselves (a route reaches them by name). */
function serviceEnqueues(): Map<string, Set<string>> {
  const found = new Map<string, Set<string>>();
  for (const f of serviceModules()) {
    for (const [fn, names] of enqueuesByFunction(readFileSync(join(root, f), 'utf8'))) found.set(fn, new Set([...(found.get(fn) ?? []), ...names]));
  }
  return found;
}

/** The route's own declaration in its file's source, from its method and path to the next `route(`. */
function declaration(def: RouteDef, source: string): string | undefined {
  const esc = (t: string) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const start = new RegExp(`method:\\s*'${def.method}',\\s*path:\\s*'${esc(def.path)}'`).exec(source);
  if (!start) return undefined;
  const end = source.indexOf('route(', start.index);
  return source.slice(start.index, end < 0 ? undefined : end);
}

function jobsOf(def: RouteDef, source: string, callable: Map<string, Set<string>>): string[] {
  const text = declaration(def, source) ?? def.handler.toString();
  const jobs = new Set([...text.matchAll(ENQUEUE)].map((m) => m[1]));
  for (const [fn, names] of callable) {
    if (new RegExp(`\\b${fn}\\s*\\(`).test(text)) for (const n of names) jobs.add(n);
  }
  return [...jobs].sort();
}

/** A path a test writes: its segments (`*` for an interpolation) and the method named just before it, if any. */
interface TestPath {
  segments: string[];
  method?: Method;
}

function pathsIn(text: string): TestPath[] {
  const out: TestPath[] = [];
  for (const m of text.matchAll(/'([^'\n]*)'|"([^"\n]*)"|`([^`\n]*)`/g)) {
    // `${base}/api/v1/keys/${fpr}/rotate?x=${y}` → /keys/*/rotate; a title may name the method ('GET /events').
    const own = /^(?:(GET|POST|PUT|PATCH|DELETE) )?(?:\$\{[^}]*\})?(?:\/api\/v1)?(\/[^\s?]*)/.exec(m[1] ?? m[2] ?? m[3]);
    if (!own || own[2].includes('//')) continue;
    const path = own[2]
      .replace(/\$\{[^}]*\}/g, '*')
      .replace(/([^/*])\*+$/, '$1')
      .replace(/\/$/, '');
    if (!/^(?:\/[\w.*-]+)+$/.test(path)) continue;
    const segments = path
      .split('/')
      .slice(1)
      .map((seg) => (seg.includes('*') ? '*' : seg));
    const before = text.slice(Math.max(0, m.index - 60), m.index);
    const named = own[1] ?? [...before.matchAll(/['"`.](GET|POST|PUT|PATCH|DELETE|get|post|put|patch|del|delete)\b/g)].at(-1)?.[1];
    const method = named?.toLowerCase() === 'del' ? 'delete' : named?.toLowerCase();
    out.push({ segments, method: method && (METHODS as readonly string[]).includes(method) ? (method as Method) : undefined });
  }
  return out;
}

function testFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return testFiles(p);
    return /\.(?:test\.ts|py)$/.test(e.name) ? [p] : [];
  });
}

/** How well a route's path fits a test's path: literal segments matched, or -1 for no fit. */
function fit(route: string[], test: string[]): number {
  if (route.length !== test.length) return -1;
  let literal = 0;
  for (let i = 0; i < route.length; i++) {
    if (/^\{.+\}$/.test(route[i])) continue;
    if (route[i] !== test[i]) return -1;
    literal++;
  }
  return literal;
}

export async function routeIndex(): Promise<string> {
  const { routes } = (await import('../api/app')) as { routes: RouteDef[] };
  const files = await routeFiles();
  const fileOf = new Map<RouteDef, string>();
  for (const { file, defs } of files) for (const d of defs) fileOf.set(d, file);
  const services = serviceEnqueues();
  // What a handler can call by name: the functions of its own file, then those of the service modules.
  const sources = new Map(files.map(({ file }) => [file, readFileSync(join(root, file), 'utf8')]));
  const callable = new Map([...sources].map(([file, text]) => [file, new Map([...services, ...enqueuesByFunction(text)])]));

  const segmentsOf = (d: RouteDef) => d.path.replace(/\/$/, '').split('/').slice(1);
  const tested = new Map<RouteDef, Set<string>>(routes.map((d) => [d, new Set()]));
  for (const file of testFiles(join(root, 'test')).sort()) {
    const name = relative(root, file);
    for (const p of pathsIn(readFileSync(file, 'utf8'))) {
      const scored = routes.map((d) => ({ d, score: fit(segmentsOf(d), p.segments) })).filter((x) => x.score >= 0);
      const best = Math.max(-1, ...scored.map((x) => x.score));
      for (const { d, score } of scored) {
        if (score === best && (!p.method || p.method === d.method)) tested.get(d)!.add(name);
      }
    }
  }

  const cell = (s: string) => s.replace(/\|/g, '\\|');
  const lines = [
    '# Route index',
    '',
    'Generated by `npm run docs:routes` (scripts/route-index.ts) from the route list in api/app.ts; test/codebase/route-index.test.ts',
    'fails when it is stale. Paths are under `/api/v1` (`GET /health` also answers at the root). **Access**: `public`,',
    '`session` (a signed-in session only), `admin`, or the scope a managed API key needs (sessions and the partner key hold',
    'every scope). **Job**: what the handler enqueues. **Tests**: test files that call the path.',
    '',
    '| method | path | route file | access | job | tests |',
    '|---|---|---|---|---|---|',
  ];
  for (const d of routes) {
    const file = fileOf.get(d) ?? '?';
    const access = d.access === 'auth' ? `\`${d.scope ?? '?'}\`` : d.access;
    const jobs =
      jobsOf(d, sources.get(file) ?? '', callable.get(file) ?? services)
        .map((j) => `\`${j}\``)
        .join(', ') || '–';
    const tests =
      [...tested.get(d)!]
        .sort()
        .map((t) => t.replace(/^test\//, ''))
        .join(', ') || '**none**';
    lines.push(`| ${d.method.toUpperCase()} | \`${cell(d.path)}\` | ${file} | ${access} | ${jobs} | ${tests} |`);
  }
  return lines.join('\n') + '\n';
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  writeFileSync(ROUTE_INDEX, await routeIndex());
  console.log(`wrote ${relative(root, ROUTE_INDEX)}`);
}
