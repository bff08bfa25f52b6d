/**
 * Data access has one rule: routes (and the rest of the HTTP layer) call services, services call db/, and only
 * db/ writes queries. A route that opens a transaction or a service that names a table has put a query
 * where no one looks for it; a migration that imports the service's code changes what it did whenever that code changes.
 * Audit rows take the request's address and id in one place (recordAudit's `from`), never copied by hand.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { routeModules, serviceModules, workerModules } from '../../scripts/layers';

const filesOf = (dir: string) =>
  readdirSync(dir)
    .filter((f) => f.endsWith('.ts'))
    .map((f) => join(dir, f));

interface Rule {
  name: string;
  re: RegExp;
}

/** Every line of `files` that matches a rule, as `file:line: rule: text`. */
function breaches(files: string[], rules: Rule[]): string[] {
  const found: string[] = [];
  for (const file of files) {
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, i) => {
        for (const { name, re } of rules) if (re.test(line)) found.push(`${file}:${i + 1}: ${name}: ${line.trim().slice(0, 140)}`);
      });
  }
  return found;
}

/** Import statements (one or more lines each) with the module they name. */
function importsOf(file: string): { statement: string; from: string; line: number }[] {
  const text = readFileSync(file, 'utf8');
  const out: { statement: string; from: string; line: number }[] = [];
  for (const m of text.matchAll(/^(?:import|export)\b[^;]*?\bfrom\s+'([^']+)'/gm)) {
    out.push({ statement: m[0], from: m[1], line: text.slice(0, m.index).split('\n').length });
  }
  for (const m of text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g)) {
    out.push({ statement: m[0], from: m[1], line: text.slice(0, m.index).split('\n').length });
  }
  return out;
}

const typeOnly = (statement: string) => /^(?:import|export)\s+type\b/.test(statement);

