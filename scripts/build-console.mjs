// Bundles the web console (web/console/src, TypeScript + Preact) into <outdir>/app.js for browsers:
// one minified ES module, no source map served, no CDN. The console's JavaScript budget is checked here:
// a bundle over CONSOLE_BUDGET_GZIP bytes gzipped fails the build.
import { build } from 'esbuild';
import { mkdir, rename, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const CONSOLE_BUDGET_GZIP = 150 * 1024;

/** Builds the console into `outdir` (created if missing); resolves with its sizes in bytes. */
export async function buildConsole(outdir) {
  const result = await build({
    absWorkingDir: root,
    entryPoints: [join(root, 'web', 'console', 'src', 'main.tsx')],
    bundle: true,
    write: false,
    outfile: join(outdir, 'app.js'),
    format: 'esm',
    platform: 'browser',
    target: ['chrome111', 'firefox115', 'safari16.4'],
    jsx: 'automatic',
    jsxImportSource: 'preact',
    minify: true,
    legalComments: 'none',
    logLevel: 'warning',
    define: { 'process.env.NODE_ENV': '"production"' },
  });
  const js = result.outputFiles.find((f) => f.path.endsWith('app.js')).contents;
  const gzip = gzipSync(js, { level: 9 }).length;
  if (gzip > CONSOLE_BUDGET_GZIP) {
    throw new Error(`build: the console's JavaScript is ${(gzip / 1024).toFixed(1)} KiB gzipped, over its budget of ${CONSOLE_BUDGET_GZIP / 1024} KiB`);
  }
  await mkdir(outdir, { recursive: true });
  // Written beside, then renamed: a process starting meanwhile reads the old file or the new one, whole.
  const tmp = join(outdir, `.app.js.${process.pid}`);
  await writeFile(tmp, js);
  await rename(tmp, join(outdir, 'app.js'));
  return { bytes: js.length, gzip };
}
