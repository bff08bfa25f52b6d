import { expect } from 'vitest';

/** One event of an account's stream, as `GET /events` sends it. */
interface StreamedEvent {
  id: string | undefined;
  type: string;
  data: { data: Record<string, unknown> };
}

/** An account's events over SSE from one API process: `events` fills as frames arrive, `opened` once it answered 200. */
export function openEvents(base: string, token: string) {
  const events: StreamedEvent[] = [];
  const controller = new AbortController();
  let open = () => undefined as void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const done = (async () => {
    const res = await fetch(`${base}/events`, { headers: { authorization: `Bearer ${token}` }, signal: controller.signal });
    expect(res.status).toBe(200);
    open();
    let buffer = '';
    for await (const chunk of res.body!) {
      buffer += Buffer.from(chunk).toString('utf8');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const type = /^event: (.*)$/m.exec(frame)?.[1];
        const data = /^data: (.*)$/m.exec(frame)?.[1];
        if (type && data) events.push({ id: /^id: (.*)$/m.exec(frame)?.[1], type, data: JSON.parse(data) });
      }
    }
  })().catch(() => undefined);
  return { events, opened, close: () => (controller.abort(), done) };
}