/** A query written in place: a table call on a connection or transaction, or raw SQL. */
const QUERIES: Rule[] = [
  { name: 'a table call', re: /\b(?:db|trx|knex)\s*(?:<[^>]*>\s*)?\(\s*['"`]/ },
  { name: 'a query on the connection', re: /\b(?:db|trx|knex)\.(?:from|select|insert|update|table|queryBuilder)\(/ },
  { name: 'raw SQL', re: /\.(?:raw|whereRaw|joinRaw|orderByRaw)\(/ },
];

/**
 * A query built in place on something db/ handed out: services call db/ functions named after what
 * they do and never chain a query builder. These methods are knex's; no service uses them on anything
 * else (update, delete and select are left out: hashes, Maps and Sets have them too).
 */
const CHAINS: Rule[] = [
  {
    name: 'a query chained in a service',
    re: /\.(?:where|whereIn|whereNot|whereNotIn|whereNull|whereNotNull|whereExists|andWhere|orWhere|orWhereIn|orWhereNotIn|forUpdate|forShare|forNoKeyUpdate|returning|orderBy|groupBy|having|count|first|insert|onConflict|increment|decrement|pluck)\(/,
  },
];

/** A db/ export that hands out a bare table (`export const t = (db: Knex) => db<Row>('t')`), for others to chain queries on. */
const TABLE_HELPERS: Rule[] = [
  {
    name: 'an exported table helper',
    re: /^export\s+const\s+\w+\s*=\s*\(\s*\w+\s*:\s*Knex(?:\.Transaction)?\s*\)\s*(?::[^=]+)?=>\s*\w+\s*(?:<[^>]*>)?\(\s*['"`][\w.]+(?:\s+as\s+\w+)?['"`]\s*\)\s*;?\s*$/,
  },
  {
    name: 'an exported table helper',
    re: /^export\s+function\s+\w+\s*\(\s*\w+\s*:\s*Knex(?:\.Transaction)?\s*\)[^{]*\{\s*return\s+\w+\s*(?:<[^>]*>)?\(\s*['"`][\w.]+['"`]\s*\)\s*;?\s*\}\s*$/,
  },
];

/** What only a service does: open a transaction, or query. */
const ROUTE_RULES: Rule[] = [
  { name: 'a database call', re: /\bc\.db\b/ },
  { name: 'a transaction', re: /\.transaction\(/ },
  { name: 'a transaction call', re: /\btrx\(/ },
  ...QUERIES,
];

/** The request's address and id copied into an audit row by hand. */
const AUDIT_RULES: Rule[] = [
  { name: 'an audit row copying the request id', re: /\brequest_id:\s*(?:meta|ctx|req|input\.meta)\b/ },
  { name: 'an audit row copying the address', re: /\bip:\s*(?:meta\??\.ip|input\.meta\??\.ip|req\.ip)\b/ },
];

// Routes: api/routes/<first path segment>/; services: lib/ and its area folders, and workers/ (scripts/layers.ts).
const routes = routeModules();
/** The HTTP layer besides the routes: middleware, and api/'s own modules (the route mechanism, job replies, uploads). */
const middleware = [...filesOf('api/middleware'), ...filesOf('api')];
/** Services, and the worker side that calls them as a route does (its processors are services too). */
const services = [...serviceModules(), ...workerModules()];
const migrations = filesOf('db/migrations');

/** The values an import statement names (`type` specifiers left out); empty for a default or namespace import. */
const namedValues = (statement: string): string[] =>
  (/\{([^}]*)\}/.exec(statement)?.[1] ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n && !n.startsWith('type '));

/** db/ values middleware may import, by module: the load shedder reads the pool's queue length (pool monitoring, not a query). */
const MIDDLEWARE_DB_VALUES: Record<string, string[]> = { 'db/knex': ['waitingForConnection'] };

/** Imports of values (not only types) from db/, but for those `allowed` names by module. */
function dbValueImports(files: string[], allowed: Record<string, string[]> = {}): string[] {
  const isAllowed = (statement: string, from: string) => {
    const names = namedValues(statement);
    const ok = allowed[from.replace(/^(?:\.\.?\/)+/, '')];
    return Boolean(ok && names.length && !/\bimport\s+(?!type\b)\w+\s*,|\*\s+as\b/.test(statement) && names.every((n) => ok.includes(n)));
  };
  return files.flatMap((file) =>
    importsOf(file)
      .filter((i) => /(?:^|\/)db\//.test(i.from) && !typeOnly(i.statement) && !isAllowed(i.statement, i.from))
      .map((i) => `${file}:${i.line}: imports values from ${i.from}`),
  );
}

function migrationImports(): string[] {
  return migrations.flatMap((file) =>
    importsOf(file)
      .filter((i) => !typeOnly(i.statement) && !(i.from === 'knex' || i.from.startsWith('node:') || /^\.\/[\w-]+$/.test(i.from)))
      .map((i) => `${file}:${i.line}: imports ${i.from}`),
  );
}

/**
 * db/'s exports say exactly what they answer, so that services chain no query on them (CHAINS) by type
 * and not only by text. Every exported function of db/*.ts has its return type written, and it is what
 * the caller gets (rows, a count, a flag, void): never a knex query builder or raw query, on which a
 * caller could chain more query and which runs only once awaited. The one builder handed out is `Write`
 * (db/knex.ts), a write that db/ runs within another statement (withWrites), returned under that name.
 * A function that answers a promise is `async`: a builder typed as a promise passes the compiler, but its
 * query runs only when awaited, so a call whose result is dropped would do nothing. And no exported
 * signature has `any` in what it takes or answers: across a module boundary it turns the
 * compiler's checks off on both sides. Types are read through unions, intersections, type arguments and
 * the members of the project's own and of anonymous types; a dependency's named types (Date, Buffer,
 * knex's builders) only by the type arguments db/ gives them, their members being the dependency's. The
 * connection (Knex, Knex.Transaction) is left as knex types it, its rows `any` by knex's defaults: it is
 * what every db/ function takes and narrows with its row types (`db<JobRow>('jobs')`), and what createDb
 * makes.
 */
function signatureBreaches(program: ts.Program, files: string[]): string[] {
  const checker = program.getTypeChecker();
  const moduleOf = (file: string) => checker.getSymbolAtLocation(program.getSourceFile(file)!)!;
  const write = checker.getExportsOfModule(moduleOf('db/knex.ts')).find((s) => s.name === 'Write');
  const declaredIn = (symbol: ts.Symbol | undefined, re: RegExp) => Boolean(symbol?.declarations?.some((d) => re.test(d.getSourceFile().fileName)));
  const knexType = (symbol: ts.Symbol | undefined, names: string[]) =>
    Boolean(symbol && names.includes(symbol.name) && declaredIn(symbol, /[/\\]node_modules[/\\]knex[/\\]/));
  /** `any` and knex's query types found in `type`. */
  const scan = (type: ts.Type, found = new Set<'any' | 'a query builder'>(), seen = new Set<ts.Type>()) => {
    const walk = (t: ts.Type) => void scan(t, found, seen);
    if (seen.has(type)) return found;
    seen.add(type);
    if (type.flags & ts.TypeFlags.Any) found.add('any');
    else if (type.isUnionOrIntersection()) type.types.forEach(walk);
    else if (type.flags & ts.TypeFlags.TypeParameter) {
      const constraint = checker.getBaseConstraintOfType(type);
      if (constraint) walk(constraint);
    } else if (type.flags & ts.TypeFlags.Object) {
      const reference = (type as ts.ObjectType).objectFlags & ts.ObjectFlags.Reference ? (type as ts.TypeReference) : undefined;
      const target = reference?.target ?? (type as ts.ObjectType);
      const symbol = target.getSymbol();
      if (knexType(symbol, ['Knex', 'Transaction'])) return found;
      if (knexType(symbol, ['QueryBuilder', 'Raw'])) found.add('a query builder');
      if (reference) checker.getTypeArguments(reference).forEach(walk);
      // A tuple's members, and those of a dependency's class or interface, are the library's: only their type arguments are db/'s.
      const opaque =
        target.objectFlags & ts.ObjectFlags.Tuple || (target.objectFlags & ts.ObjectFlags.ClassOrInterface && declaredIn(symbol, /[/\\]node_modules[/\\]/));
      if (!opaque) {
        for (const p of checker.getPropertiesOfType(type)) walk(checker.getTypeOfSymbol(p));
        for (const i of checker.getIndexInfosOfType(type)) walk(i.type);
        for (const s of [...type.getCallSignatures(), ...type.getConstructSignatures()]) {
          s.getParameters().forEach((p) => walk(checker.getTypeOfSymbol(p)));
          walk(s.getReturnType());
        }
      }
    }
    return found;
  };
  const isWrite = (node: ts.TypeNode | undefined) => {
    const symbol = node && ts.isTypeReferenceNode(node) ? checker.getSymbolAtLocation(node.typeName) : undefined;
    return Boolean(write && symbol && (symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol) === write);
  };
  const text = (type: ts.Type) => checker.typeToString(type).slice(0, 100);
  const found: string[] = [];
  for (const file of files) {
    // Types have no value declaration; a re-export is checked where it is declared.
    for (const exported of checker.getExportsOfModule(moduleOf(file)).filter((s) => s.valueDeclaration)) {
      const at = `${file}: ${exported.name}`;
      for (const signature of checker.getTypeOfSymbol(exported).getCallSignatures()) {
        const written = signature.getDeclaration().type;
        const returned = signature.getReturnType();
        const inReturn = scan(returned);
        if (!written) found.push(`${at}: no return type written`);
        if (inReturn.has('a query builder') && !isWrite(written)) found.push(`${at}: answers a query builder (${text(returned)})`);
        if (inReturn.has('any')) found.push(`${at}: answers any (${text(returned)})`);
        const declaration = signature.getDeclaration();
        const isAsync = ts.canHaveModifiers(declaration) && ts.getModifiers(declaration)?.some((m) => m.kind === ts.SyntaxKind.AsyncKeyword);
        if (returned.getSymbol()?.name === 'Promise' && !isAsync) found.push(`${at}: answers a promise without being async (${text(returned)})`);
        for (const p of signature.getParameters()) {
          const type = checker.getTypeOfSymbol(p);
          if (scan(type).has('any')) found.push(`${at}: takes any (${p.name}: ${text(type)})`);
        }
      }
    }
  }
  return found;
}

/** Exports that break the rule above or keep it, for the check of the check. */
const SIGNATURE_FIXTURE = `import type { Knex, Write } from '${resolve('db/knex')}';
export const builder = (db: Knex) => db<{ id: string }>('t').where({ id: 'a' });
export const raw = (db: Knex): Knex.Raw => db.raw('select 1');
export async function anyRow(db: Knex): Promise<any> { return db('t').first(); }
export const anyRows = async (rows: Knex.QueryBuilder): Promise<void> => { await rows; };
export const write = (db: Knex): Write => db('t').insert({ id: 'a' });
export const row = async (db: Knex, trx: Knex.Transaction, id: string): Promise<{ id: string } | undefined> => db<{ id: string }>('t').where({ id }).first();
export const lazy = (db: Knex): Promise<{ id: string } | undefined> => db<{ id: string }>('t').first();
export function lazier(db: Knex): Promise<number> { return db('t').delete(); }
`;

/** db/*.ts and the fixture, in one program (with the repository's compiler options). */
let compiled: { program: ts.Program; fixture: string } | undefined;
function dbProgram() {
  if (compiled) return compiled;
  const fixture = join(mkdtempSync(join(tmpdir(), 'layering-')), 'fixture.ts');
  writeFileSync(fixture, SIGNATURE_FIXTURE);
  const { options } = ts.parseJsonConfigFileContent(ts.readConfigFile('tsconfig.json', (f) => ts.sys.readFile(f)).config, ts.sys, '.');
  return (compiled = { program: ts.createProgram([...filesOf('db'), fixture], options), fixture });
}

describe('layering', () => {
  it('routes call services: no query, transaction or db/ function in api/routes', () => {
    expect([...dbValueImports(routes), ...breaches(routes, ROUTE_RULES)]).toEqual([]);
  });

  it('the rest of the HTTP layer calls services as routes do: no query, transaction or db/ function in api/ and api/middleware (but the pool monitor)', () => {
    expect(middleware).toEqual(expect.arrayContaining(['api/middleware/auth.ts', 'api/middleware/overload.ts', 'api/job-reply.ts', 'api/upload.ts']));
    expect([...dbValueImports(middleware, MIDDLEWARE_DB_VALUES), ...breaches(middleware, ROUTE_RULES)]).toEqual([]);
  });

  it('services call db/: no table call or raw SQL in lib/ and its area folders (lib/keys, lib/accounts, …) or in workers/', () => {
    expect(breaches(services, QUERIES)).toEqual([]);
  });

  it('services call named db/ functions: no query chained on what db/ hands out, and db/ hands out no bare table', () => {
    expect(breaches(services, CHAINS)).toEqual([]);
    expect(breaches(filesOf('db'), TABLE_HELPERS)).toEqual([]);
  });

  it('db/ hands out what its functions answer: a written return type, no query builder but a Write, no any', () => {
    const { program } = dbProgram();
    expect(signatureBreaches(program, filesOf('db'))).toEqual([]);
  });

  it('the rules read every route file and every service module, never the building blocks of lib/pgp', () => {
    expect(routes.length).toBeGreaterThanOrEqual(20);
    expect(services).toEqual(
      expect.arrayContaining([
        'lib/keys/key-catalog.ts',
        'lib/billing/subscriptions.ts',
        'lib/notify.ts',
        'lib/auth/ownership.ts',
        'workers/jobs/expiry-sweep.ts',
      ]),
    );
    expect(services.filter((f) => f.startsWith('lib/pgp/'))).toEqual([]);
  });

  it('a migration holds all it runs: nothing but types from outside db/migrations (and knex, node:)', () => {
    expect(migrationImports()).toEqual([]);
  });

  it("audit rows take the request's address and id from recordAudit's source, not by hand", () => {
    expect(breaches([...routes, ...services, ...middleware], AUDIT_RULES)).toEqual([]);
  });

  it('the rules catch what they are meant to', () => {
    const hits = (line: string, rules: Rule[]) => rules.filter(({ re }) => re.test(line)).map(({ name }) => name);
    expect(hits("await trx('key_lineages').where({ id })", QUERIES)).toEqual(['a table call']);
    expect(hits("const row = await c.db('users').first()", QUERIES)).toEqual(['a table call']);
    expect(hits("await trx<LineageRow>('key_lineages').forUpdate()", QUERIES)).toEqual(['a table call']);
    expect(hits("attempts: trx.raw('attempts + 1')", QUERIES)).toEqual(['raw SQL']);
    expect(hits('const link = await teamLinks(trx).where({ grantee_id: userId }).forUpdate().first();', CHAINS)).toHaveLength(1);
    expect(hits("    .whereNot({ state: 'pending' })", CHAINS)).toHaveLength(1);
    expect(hits("const [row] = await endpoints(c.db).where({ id, user_id: userId }).update(changes).returning('*');", CHAINS)).toHaveLength(1);
    expect(hits("return createHash('sha256').update(token).digest('hex');", CHAINS)).toEqual([]);
    expect(hits('cache.delete(userId); parts.join(",");', CHAINS)).toEqual([]);
    expect(hits("export const teamLinks = (db: Knex) => db<TeamLinkRow>('team_links');", TABLE_HELPERS)).toHaveLength(1);
    expect(hits("export const apiKeys = (trx: Knex.Transaction) => trx('api_keys')", TABLE_HELPERS)).toHaveLength(1);
    expect(hits("const teamLinks = (db: Knex) => db<TeamLinkRow>('team_links');", TABLE_HELPERS)).toEqual([]);
    expect(hits('export const findEndpoint = (db: Knex, id: string) => endpoints(db).where({ id }).first();', TABLE_HELPERS)).toEqual([]);
    expect(hits('await c.db.transaction((trx) => storeNewKey(c, trx))', ROUTE_RULES)).toEqual(['a database call', 'a transaction']);
    expect(hits('const view = await requireKey(c, user.id, fp, meta)', ROUTE_RULES)).toEqual([]);
    expect(hits('recordAudit(c.db, { ip: meta.ip, request_id: meta.requestId })', AUDIT_RULES)).toHaveLength(2);
    expect(hits('recordAudit(c.db, { user_id: id, action }, meta)', AUDIT_RULES)).toEqual([]);
    expect(typeOnly("import type { RequestMeta } from '../../../db/audit'")).toBe(true);
    expect(typeOnly("import { listKeys, type KeyView } from '../../../db/keys'")).toBe(false);
    expect(namedValues("import { listKeys, type KeyView } from '../../../db/keys'")).toEqual(['listKeys']);
    const { program: fixtures, fixture } = dbProgram();
    const caught = signatureBreaches(fixtures, [fixture]).map((b) => b.slice(fixture.length + 2).replace(/ \(.*/, ''));
    expect(caught.sort()).toEqual([
      'anyRow: answers any',
      'anyRows: takes any',
      'builder: answers a query builder',
      'builder: no return type written',
      'lazier: answers a promise without being async',
      'lazy: answers a promise without being async',
      'raw: answers a query builder',
      'raw: answers any',
    ]);
    const imports = (statement: string) => {
      const file = join(mkdtempSync(join(tmpdir(), 'layering-')), 'm.ts');
      writeFileSync(file, `${statement}\n`);
      return dbValueImports([file], MIDDLEWARE_DB_VALUES).length;
    };
    expect(imports("import { waitingForConnection } from '../../db/knex';")).toBe(0);
    expect(imports("import { waitingForConnection, pingDb } from '../../db/knex';")).toBe(1);
    expect(imports("import * as knex from '../../db/knex';")).toBe(1);
    expect(imports("import { recordAudit } from '../../db/audit';")).toBe(1);
    expect(imports("import type { RequestMeta } from '../../db/audit';")).toBe(0);
  });
});
