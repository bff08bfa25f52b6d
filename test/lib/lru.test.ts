import { afterEach, describe, expect, it, vi } from 'vitest';
import { LruCache } from '../../lib/lru';

describe('LruCache', () => {
  afterEach(() => vi.useRealTimers());

  it('evicts the least recently used entry beyond its size', () => {
    const cache = new LruCache<string, number>({ max: 2 });
    cache.set('a', 1);
    cache.set('b', 2);
    expect(cache.get('a')).toBe(1); // a is now the most recent
    cache.set('c', 3);
    expect(cache.get('b')).toBeUndefined();
    expect(cache.get('a')).toBe(1);
    expect(cache.get('c')).toBe(3);
  });

  it('forgets entries after their time to live, and on delete and clear', () => {
    vi.useFakeTimers();
    const cache = new LruCache<string, number>({ max: 10, ttlMs: 1000 });
    cache.set('a', 1);
    cache.set('b', 2);
    cache.set('c', 3);
    vi.advanceTimersByTime(999);
    expect(cache.get('a')).toBe(1);
    vi.advanceTimersByTime(2);
    expect(cache.get('a')).toBeUndefined();
    cache.set('b', 4); // a new value starts a new lifetime
    cache.delete('c');
    expect(cache.get('c')).toBeUndefined();
    expect(cache.get('b')).toBe(4);
    cache.clear();
    expect(cache.get('b')).toBeUndefined();
  });
});
