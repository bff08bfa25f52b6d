import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { isIP } from 'node:net';
import { AddressNotAllowed, guardedLookup, isPublicAddress } from './address';

export interface AttemptResult {
  /** The receiver's HTTP status, when it answered. */
  status: number | null;
  latencyMs: number;
  /** null on a 2xx; else a short machine code: http_<status>, timeout, address_not_allowed, connection_refused, ... */
  error: string | null;
}

/** What is read of a receiver's answer before it is dropped: only the status matters. */
const MAX_RESPONSE_BYTES = 64 * 1024;

/**
 * POSTs one delivery. The destination is checked at connection time (after DNS, see guardedLookup);
 * redirects are not followed (a 3xx fails the attempt), so a receiver cannot send the request on to an
 * internal address. The whole attempt, connection to last byte read, is bounded by `timeoutMs`.
 */
export function postWebhook(
  target: string,
  headers: Record<string, string>,
  body: string,
  opts: { timeoutMs: number; allowPrivate: boolean; userAgent: string },
): Promise<AttemptResult> {
  const started = performance.now();
  const done = (status: number | null, error: string | null): AttemptResult => ({ status, latencyMs: Math.round(performance.now() - started), error });
  return new Promise((resolve) => {
    const url = new URL(target);
    const host = url.hostname.replace(/^\[|\]$/g, '');
    if (!opts.allowPrivate && isIP(host) && !isPublicAddress(host)) return resolve(done(null, 'address_not_allowed'));
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const req = send(url, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'user-agent': opts.userAgent },
      lookup: guardedLookup(opts.allowPrivate),
      agent: false,
    });
    const timer = setTimeout(() => req.destroy(new TimeoutError()), opts.timeoutMs);
    req.on('response', (res) => {
      const status = res.statusCode ?? 0;
      let read = 0;
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (read > MAX_RESPONSE_BYTES) res.destroy();
      });
      const finish = () => {
        clearTimeout(timer);
        resolve(done(status, status >= 200 && status < 300 ? null : status >= 300 && status < 400 ? 'redirect_not_followed' : `http_${status}`));
      };
      res.once('end', finish);
      res.once('close', finish);
      res.once('error', finish);
    });
    req.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      resolve(done(null, errorCode(err)));
    });
    req.end(body);
  });
}

class TimeoutError extends Error {
  readonly code = 'timeout';
}

function errorCode(err: NodeJS.ErrnoException): string {
  if (err instanceof AddressNotAllowed || err instanceof TimeoutError) return err.code;
  const codes: Record<string, string> = {
    ECONNREFUSED: 'connection_refused',
    ECONNRESET: 'connection_reset',
    ENOTFOUND: 'dns_not_found',
    EAI_AGAIN: 'dns_failed',
    EHOSTUNREACH: 'host_unreachable',
    ENETUNREACH: 'network_unreachable',
    ETIMEDOUT: 'timeout',
  };
  if (err.code && codes[err.code]) return codes[err.code];
  if (err.code?.startsWith('ERR_TLS') || /CERT|SSL/.test(err.code ?? '')) return 'tls_error';
  return 'request_failed';
}
