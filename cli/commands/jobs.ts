import type { Command } from 'commander';
import { downloadOutputs, followEvents, getJob, waitForJob, type AccountEvent } from '../../client/index.js';
import { bars, connect, fields, print, table } from '../context.js';
import { UsageError } from '../exit-codes.js';
import { examples, int, run } from './common.js';

const jobFields = ['job_id', 'kind', 'state', 'progress', 'error', 'created_at', 'finished_at', 'expires_at'] as const;

export function registerJobs(program: Command) {
  const jobs = program.command('jobs').description('Jobs: show, wait for, download outputs');
  jobs.addHelpText('after', examples('kms jobs show <JOB>', 'kms jobs wait <JOB>', 'kms jobs download <JOB> --out results/'));

  jobs
    .command('show <job_id>')
    .description("A job's state, progress, result or error")
    .addHelpText('after', examples('kms jobs show 0b5e…', 'kms jobs show 0b5e… --json | jq .state'))
    .action(
      run<object, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const job = await getJob(kms, id);
        print(opts, job, () => fields(job, jobFields) + (job.result?.files?.length ? `\n${table(job.result.files, ['n', 'name', 'size'])}` : ''));
      }),
    );

  jobs
    .command('wait <job_id>')
    .description('Wait for a job to end (exit 1 if it failed)')
    .option('--timeout <seconds>', 'give up after this long', int('--timeout'))
    .addHelpText('after', examples('kms jobs wait 0b5e…', 'kms jobs wait 0b5e… --timeout 600 && kms jobs download 0b5e…'))
    .action(
      run<{ timeout?: number }, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const bar = bars(opts);
        const job = await waitForJob(kms, id, { onProgress: bar.onProgress, timeoutSeconds: opts.timeout }).finally(() => bar.stop());
        print(opts, job, () => fields(job, jobFields));
      }),
    );

  jobs
    .command('download <job_id>')
    .description("Download a completed job's outputs")
    .option('-o, --out <dir>', 'folder for the outputs', '.')
    .option('--file <n...>', 'only these output numbers')
    .option('-f, --force', 'replace files that exist')
    .addHelpText('after', examples('kms jobs download 0b5e… --out results/', 'kms jobs download 0b5e… --file 0 2'))
    .action(
      run<{ out: string; file?: string[]; force?: boolean }, [string]>(async (opts, id) => {
        const only = opts.file?.map((n) => {
          if (!/^\d+$/.test(n)) throw new UsageError(`--file takes output numbers, not "${n}".`);
          return Number(n);
        });
        const { kms } = await connect(opts);
        const job = await getJob(kms, id);
        const bar = bars(opts);
        const outputs = await downloadOutputs(kms, job, { outDir: opts.out, overwrite: opts.force, only, onProgress: bar.onProgress }).finally(() =>
          bar.stop(),
        );
        print(opts, { job_id: id, outputs }, () =>
          table(
            outputs.map((o) => ({ file: o.path, size: o.size })),
            ['file', 'size'],
          ),
        );
      }),
    );

  program
    .command('events')
    .description('Follow the live event stream of your account (Ctrl-C ends it); reconnects and resumes on its own')
    .option('--types <types>', 'comma-separated event types, e.g. jobs.completed,jobs.failed')
    .option('--last-event-id <id>', 'replay what came after this event id first')
    .addHelpText('after', examples('kms events', 'kms events --types keys.rotated,keys.rotation_failed --json | jq .data'))
    .action(
      run<{ types?: string; lastEventId?: string }>(async (opts) => {
        const { kms } = await connect(opts);
        const stop = new AbortController();
        process.once('SIGINT', () => stop.abort());
        process.once('SIGTERM', () => stop.abort());
        const types = opts.types
          ?.split(',')
          .map((t) => t.trim())
          .filter(Boolean);
        try {
          for await (const e of followEvents(kms, { types, lastEventId: opts.lastEventId, signal: stop.signal })) line(opts.json, e);
        } catch (err) {
          if (!stop.signal.aborted) throw err;
        }
      }),
    );
}

const line = (json: boolean | undefined, e: AccountEvent) =>
  process.stdout.write(json ? `${JSON.stringify(e)}\n` : `${e.created_at}  ${e.type.padEnd(20)}  ${JSON.stringify(e.data)}\n`);
