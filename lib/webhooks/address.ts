import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';

/**
 * Where webhooks may not go: the service's own network (SSRF). Loopback, private, link-local (cloud
 * metadata at 169.254.169.254), carrier-grade NAT, multicast, reserved and documentation ranges, and
 * their IPv6 counterparts; IPv4-mapped and NAT64 IPv6 addresses are judged by the IPv4 address inside.
 */
const blocked = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
  ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.88.99.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24],
  ['203.0.113.0', 24], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const) blocked.addSubnet(net, bits, 'ipv4');
for (const [net, bits] of [
  ['::', 128], ['::1', 128], ['100::', 64], ['2001:db8::', 32], ['fc00::', 7], ['fe80::', 10], ['fec0::', 10], ['ff00::', 8],
] as const) blocked.addSubnet(net, bits, 'ipv6');

/** The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d) or NAT64 (64:ff9b::a.b.c.d) IPv6 address. */
function embeddedIpv4(address: string): string | undefined {
  const m = /^(?:::ffff:|64:ff9b::)(?:(\d+\.\d+\.\d+\.\d+)|([0-9a-f]{1,4}):([0-9a-f]{1,4}))$/i.exec(address);
  if (!m) return undefined;
  if (m[1]) return m[1];
  const hi = parseInt(m[2]!, 16);
  const lo = parseInt(m[3]!, 16);
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join('.');
}

export function isPublicAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return !blocked.check(address, 'ipv4');
  if (family !== 6) return false;
  const v4 = embeddedIpv4(address.toLowerCase());
  return v4 ? !blocked.check(v4, 'ipv4') : !blocked.check(address, 'ipv6');
}

export class AddressNotAllowed extends Error {
  readonly code = 'address_not_allowed';
}

/**
 * A `lookup` for http.request that refuses private destinations after DNS resolution. The connection
 * goes to the address checked here, so a name that resolves differently a moment later (DNS
 * rebinding) cannot slip past. Node skips lookup for literal IP hosts: see `checkWebhookUrl`.
 */
export function guardedLookup(allowPrivate: boolean) {
  return (hostname: string, options: object, callback: (err: Error | null, address: string | LookupAddress[], family?: number) => void): void => {
    dnsLookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, '');
      const list = addresses as LookupAddress[];
      const refused = allowPrivate ? undefined : list.find((a) => !isPublicAddress(a.address));
      if (refused || !list.length) return callback(new AddressNotAllowed(`webhook host ${hostname} resolves to an address that is not allowed`), '');
      if ((options as { all?: boolean }).all) return callback(null, list);
      callback(null, list[0]!.address, list[0]!.family);
    });
  };
}

const MAX_URL = 2048;

/**
 * What a webhook URL must be: http(s), no credentials in it (they would be shown in listings; receivers
 * verify the signature instead), and, unless allowed, not a literal private address or a name that
 * resolves to one (checked again at every delivery). Answers the problem, or undefined when fine.
 */
export async function checkWebhookUrl(raw: string, allowPrivate: boolean): Promise<{ code: string; message: string } | undefined> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return { code: 'invalid_url', message: 'The URL is not an absolute URL.' };
  }
  if (raw.length > MAX_URL) return { code: 'invalid_url', message: `The URL is longer than ${MAX_URL} characters.` };
  if (url.protocol !== 'https:' && url.protocol !== 'http:') return { code: 'invalid_url', message: 'Only http and https URLs receive webhooks.' };
  if (url.username || url.password) return { code: 'invalid_url', message: 'The URL must not carry credentials; verify the webhook signature instead.' };
  if (allowPrivate) return undefined;
  const host = url.hostname.replace(/^\[|\]$/g, '');
  if (isIP(host)) return isPublicAddress(host) ? undefined : notAllowed(host);
  const addresses = await new Promise<LookupAddress[]>((resolve) => dnsLookup(host, { all: true }, (err, list) => resolve(err ? [] : list)));
  return addresses.some((a) => !isPublicAddress(a.address)) ? notAllowed(host) : undefined;
}

const notAllowed = (host: string) => ({ code: 'address_not_allowed', message: `${host} is a loopback, private, link-local or reserved address (or resolves to one); webhooks go to public addresses only.` });
