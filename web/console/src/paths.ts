/**
 * Every page of the console, by its path. The API serves the console's HTML shell at exactly these
 * (api/pages.ts), so a reload or an emailed link (`/reset-password#token=…`) lands on its page; any other
 * path stays the API's 404.
 */
export const CONSOLE_PATHS = [
  '/',
  '/sign-in',
  '/register',
  '/forgot-password',
  '/reset-password',
  '/confirm-email',
  '/accept-invitation',
  '/contact',
  '/keys',
  '/files',
  '/activity',
  '/credentials',
  '/team',
  '/profile',
  '/recovery-review',
  '/admin',
] as const;

export type ConsolePath = (typeof CONSOLE_PATHS)[number];
