import type { Container } from '../container';
import { notFound, type AppError } from '../errors';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { ACCESS_DENIED, type OwnedResource } from '../event-names';

/**
 * The answer to a request for something the caller does not have: 404, the same whether it does not
 * exist or belongs to another account (never reveal another account's resources). When it does exist
 * elsewhere, the attempt is audited for the caller as a failure with reason `not_owner`, which the
 * caller never sees. Every lookup of an owned resource by id ends here when it finds nothing.
 */
export async function notYours(
  c: Container,
  input: { userId: string; resource: OwnedResource; target: string; existsElsewhere: boolean; meta?: Partial<RequestMeta> },
  error: AppError = notFound(`${input.resource}_not_found`, `No such ${input.resource} in your account.`),
): Promise<AppError> {
  if (input.existsElsewhere) {
    await recordAudit(
      c.db,
      {
        user_id: input.userId,
        action: ACCESS_DENIED[input.resource],
        status: 'failure',
        target: input.target,
        details: { reason: 'not_owner' },
      },
      input.meta,
    );
  }
  return error;
}
