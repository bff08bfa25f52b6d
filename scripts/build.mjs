// Builds the service to JavaScript for production: `npm run build` → dist/main.js (+ chunks), run with
// `node dist/main.js <web|worker|scheduler|all>`. Usage: node scripts/build.mjs [outdir] (default dist).
//
// Why esbuild rather than `tsc --outDir`: the sources use extensionless relative imports (moduleResolution
// "Bundler"), which tsc emits unchanged and Node's ESM loader cannot resolve; emitting runnable files with
// tsc would mean `.js` extensions on every import in the tree. esbuild resolves them while bundling, and
// with code splitting the lazy role imports of lib/main.ts stay lazy chunks, so a worker still never loads
// the HTTP stack. Packages stay external (resolved from node_modules at run time): native addons, pino's
// worker threads and package files keep their own layout. No type checking here: that is `npm run
// typecheck` (part of `npm test`); a build takes about a second.
//
// Source files that find files relative to themselves (`import.meta.url`: package.json in
// api/routes/health/health-and-status.ts, web/passkeys/ in api/pages.ts) keep working: in every bundled module except the
// entry point, `import.meta.url` is rewritten to the URL its source file has, computed from the output
// file's location (`new URL('../api/pages.ts', import.meta.url)`), so it holds wherever the project is
// deployed, as long as the output folder stays where it was built relative to the source tree (and so
// finds node_modules). The entry point keeps its own URL: lib/main.ts compares it with process.argv[1].
import { build } from 'esbuild';
import { mkdir, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildConsole } from './build-console.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const outdir = resolve(root, process.argv[2] ?? 'dist');
const entry = join(root, 'lib', 'main.ts');
/** Files of an earlier build older than this are removed (a process loads its chunks at start-up). */
const STALE_MS = 10 * 60_000;

/** `import.meta.url` of a non-entry source module → the URL of that source file, relative to the output. */
const sourceUrls = {
  name: 'source-import-meta-url',
  setup(b) {
    b.onLoad({ filter: /\.[cm]?ts$/ }, async (args) => {
      const text = await readFile(args.path, 'utf8');
      if (args.path === entry || args.path.includes(`${sep}node_modules${sep}`) || !text.includes('import.meta.url')) return undefined;
      // Every output file sits directly in outdir (flat chunk names below), so one relative path fits all.
      const rel = relative(outdir, args.path).split(sep).join('/');
      return { contents: text.replaceAll('import.meta.url', `new URL(${JSON.stringify(rel)}, import.meta.url).href`), loader: 'ts' };
    });
  },
};

// Never write into a folder that holds the project, nor into one that is not a build.
if (!relative(outdir, root).startsWith('..')) throw new Error(`build: refusing to write into ${outdir}, which contains the project`);
const existing = await readdir(outdir).catch(() => []);
// A folder holding only a console built alone (bench/console.ts) is a build too.
if (existing.some((name) => name !== 'console') && !existing.includes('main.js')) throw new Error(`build: ${outdir} is not empty and holds no earlier build`);

// Built next to the output, then moved in file by file (rename is atomic; chunks first, main.js last), so
// processes starting while another build runs (`npm run web` and `npm run worker` together) never read a
// half-written file. Chunk names are content hashes: the same sources give the same files.
const staging = `${outdir}.tmp-${process.pid}`;
let result;
try {
  result = await build({
    absWorkingDir: root,
    // Threads load their own files beside main.js (lib/thread-pool.ts threadModule): the MDC check
    // (lib/pgp/mdc-thread.ts) and the reading of untrusted OpenPGP data (lib/pgp/untrusted.ts).
    entryPoints: {
      main: entry,
      'mdc-check': join(root, 'lib', 'pgp', 'mdc-check.ts'),
      'untrusted-thread': join(root, 'lib', 'pgp', 'untrusted-thread.ts'),
    },
    outdir: staging,
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node24',
    packages: 'external',
    chunkNames: '[name]-[hash]',
    // Class and function names survive bundling (error names, logs); renaming would change them.
    keepNames: true,
    sourcemap: 'linked',
    logLevel: 'warning',
    plugins: [sourceUrls],
    metafile: true,
  });
  await mkdir(outdir, { recursive: true });
  const built = (await readdir(staging)).sort((a, b) => Number(a === 'main.js') - Number(b === 'main.js'));
  for (const name of built) await rename(join(staging, name), join(outdir, name));
  // Files of earlier builds go once nothing can still be starting from them.
  const now = Date.now();
  for (const name of existing) {
    if (built.includes(name) || name === 'console') continue;
    const { mtimeMs } = await stat(join(outdir, name)).catch(() => ({ mtimeMs: now }));
    if (now - mtimeMs > STALE_MS) await rm(join(outdir, name), { force: true });
  }
} finally {
  await rm(staging, { recursive: true, force: true });
}
const files = Object.keys(result.metafile.outputs).filter((f) => f.endsWith('.js'));
console.log(`built ${files.length} files into ${relative(root, outdir) || '.'}/ (entry: main.js)`);
// The web console, served by the web role from CONSOLE_DIR (default dist/console).
const web = await buildConsole(join(outdir, 'console'));
console.log(
  `built the console into ${relative(root, join(outdir, 'console'))}/app.js: ${(web.bytes / 1024).toFixed(1)} KiB, ${(web.gzip / 1024).toFixed(1)} KiB gzipped`,
);
