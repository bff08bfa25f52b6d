import cliProgress from 'cli-progress';
import type { OnProgress, Phase } from '../client/index.js';

const LABEL: Record<Phase, string> = { upload: 'upload    ', queued: 'queued    ', processing: 'processing', download: 'download  ' };

const size = (n: number) =>
  n >= 1 << 30
    ? `${(n / (1 << 30)).toFixed(2)} GiB`
    : n >= 1 << 20
      ? `${(n / (1 << 20)).toFixed(1)} MiB`
      : n >= 1024
        ? `${(n / 1024).toFixed(0)} KiB`
        : `${n} B`;

/**
 * A progress bar on standard error (cli-progress) that follows a job through its phases; one bar per
 * phase and per downloaded file. Disabled (a no-op) when standard error is not a terminal, with
 * --json or --quiet, so scripts and logs get no control characters.
 */
export function progressBar(enabled: boolean): { onProgress: OnProgress | undefined; stop(): void } {
  if (!enabled) return { onProgress: undefined, stop() {} };
  let bar: cliProgress.SingleBar | undefined;
  let current = '';
  const stop = () => {
    bar?.stop();
    bar = undefined;
    current = '';
  };
  const onProgress: OnProgress = (p) => {
    const key = `${p.phase}:${p.file ?? ''}`;
    const total = p.phase === 'queued' ? 1 : Math.max(p.bytes_total ?? 0, p.bytes_done, 1);
    const payload = {
      phase: LABEL[p.phase],
      done: p.phase === 'queued' ? '' : size(p.bytes_done),
      size: p.phase === 'queued' ? '' : size(total),
      file: p.file ?? '',
    };
    if (key !== current) {
      stop();
      current = key;
      bar = new cliProgress.SingleBar(
        {
          format: '{phase} |{bar}| {percentage}% | {done} / {size} {file}',
          stream: process.stderr,
          hideCursor: true,
          clearOnComplete: false,
          fps: 8,
          barsize: 30,
        },
        cliProgress.Presets.shades_classic,
      );
      bar.start(total, p.bytes_done, payload);
    } else {
      bar!.setTotal(total);
      bar!.update(p.bytes_done, payload);
    }
  };
  return { onProgress, stop };
}
