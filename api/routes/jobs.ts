import { z } from 'zod';
import { route } from '../route';
import { Job } from '../schemas/jobs';
import { conflict, gone, notFound } from '../../lib/errors';
import { jobBlob, jobView } from '../../lib/services/jobs';
import { waitAsPreferred } from '../job-reply';
import { findJob, findUserJob, jobFiles } from '../../db/jobs';
import { notYours } from '../../lib/services/access';
import type { Container } from '../../lib/container';
import type { RequestMeta } from '../../db/audit';
import { BlobNotFoundError } from '../../lib/blob';

const tags = ['Jobs'];
const JobParams = z.object({ job_id: z.uuid() });

async function requireJob(c: Container, userId: string, id: string, meta: RequestMeta) {
  const row = await findUserJob(c.db, userId, id);
  if (!row) throw await notYours(c, { userId, resource: 'job', target: id, existsElsewhere: Boolean(await findJob(c.db, id)), meta });
  return row;
}

export default [
  route({
    method: 'get',
    path: '/jobs/{job_id}',
    summary: 'State, progress, result or error of a job (`Prefer: wait=N` waits up to N ≤ 30 s for it to end)',
    tags,
    access: 'auth',
    scope: 'jobs:read',
    params: JobParams,
    responses: { 200: { description: 'The job', schema: Job } },
    async handler({ c, ctx, user, params, meta }) {
      const { row } = await waitAsPreferred(c, ctx, await requireJob(c, user.id, params.job_id, meta));
      return { body: await jobView(c, row) };
    },
  }),

  route({
    method: 'get',
    path: '/jobs/{job_id}/files/{n}',
    summary: 'Download output file n of a completed job, as a stream',
    tags,
    access: 'auth',
    scope: 'jobs:read',
    params: JobParams.extend({ n: z.coerce.number().int().min(0).max(10_000) }),
    responses: { 200: { description: 'The file', schema: z.string(), contentType: 'application/octet-stream' } },
    async handler({ c, ctx, user, params, meta }) {
      const row = await requireJob(c, user.id, params.job_id, meta);
      if (row.state !== 'completed') throw conflict('job_not_completed', `The job is ${row.state}; outputs exist once it has completed.`);
      if (row.purged_at) throw gone('output_expired', 'The outputs of this job have passed their retention and were deleted.');
      const file = (await jobFiles(c.db, row.id, 'output')).find((f) => f.n === params.n);
      if (!file) throw notFound('file_not_found', `The job has no output file ${params.n}.`);
      let stream;
      try {
        stream = await c.blob.get(jobBlob.output(row.id, file.n));
      } catch (err) {
        if (err instanceof BlobNotFoundError) throw gone('output_expired', 'The outputs of this job were deleted.');
        throw err;
      }
      ctx.status = 200;
      ctx.type = file.content_type;
      ctx.length = file.size;
      ctx.set('Content-Disposition', `attachment; filename="${file.name.replace(/[^\x20-\x7e]/g, '_')}"; filename*=UTF-8''${encodeURIComponent(file.name)}`);
      ctx.body = stream;
    },
  }),
];
