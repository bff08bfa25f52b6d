import { Readable } from 'node:stream';
import type { Container } from '../lib/container';
import { tooLarge } from '../lib/errors';
import { counted } from '../lib/streams';
import { jobBlob } from '../lib/services/jobs';
import { jobFiles, type JobFileRow, type JobProgress, type OutputFile } from '../db/jobs';
import type { Progress } from './tracked';

export interface Transformed {
  stream: Readable;
  name: string;
  contentType: string;
}

export interface FilesDone {
  inputs: JobFileRow[];
  outputs: OutputFile[];
  bytesTotal: number;
  progress: JobProgress;
  /** Deletes the uploads (plaintext, for encryption) once the job's completion is committed. */
  deleteInputs(): Promise<void>;
}

/**
 * Streams each input blob of a job through `transform` into its output blob, one file at a time,
 * reporting input bytes as progress. Outputs are atomic puts: a stream that errors publishes nothing.
 * When `signal` aborts (the job passed its limits), the input is destroyed and the output put abandoned,
 * so nothing keeps reading for a job that has already failed. All outputs together may not exceed
 * MAX_JOB_OUTPUT_BYTES (decompression bombs spread over many files).
 */
export async function transformFiles(
  c: Container,
  jobId: string,
  progress: Progress,
  signal: AbortSignal,
  transform: (source: Readable, file: JobFileRow) => Promise<Transformed>,
): Promise<FilesDone> {
  const inputs = await jobFiles(c.db, jobId, 'input');
  const bytesTotal = inputs.reduce((n, f) => n + f.size, 0);
  const outputs: OutputFile[] = [];
  const quota = { left: c.config.limits.maxJobOutputBytes };
  let before = 0;
  for (const [i, file] of inputs.entries()) {
    signal.throwIfAborted();
    const source = counted(await c.blob.get(jobBlob.input(jobId, file.n)), (n) => progress.report({ bytes_done: before + n }));
    const release = () => source.destroy(signal.reason as Error);
    signal.addEventListener('abort', release, { once: true });
    try {
      const out = await transform(source, file);
      const { size } = await c.blob.put(jobBlob.output(jobId, file.n), withinQuota(out.stream, quota), { signal });
      outputs.push({ n: file.n, name: out.name, size, content_type: out.contentType });
    } finally {
      signal.removeEventListener('abort', release);
    }
    before += file.size;
    progress.report({ bytes_done: before, files_done: i + 1 });
  }
  return {
    inputs,
    outputs,
    bytesTotal,
    progress: { bytes_done: bytesTotal, bytes_total: bytesTotal, files_done: inputs.length, files_total: inputs.length },
    deleteInputs: async () => {
      await Promise.all(inputs.map((f) => c.blob.delete(jobBlob.input(jobId, f.n))));
    },
  };
}

function withinQuota(stream: Readable, quota: { left: number }): Readable {
  async function* limit(): AsyncGenerator<Buffer> {
    for await (const chunk of stream) {
      quota.left -= (chunk as Buffer).length;
      if (quota.left < 0) throw tooLarge('job_output_too_large', 'The outputs of this job exceed the per-job limit (MAX_JOB_OUTPUT_BYTES).');
      yield chunk as Buffer;
    }
  }
  return Readable.from(limit(), { objectMode: false, highWaterMark: 1 << 20 });
}
