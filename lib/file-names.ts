/**
 * The part of a client-given file name that the service stores and offers again (a form part's file name,
 * the name inside an OpenPGP literal packet): its base name, without path, control characters or quotes,
 * trimmed, at most 255 characters. Undefined when nothing usable is left (empty, `.` or `..`).
 */
export function baseFileName(name: string): string | undefined {
  const base = (name.split(/[\\/]/).pop() ?? '')
    // eslint-disable-next-line no-control-regex -- control characters are what it removes
    .replace(/[\u0000-\u001f\u007f"]/g, '')
    .trim()
    .slice(0, 255);
  return base && base !== '.' && base !== '..' ? base : undefined;
}
