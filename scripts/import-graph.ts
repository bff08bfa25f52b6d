/**
 * The import graph of the service's own modules (api, lib, jobs, workers, db), read from their source
 * with a regular expression: enough for this code base, whose imports are all single-quoted and whose
 * relative specifiers name a .ts file or a folder's index.ts. Its cycles and what a module reaches are
 * checked by test/codebase/import-graph.test.ts; `npx tsx scripts/import-graph.ts` prints the cycles.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const GRAPH_DIRS = ['api', 'lib', 'jobs', 'workers', 'db'];

/** `type`: erased at run time; `value`: loaded with the module; `dynamic`: loaded when the `import()` runs. */
export type EdgeKind = 'type' | 'value' | 'dynamic';
export interface Edge {
  to: string;
  kind: EdgeKind;
}
/** Module (path from the repository root, e.g. `api/route.ts`) → what it imports. */
export type ImportGraph = Map<string, Edge[]>;

const STATIC = /(?:^|[\n;])\s*(import|export)\s+(type\s+)?([\w\s{},*$]*?)\s*from\s*'([^']+)'/g;
const BARE = /(?:^|[\n;])\s*import\s*'([^']+)'/g;
const DYNAMIC = /\bimport\(\s*'([^']+)'\s*\)/g;

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : tsFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

function resolveSpecifier(from: string, specifier: string): string | undefined {
  if (!specifier.startsWith('.')) return undefined;
  const base = resolve(dirname(join(ROOT, from)), specifier);
  for (const candidate of [base, `${base}.ts`, join(base, 'index.ts')]) {
    if (candidate.endsWith('.ts') && existsSync(candidate)) return relative(ROOT, candidate);
  }
  return undefined;
}

/** Only types named (`import type`, or every name marked `type`): nothing of the module loads. */
function typeOnly(typeKeyword: string | undefined, clause: string): boolean {
  if (typeKeyword) return true;
  const braces = /^\{([^}]*)\}$/.exec(clause.trim());
  if (!braces) return false;
  const names = braces[1]
    .split(',')
    .map((n) => n.trim())
    .filter(Boolean);
  return names.length > 0 && names.every((n) => n.startsWith('type '));
}

export function importGraph(dirs = GRAPH_DIRS): ImportGraph {
  const graph: ImportGraph = new Map();
  for (const file of dirs.flatMap((d) => tsFiles(join(ROOT, d))).map((f) => relative(ROOT, f))) {
    const source = readFileSync(join(ROOT, file), 'utf8');
    const edges: Edge[] = [];
    const add = (specifier: string, kind: EdgeKind) => {
      const to = resolveSpecifier(file, specifier);
      if (to) edges.push({ to, kind });
    };
    for (const m of source.matchAll(STATIC)) add(m[4], typeOnly(m[2], m[3]) ? 'type' : 'value');
    for (const m of source.matchAll(BARE)) add(m[1], 'value');
    for (const m of source.matchAll(DYNAMIC)) add(m[1], 'dynamic');
    graph.set(file, edges);
  }
  return graph;
}

/**
 * The import cycles: strongly connected components of more than one module (or a module importing
 * itself), over the edges of the given kinds, each sorted, largest first.
 */
export function cycles(graph: ImportGraph, kinds: EdgeKind[] = ['type', 'value']): string[][] {
  const next = (v: string) => [...new Set((graph.get(v) ?? []).filter((e) => kinds.includes(e.kind)).map((e) => e.to))];
  // Tarjan's algorithm, iterative: a deep import chain must not overflow the stack.
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const found: string[][] = [];
  let counter = 0;
  for (const root of graph.keys()) {
    if (index.has(root)) continue;
    const work: { v: string; out: string[]; i: number }[] = [];
    const open = (v: string) => {
      index.set(v, counter);
      low.set(v, counter++);
      stack.push(v);
      onStack.add(v);
      work.push({ v, out: next(v), i: 0 });
    };
    open(root);
    while (work.length) {
      const top = work[work.length - 1];
      if (top.i < top.out.length) {
        const w = top.out[top.i++];
        if (!index.has(w)) open(w);
        else if (onStack.has(w)) low.set(top.v, Math.min(low.get(top.v)!, index.get(w)!));
        continue;
      }
      work.pop();
      if (work.length) {
        const parent = work[work.length - 1].v;
        low.set(parent, Math.min(low.get(parent)!, low.get(top.v)!));
      }
      if (low.get(top.v) === index.get(top.v)) {
        const component: string[] = [];
        for (let w: string | undefined; w !== top.v;) {
          w = stack.pop()!;
          onStack.delete(w);
          component.push(w);
        }
        if (component.length > 1 || next(top.v).includes(top.v)) found.push(component.sort());
      }
    }
  }
  return found.sort((a, b) => b.length - a.length || a[0].localeCompare(b[0]));
}

/** Every module `from` loads, directly or through others, over the edges of the given kinds. */
export function reachable(graph: ImportGraph, from: string, kinds: EdgeKind[] = ['value', 'dynamic']): Set<string> {
  const seen = new Set<string>();
  const todo = [from];
  while (todo.length) {
    for (const e of graph.get(todo.pop()!) ?? []) {
      if (kinds.includes(e.kind) && !seen.has(e.to)) {
        seen.add(e.to);
        todo.push(e.to);
      }
    }
  }
  return seen;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const graph = importGraph();
  for (const [label, kinds] of [
    ['cycles (type and value imports)', ['type', 'value']],
    ['cycles at run time (value imports)', ['value']],
  ] as const) {
    const found = cycles(graph, [...kinds]);
    console.log(`${label}: ${found.length}`);
    for (const c of found) console.log(`  ${c.length}: ${c.join(' ')}`);
  }
}
