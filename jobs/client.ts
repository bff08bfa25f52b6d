import { Queue, type JobsOptions } from 'bullmq';
import { withinRedisBudget, type Redis } from '../lib/redis';
import { isRedisUnreachable, isSocketFailure, unavailable } from '../lib/errors';
import type { RequestMeta } from '../db/audit';
import { QUEUES, type JobEnvelope, type QueueName } from './define';
import { contractOf, type JobName, type PayloadOf } from './contracts';

export interface EnqueueOptions {
  /** Deterministic id: a second enqueue with the same id is a no-op (BullMQ dedupes). No `:` allowed. */
  jobId?: string;
  delay?: number;
  /** The request that enqueues the job: its id and client address travel into the job's logs and audit rows. */
  meta?: Partial<RequestMeta>;
}

/**
 * BullMQ's key prefix of a queue: a hash tag, so that all of a queue's keys share one slot (its scripts
 * touch many of them at once). On a Redis Cluster each queue has its own tag, so the queues spread over
 * the shards; one server keeps the one tag every queue has always had there.
 */
export const bullPrefix = (redisPrefix: string, queue: QueueName, cluster: boolean) => (cluster ? `{${redisPrefix}:${queue}}` : `{${redisPrefix}}`);

/** 503 `queue_unavailable`: the job could not be handed to its queue. */
const queueUnavailable = () => unavailable('queue_unavailable', 'The job queue is not reachable; try again shortly.');

/**
 * Any process may enqueue. Payloads are validated against their contract's schema before they reach
 * Redis; enqueueing while Redis is not connected fails at once, and an enqueue Redis did not answer
 * (timed out, connection lost) fails too, both 503 `queue_unavailable`.
 */
export class JobClient {
  private readonly queues = new Map<QueueName, Queue>();

  constructor(
    private readonly connection: Redis,
    private readonly redisPrefix: string,
    /** Connection errors of the queues (they are already the connection's own: a lost Redis). */
    private readonly onError: (err: Error) => void = () => undefined,
  ) {}

  queue(name: QueueName): Queue {
    if (!QUEUES.includes(name)) throw new Error(`unknown queue "${name}"`);
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(name, { connection: this.connection, prefix: bullPrefix(this.redisPrefix, name, this.connection.isCluster) });
      // Unheard, BullMQ prints the error to stderr itself, outside the process's JSON log.
      queue.on('error', this.onError);
      this.queues.set(name, queue);
      // A queue whose start failed (its version check unanswered: Redis frozen) fails every call for
      // good: it is dropped, and the next call makes the queue anew.
      const made = queue;
      made.waitUntilReady().catch(() => {
        if (this.queues.get(name) === made) this.queues.delete(name);
        void made.close().catch(() => undefined);
      });
    }
    return queue;
  }

  /** Throws 503 `queue_unavailable` while Redis is not connected: a request checks it before it records a job. */
  assertConnected(): void {
    if (this.connection.status !== 'ready') throw queueUnavailable();
  }

  async enqueue<N extends JobName>(name: N, payload: PayloadOf<N>, opts: EnqueueOptions = {}): Promise<string> {
    const def = contractOf(name);
    if (!def) throw new Error(`unknown job "${String(name)}"`);
    if (opts.jobId?.includes(':')) throw new Error(`job id "${opts.jobId}" must not contain ':'`);
    this.assertConnected();
    const data: JobEnvelope = {
      payload: def.schema.parse(payload),
      meta: { request_id: opts.meta?.requestId, client_request_id: opts.meta?.clientRequestId, ip: opts.meta?.ip, enqueued_at: new Date().toISOString() },
    };
    const options: JobsOptions = { ...def.options, jobId: opts.jobId, delay: opts.delay };
    // The queue's start may be under way for another caller: the add waits within this request's budget.
    const job = await withinRedisBudget(this.queue(def.queue).add(def.name, data, options)).catch((err: unknown) => {
      throw isRedisUnreachable(err) || isSocketFailure(err) ? queueUnavailable() : err;
    });
    if (!job.id) throw new Error(`queue "${def.queue}" returned no job id`);
    return job.id;
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }
}
