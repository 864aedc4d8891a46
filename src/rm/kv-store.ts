// A job's key-value space: PMI-1 put/get, PMI-2 kvs-put/kvs-get and node attributes. A get may
// wait for a key that another rank has not put yet (PMI-2 info-getnodeattr wait=TRUE); waiters
// fail when the job ends, so none hangs.
import type { Clock, TimerHandle } from './clock.js';
import { RmError } from './errors.js';

interface Waiter {
  key: string;
  resolve: (v: string) => void;
  reject: (e: Error) => void;
  timer?: TimerHandle;
}

export class KvStore {
  private readonly data = new Map<string, { value: string; rank: number }>();
  private waiters: Waiter[] = [];
  private closedReason: string | undefined;

  constructor(private readonly clock: Clock) {}

  put(rank: number, key: string, value: string): void {
    if (this.closedReason !== undefined) throw new RmError('aborted', this.closedReason);
    this.data.set(key, { value, rank });
    const ready = this.waiters.filter((w) => w.key === key);
    if (ready.length === 0) return;
    this.waiters = this.waiters.filter((w) => w.key !== key);
    for (const w of ready) {
      w.timer?.cancel();
      w.resolve(value);
    }
  }

  get(key: string): string | undefined {
    return this.data.get(key)?.value;
  }

  /** Resolves with the value once it is put; rejects after `timeoutMs` or when the job ends. */
  waitFor(key: string, timeoutMs?: number): Promise<string> {
    const have = this.data.get(key);
    if (have) return Promise.resolve(have.value);
    if (this.closedReason !== undefined) return Promise.reject(new RmError('aborted', this.closedReason));
    return new Promise((resolve, reject) => {
      const w: Waiter = { key, resolve, reject };
      if (timeoutMs !== undefined) {
        w.timer = this.clock.setTimer(timeoutMs, () => {
          this.waiters = this.waiters.filter((x) => x !== w);
          reject(new RmError('timeout', `key '${key}' was not put within ${timeoutMs} ms`));
        });
      }
      this.waiters.push(w);
    });
  }

  get size(): number {
    return this.data.size;
  }

  /** Fails every waiter and refuses further puts. */
  close(reason: string): void {
    this.closedReason = reason;
    for (const w of this.waiters.splice(0)) {
      w.timer?.cancel();
      w.reject(new RmError('aborted', reason));
    }
  }
}
