import type { Container } from '../container';
import { deleteKeysMatching, type Redis } from '../redis';
import type { Break } from '../audit-chain';

/**
 * What the checkpoint signer keeps outside Postgres (docs/audit-evidence.md, "Who can rewrite what"):
 * per chain, the last checkpoint it signed (its compact JWS, which no one can forge without the signing
 * key), so that a database writer who deletes checkpoints cannot make it sign a rewritten chain; and
 * the chains it found broken, which GET /status reports.
 */

const signedKey = (c: Container, chain: string) => `${c.config.redisPrefix}:audit:signed:${chain}`;
const brokenKey = (c: Container) => `${c.config.redisPrefix}:audit:broken`;

/** Stores `ARGV[1] ARGV[2]` (sequence, JWS) unless what is stored has a sequence at least as high: the remembered checkpoint never goes back. */
const REMEMBER_LUA = `local cur = redis.call('GET', KEYS[1])
if cur then
  local s = tonumber(string.match(cur, '^(%d+) '))
  if s and s >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2])
return 1`;

/** Sets field ARGV[1] of KEYS[1] to ARGV[2] (a break's JSON); 1 when no break of the same sequence and reason was recorded before. */
const RECORD_BREAK_LUA = `local cur = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if cur then
  local old, new = cjson.decode(cur), cjson.decode(ARGV[2])
  if old.sequence == new.sequence and old.reason == new.reason then return 0 end
end
return 1`;

type WithScripts = Redis & {
  kmsRememberCheckpoint(key: string, sequence: string, jws: string): Promise<number>;
  kmsRecordAuditBreak(key: string, chain: string, json: string): Promise<number>;
};

function scripts(redis: Redis): WithScripts {
  if (!('kmsRememberCheckpoint' in redis)) {
    redis.defineCommand('kmsRememberCheckpoint', { numberOfKeys: 1, lua: REMEMBER_LUA });
    redis.defineCommand('kmsRecordAuditBreak', { numberOfKeys: 1, lua: RECORD_BREAK_LUA });
  }
  return redis as WithScripts;
}

/** The last checkpoint the signer stored for `chain` (sequence and JWS), or null when it remembers none. */
export async function rememberedCheckpoint(c: Container, chain: string): Promise<{ sequence: number; jws: string } | null> {
  const value = await c.redis.get(signedKey(c, chain));
  const m = value?.match(/^(\d+) (\S+)$/);
  return m ? { sequence: Number(m[1]), jws: m[2] } : null;
}

/** Remembers `cp` as the chain's last signed checkpoint, unless a later one is remembered already. */
export async function rememberCheckpoint(c: Container, chain: string, cp: { sequence: number; jws: string }): Promise<void> {
  await scripts(c.redis).kmsRememberCheckpoint(signedKey(c, chain), String(cp.sequence), cp.jws);
}

export interface ChainBreak extends Break {
  chain: string;
  detected_at: string;
}

/** Records that `chain` is broken at `b`; true when this break (sequence and reason) is new. */
export async function recordBreak(c: Container, chain: string, b: Break, at: Date): Promise<boolean> {
  const json = JSON.stringify({ sequence: b.sequence, reason: b.reason, detected_at: at.toISOString() });
  return (await scripts(c.redis).kmsRecordAuditBreak(brokenKey(c), chain, json)) === 1;
}

/** The chain verified again (it was restored): it is no longer reported. */
export async function clearBreak(c: Container, chain: string): Promise<void> {
  await c.redis.hdel(brokenKey(c), chain);
}

/** How many chains are broken, and up to `limit` of them. */
export async function brokenChains(c: Container, limit: number): Promise<{ count: number; chains: ChainBreak[] }> {
  const key = brokenKey(c);
  const [count, [, flat]] = await Promise.all([c.redis.hlen(key), c.redis.hscan(key, '0', 'COUNT', limit)]);
  const chains: ChainBreak[] = [];
  for (let i = 0; i + 1 < flat.length && chains.length < limit; i += 2) {
    const b = JSON.parse(flat[i + 1]) as Omit<ChainBreak, 'chain'>;
    chains.push({ chain: flat[i], sequence: b.sequence, reason: b.reason, detected_at: b.detected_at });
  }
  return { count, chains };
}

/**
 * Forgets every checkpoint the signer remembers and every break it recorded: after a restore the chains
 * are the backup's, shorter than what was signed since, and would all read as rewritten. The restore
 * that calls this records itself on the system chain first.
 */
export async function forgetSignerMemory(c: Container): Promise<number> {
  return (await deleteKeysMatching(c.redis, `${c.config.redisPrefix}:audit:signed:*`)) + (await c.redis.del(brokenKey(c)));
}
