/**
 * A small in-process LRU map: at most `max` entries, each for at most `ttlMs` when given. For caches
 * whose entries can be rebuilt at any time (a miss costs a read or a parse, never correctness).
 */
export class LruCache<K, V> {
  private readonly entries = new Map<K, { value: V; until: number }>();

  constructor(private readonly opts: { max: number; ttlMs?: number }) {}

  get(key: K): V | undefined {
    const hit = this.entries.get(key);
    if (!hit) return undefined;
    this.entries.delete(key);
    if (hit.until < Date.now()) return undefined;
    this.entries.set(key, hit); // most recently used last
    return hit.value;
  }

  set(key: K, value: V): V {
    this.entries.delete(key);
    this.entries.set(key, { value, until: this.opts.ttlMs === undefined ? Infinity : Date.now() + this.opts.ttlMs });
    if (this.entries.size > this.opts.max) this.entries.delete(this.entries.keys().next().value!);
    return value;
  }

  delete(key: K): void {
    this.entries.delete(key);
  }

  clear(): void {
    this.entries.clear();
  }
}
