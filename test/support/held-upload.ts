import { randomBytes } from 'node:crypto';

const MiB = 1 << 20;

export interface HeldUpload {
  /** The answer to the request (its body read as JSON). */
  answer: Promise<{ status: number; headers: Headers; body: Record<string, unknown> }>;
  /** Resolves once the first part of the file has been sent (the job exists from its first file on). */
  started: Promise<void>;
  /** Sends the rest of the file and ends the request. */
  release(): void;
}

/**
 * A multipart encryption of `data` whose file part stops after its first `first` bytes (a MiB) until
 * `release()`: a test decides when the upload ends (during an outage, say), after its job has begun.
 */
export function heldEncryption(base: string, token: string, fingerprint: string, data: Buffer, headers: Record<string, string> = {}, first = MiB): HeldUpload {
  const boundary = `----kms${randomBytes(8).toString('hex')}`;
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="fingerprint"\r\n\r\n${fingerprint}\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="files"; filename="held.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let started!: () => void;
  const begun = new Promise<void>((resolve) => (started = resolve));
  let offset = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (offset === 0) {
        controller.enqueue(Buffer.concat([head, data.subarray(0, first)]));
        offset = Math.min(first, data.length);
        started();
        return;
      }
      await released;
      if (offset < data.length) {
        controller.enqueue(data.subarray(offset));
        offset = data.length;
        return;
      }
      controller.enqueue(tail);
      controller.close();
    },
  });
  const answer = fetch(`${base}/keys/encrypt`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': `multipart/form-data; boundary=${boundary}`, ...headers },
    body,
    duplex: 'half',
  }).then(async (res) => ({ status: res.status, headers: res.headers, body: (await res.json()) as Record<string, unknown> }));
  answer.catch(() => undefined); // a test that fails before reading the answer leaves no unhandled rejection
  return { answer, started: begun, release };
}
