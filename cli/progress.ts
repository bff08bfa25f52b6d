import cliProgress from 'cli-progress';
import type { OnProgress, Phase, Progress } from '../client/index.js';

const LABEL: Record<Phase, string> = { upload: 'upload    ', queued: 'queued    ', processing: 'processing', download: 'download  ' };
const BAR_WIDTH = 30;
/** The speed is measured over the last few seconds, so a stall or a burst shows within them. */
const SPEED_WINDOW_MS = 5000;
/** Below this much measured time there is no speed (nor ETA) to show yet. */
const SPEED_MIN_MS = 500;

const size = (n: number) =>
  n >= 1 << 30
    ? `${(n / (1 << 30)).toFixed(2)} GiB`
    : n >= 1 << 20
      ? `${(n / (1 << 20)).toFixed(1)} MiB`
      : n >= 1024
        ? `${(n / 1024).toFixed(0)} KiB`
        : `${n} B`;

const speedText = (bytesPerSecond: number | undefined) => (bytesPerSecond === undefined ? '- MiB/s' : `${(bytesPerSecond / (1 << 20)).toFixed(1)} MiB/s`);

/** `m:ss`, or `h:mm:ss` from an hour on. */
function duration(seconds: number): string {
  const s = Math.ceil(seconds);
  const two = (n: number) => String(n).padStart(2, '0');
  return s >= 3600 ? `${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}` : `${Math.floor(s / 60)}:${two(s % 60)}`;
}

/** Bytes per second over the recent samples of one bar; once it is complete, over the whole bar. */
class Speed {
  private samples: { at: number; bytes: number }[] = [];
  private start: { at: number; bytes: number } | undefined;
  add(bytes: number, at = Date.now()): void {
    this.start ??= { at, bytes };
    this.samples.push({ at, bytes });
    while (this.samples.length > 2 && at - this.samples[1].at >= SPEED_WINDOW_MS) this.samples.shift();
  }
  get(complete: boolean): number | undefined {
    const first = complete ? this.start : this.samples[0];
    const last = this.samples[this.samples.length - 1];
    if (!first || last.at - first.at < (complete ? 1 : SPEED_MIN_MS)) return undefined;
    return ((last.bytes - first.bytes) * 1000) / (last.at - first.at);
  }
}

/**
 * The line of one phase: with a known total a bar, percentage, bytes of the total, speed and ETA; with
 * an unknown one (a download the service streams while it produces it) bytes and speed only; while
 * queued the phase alone.
 */
export function progressLine(p: Progress, bytesPerSecond: number | undefined): string {
  const file = p.file ? ` ${p.file}` : '';
  if (p.phase === 'queued') return LABEL.queued;
  if (p.bytes_total === undefined) return `${LABEL[p.phase]} ${size(p.bytes_done)} | ${speedText(bytesPerSecond)}${file}`;
  const total = Math.max(p.bytes_total, p.bytes_done, 1);
  const ratio = Math.min(1, p.bytes_done / total);
  const filled = Math.round(ratio * BAR_WIDTH);
  const eta = p.bytes_done >= total ? '0:00' : bytesPerSecond !== undefined && bytesPerSecond > 0 ? duration((total - p.bytes_done) / bytesPerSecond) : '-:--';
  return `${LABEL[p.phase]} |${'█'.repeat(filled)}${'░'.repeat(BAR_WIDTH - filled)}| ${Math.floor(ratio * 100)}% | ${size(p.bytes_done)} / ${size(total)} | ${speedText(bytesPerSecond)} | ETA ${eta}${file}`;
}

/**
 * A progress bar on standard error (cli-progress) that follows a job through its phases; one bar per
 * phase and per downloaded file. Disabled (a no-op) when standard error is not a terminal, with
 * --json, --quiet or --no-progress (cli/context.ts decides), so scripts and logs get no control characters.
 */
export function progressBar(enabled: boolean): { onProgress: OnProgress | undefined; stop(): void } {
  if (!enabled) return { onProgress: undefined, stop() {} };
  let bar: cliProgress.SingleBar | undefined;
  let speed = new Speed();
  let current = '';
  const stop = () => {
    bar?.stop();
    bar = undefined;
    current = '';
  };
  const onProgress: OnProgress = (p) => {
    const key = `${p.phase}:${p.file ?? ''}`;
    if (key !== current) {
      stop();
      current = key;
      speed = new Speed();
      bar = new cliProgress.SingleBar({
        format: (_options, _params, payload: { line: string }) => payload.line,
        stream: process.stderr,
        hideCursor: true,
        clearOnComplete: false,
        fps: 8,
      });
    }
    speed.add(p.bytes_done);
    // cli-progress redraws the line it is given; its own total only has to keep it from ending early.
    const payload = { line: progressLine(p, speed.get(p.bytes_total !== undefined && p.bytes_done >= p.bytes_total)) };
    if (!bar!.isActive) bar!.start(Number.MAX_SAFE_INTEGER, p.bytes_done, payload);
    else bar!.update(p.bytes_done, payload);
  };
  return { onProgress, stop };
}
