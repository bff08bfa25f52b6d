import { spawn, type ChildProcess } from 'node:child_process';

/** Starts `lib/main.ts <role>` as a separate Node process with the given environment. */
export function startProcess(
  role: 'web' | 'worker' | 'scheduler',
  env: Record<string, string>,
): ChildProcess & { exited: Promise<number | null>; output: () => string } {
  const child = spawn(process.execPath, ['--import', 'tsx', 'lib/main.ts', role], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return Object.assign(child, { exited, output: () => output });
}

/** Resolves when the process has logged a line containing `text`. */
export async function waitForOutput(child: { output: () => string }, text: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!child.output().includes(text)) {
    if (Date.now() > deadline) throw new Error(`process did not log "${text}" within ${timeoutMs} ms:\n${child.output()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
