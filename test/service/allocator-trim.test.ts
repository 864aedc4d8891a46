import { afterEach, describe, expect, it, vi } from 'vitest';
import { PmixServer } from '../../src/pmix/index.js';
import { trimAfterActivity } from '../../src/service/allocator-trim.js';

describe('trimAfterActivity', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('trims once per interval in which the activity count moved, never while idle', () => {
    vi.useFakeTimers();
    let jobs = 0;
    const trim = vi.fn();
    const stop = trimAfterActivity(() => jobs, trim, 1000);
    vi.advanceTimersByTime(3000);
    expect(trim).toHaveBeenCalledTimes(0);
    jobs += 5;
    vi.advanceTimersByTime(1000);
    expect(trim).toHaveBeenCalledTimes(1);
    vi.advanceTimersByTime(5000);
    expect(trim).toHaveBeenCalledTimes(1);
    jobs += 1;
    stop();
    vi.advanceTimersByTime(5000);
    expect(trim).toHaveBeenCalledTimes(1);
  });

  it('reads the real allocator, and trimming keeps its bytes in use', () => {
    const before = PmixServer.allocatorStats();
    expect(before.inUseBytes).toBeGreaterThan(0);
    expect(typeof PmixServer.allocatorTrim()).toBe('boolean');
    const after = PmixServer.allocatorStats();
    // malloc_trim gives back free pages only: what is in use stays within what this test allocates.
    expect(Math.abs(after.inUseBytes - before.inUseBytes)).toBeLessThan(1 << 20);
    expect(after.arenaBytes).toBeGreaterThan(0);
  });
});
