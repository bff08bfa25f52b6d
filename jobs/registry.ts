import type { z } from 'zod';
import type { JobDefinition } from './define';
import { sendEmail } from './send-email';
import { purgeExpired } from './purge-expired';

/**
 * The contract between producers (API, scheduler, other jobs) and consumers (workers): every job kind
 * with its queue, payload schema and processor. Enqueueing a name not listed here does not compile.
 */
export const jobs = {
  'send-email': sendEmail,
  'purge-expired': purgeExpired,
} as const;

export type JobName = keyof typeof jobs;
export type PayloadOf<N extends JobName> = z.input<(typeof jobs)[N]['schema']>;

for (const [name, def] of Object.entries(jobs) as [string, JobDefinition][]) {
  if (def.name !== name) throw new Error(`job registry: "${name}" is registered under the wrong name ("${def.name}")`);
}

export function jobDefinition(name: string): JobDefinition | undefined {
  return (jobs as Record<string, JobDefinition>)[name];
}
