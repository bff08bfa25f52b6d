/** The service's modules import one another without cycles, and only workers load job processors (scripts/import-graph.ts). */
import { describe, expect, it } from 'vitest';
import { cycles, importGraph, reachable } from '../../scripts/import-graph';

const graph = importGraph();

describe('the import graph of api, lib, jobs, workers and db', () => {
  it('has no cycle, of type or value imports', () => {
    expect(cycles(graph, ['type', 'value'])).toEqual([]);
  });

  it('reaches the job processors only from workers/ and the entry point that starts them (lib/main.ts)', () => {
    const processor = (m: string) => m.startsWith('workers/jobs/') || m === 'workers/processors.ts';
    // lib/main.ts starts a process's roles (web, worker, scheduler) by `import()`: a module that imports
    // main.ts for its other exports (the admin commands' database setup) does not start them.
    const withoutRoles = new Map([...graph].map(([m, edges]) => [m, m === 'lib/main.ts' ? edges.filter((e) => e.kind !== 'dynamic') : edges]));
    const loaders = [...graph.keys()].filter((m) => !m.startsWith('workers/') && m !== 'lib/main.ts');
    expect(loaders.length).toBeGreaterThan(100);
    const reaching = loaders.filter((m) => [...reachable(withoutRoles, m, ['type', 'value', 'dynamic'])].some(processor));
    expect(reaching).toEqual([]);
  });

  it('sees the cycles it is meant to find', () => {
    const looped = new Map([
      ['a.ts', [{ to: 'b.ts', kind: 'value' as const }]],
      ['b.ts', [{ to: 'a.ts', kind: 'type' as const }]],
    ]);
    expect(cycles(looped, ['type', 'value'])).toEqual([['a.ts', 'b.ts']]);
    expect(cycles(looped, ['value'])).toEqual([]);
    // The real graph holds the edges the assertions above rely on.
    expect(graph.get('jobs/client.ts')).toContainEqual({ to: 'jobs/contracts.ts', kind: 'value' });
    expect(graph.get('lib/main.ts')).toContainEqual({ to: 'workers/worker.ts', kind: 'dynamic' });
    expect(graph.get('api/route.ts')).toContainEqual({ to: 'api/context.ts', kind: 'type' });
  });
});
