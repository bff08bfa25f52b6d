/**
 * A coarse class of HTTP client from its User-Agent header, for analytics that must not keep the raw
 * string (it fingerprints people). Order matters: crawlers and link previews often claim "Mozilla/5.0",
 * and command-line tools are named before the libraries some of them are built on.
 */
export type UserAgentClass = 'browser' | 'cli' | 'library' | 'bot' | 'other';

const BOT = /bot\b|bot\/|crawler|spider|slurp|preview|facebookexternalhit|embedly|monitor|headless|lighthouse|pingdom|uptime/i;
const CLI = /^(curl|wget|httpie|xh|aria2|powershell|gnupg|gpg|sq|sequoia|lynx|links)\b|\b(gnupg|sequoia-sq)\b/i;
const LIBRARY =
  /^(python-requests|python-urllib|python-httpx|aiohttp|node-fetch|node|undici|axios|got|go-http-client|okhttp|java|apache-httpclient|jakarta|ruby|faraday|libwww-perl|php|guzzle|reqwest|dart|dotnet|restsharp|openapi|kms-)/i;
const BROWSER = /^Mozilla\/5\.0 .*(Chrome|Firefox|Safari|Edg|OPR)\//;

export function userAgentClass(ua: string | undefined): UserAgentClass {
  const s = (ua ?? '').trim().slice(0, 512);
  if (!s) return 'other';
  if (BOT.test(s)) return 'bot';
  if (CLI.test(s)) return 'cli';
  if (LIBRARY.test(s)) return 'library';
  if (BROWSER.test(s)) return 'browser';
  return 'other';
}
