// Workers the cluster lost that are expected back: a nanny restarts a worker whose process died,
// and dask-pmix replaces a worker by retiring it and restarting it through its nanny. Whoever
// removes the worker says so (DELETE /v1/workers/:id?returning=true); the sidecar cannot tell on
// its own. A job request whose selector is short of workers by no more than those may wait for
// them (job-lifecycle.ts), instead of failing at once as it does for a request that could never
// be met.
//
// A restarted worker usually comes back under a new address (a new id): a worker that registers
// takes the place of the one that left under its id, else of the oldest that left from its host.
import type { Clock } from './clock.js';
import type { Worker } from './types.js';

export interface Departed {
  /** The worker as it was when it left, available again (a selector matches it as it did). */
  worker: Worker;
  /** When it left (clock ms). */
  leftAt: number;
}

export class Returning {
  private readonly departed: Departed[] = [];

  constructor(
    private readonly clock: Clock,
    /** At most this many are remembered (the oldest go first). */
    private readonly limit: number,
    /** Nobody is waited for longer than this after it left. */
    private readonly keepMs = 3_600_000,
  ) {}

  /** The worker left, and is expected back. */
  left(w: Readonly<Worker>): void {
    this.forget(w.id);
    const worker: Worker = {
      ...structuredClone(w),
      state: 'available',
    };
    delete worker.jobId;
    delete worker.pool;
    this.departed.push({ worker, leftAt: this.clock.now() });
    if (this.departed.length > this.limit) this.departed.splice(0, this.departed.length - this.limit);
  }

  /** A worker registered: it is the one that left under its id, or one that left from its host. */
  joined(w: Readonly<Worker>): void {
    if (this.forget(w.id)) return;
    const i = this.departed.findIndex((d) => d.worker.host === w.host);
    if (i >= 0) this.departed.splice(i, 1);
  }

  /** Those expected back that left at most `windowMs` ago, oldest first. */
  within(windowMs: number): Departed[] {
    const now = this.clock.now();
    while (this.departed.length && now - this.departed[0]!.leftAt > this.keepMs) this.departed.shift();
    return this.departed.filter((d) => now - d.leftAt <= windowMs);
  }

  /** Whether the worker `id` left at most `windowMs` ago and is expected back under that id. */
  has(id: string, windowMs: number): boolean {
    return this.within(windowMs).some((d) => d.worker.id === id);
  }

  get size(): number {
    return this.departed.length;
  }

  private forget(id: string): boolean {
    const i = this.departed.findIndex((d) => d.worker.id === id);
    if (i < 0) return false;
    this.departed.splice(i, 1);
    return true;
  }
}
