import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';

/**
 * Where webhooks may not go: the service's own network (SSRF). Loopback, private, link-local (cloud
 * metadata at 169.254.169.254), carrier-grade NAT, multicast, reserved and documentation ranges, and
 * their IPv6 counterparts. An IPv6 address that carries an IPv4 address (RFC 6052's well-known NAT64
 * prefix, IPv4-mapped, IPv4-translated, IPv4-compatible, 6to4) is judged by the IPv4 address inside;
 * forms that hide it where it cannot be checked (local-use NAT64 of RFC 8215, Teredo and the rest of
 * the IETF protocol block 2001::/23) are refused whole.
 */
const blocked = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const)
  blocked.addSubnet(net, bits, 'ipv4');
for (const [net, bits] of [
  ['::', 128],
  ['::1', 128],
  ['64:ff9b:1::', 48],
  ['100::', 64],
  ['2001::', 23],
  ['2001:db8::', 32],
  ['fc00::', 7],
  ['fe80::', 10],
  ['fec0::', 10],
  ['ff00::', 8],
] as const)
  blocked.addSubnet(net, bits, 'ipv6');

/** The eight 16-bit groups of an IPv6 address (valid per isIP), a trailing dotted quad folded in. */
function ipv6Groups(address: string): number[] {
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(address);
  const hex = quad ? `${address.slice(0, quad.index)}${((+quad[1] << 8) | +quad[2]).toString(16)}:${((+quad[3] << 8) | +quad[4]).toString(16)}` : address;
  const [head, tail] = hex.split('::') as [string, string | undefined];
  const part = (s: string | undefined) => (s ? s.split(':').map((g) => parseInt(g, 16)) : []);
  const left = part(head);
  const right = part(tail);
  return [...left, ...Array<number>(8 - left.length - right.length).fill(0), ...right];
}

const dotted = (hi: number, lo: number) => [hi >> 8, hi & 255, lo >> 8, lo & 255].join('.');

/** The IPv4 address an IPv6 address carries, where its prefix says it carries one. */
function embeddedIpv4(address: string): string | undefined {
  const g = ipv6Groups(address);
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  if (g[0] === 0x2002) return dotted(g[1], g[2]); // 6to4, RFC 3056
  if (g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6)) return dotted(g[6], g[7]); // NAT64, RFC 6052
  if (zeros(0, 5) && (g[5] === 0xffff || g[5] === 0)) return dotted(g[6], g[7]); // mapped, compatible
  if (zeros(0, 4) && g[4] === 0xffff && g[5] === 0) return dotted(g[6], g[7]); // translated, RFC 2765
  return undefined;
}

export function isPublicAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return !blocked.check(address, 'ipv4');
  if (family !== 6) return false;
  if (blocked.check(address, 'ipv6')) return false;
  const v4 = embeddedIpv4(address.toLowerCase());
  return v4 === undefined || !blocked.check(v4, 'ipv4');
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
      const list = addresses;
      const refused = allowPrivate ? undefined : list.find((a) => !isPublicAddress(a.address));
      if (refused || !list.length) return callback(new AddressNotAllowed(`webhook host ${hostname} resolves to an address that is not allowed`), '');
      if ((options as { all?: boolean }).all) return callback(null, list);
      callback(null, list[0].address, list[0].family);
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

const notAllowed = (host: string) => ({
  code: 'address_not_allowed',
  message: `${host} is a loopback, private, link-local or reserved address (or resolves to one); webhooks go to public addresses only.`,
});
