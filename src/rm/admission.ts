// Job requests that cannot start yet wait in line, as a resource manager's admission does: a
// request whose members are busy (or the cap on active jobs is reached) asks to wait up to some
// seconds; it is tried again, oldest first, whenever workers or job slots are freed. The line is
// bounded, and every wait ends at its deadline with the reason it could not start.
import type { Clock, TimerHandle } from './clock.js';
import { RmError } from './errors.js';

/** The request could start later: its members are busy, or every job slot is taken. */
export const isBusy = (e: unknown): e is RmError => e instanceof RmError && e.kind === 'conflict';

/**
 * A busy answer that knows what to say if the wait ends at its deadline still so (instead of the
 * busy reason and how long it waited): the request waits for something with its own account.
 */
export class BusyUntil extends RmError {
  constructor(
    message: string,
    readonly atDeadline: () => RmError,
  ) {
    super('conflict', message);
  }
}

export interface WaitOptions {
  /** Called once the request waits in the line. */
  onQueued?: () => void;
  /** Aborted: the request leaves the line (rejected 'aborted'). */
  signal?: AbortSignal;
}

const withdrawn = () => new RmError('aborted', 'the job request was withdrawn while it waited in the admission line');

interface Waiter {
  attempt: () => Promise<unknown>;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
  timer: TimerHandle;
  lastError: RmError;
  trying: boolean;
  /** The wake-up count when its last try began: a wake-up during the try means try again. */
  wakesSeen: number;
  signal?: AbortSignal;
}

export class Admission {
  private readonly line: Waiter[] = [];
  private wakes = 0;
  private scheduled = false;

  constructor(
    private readonly clock: Clock,
    private readonly maxWaiting: number,
  ) {}

  /** Requests waiting now. */
  get waiting(): number {
    return this.line.length;
  }

  /**
   * Runs `attempt`; while it fails busy, tries again as resources are freed, for up to `waitMs`.
   * `onQueued` is called once the request is in the line (its place among the others is then
   * fixed: a caller that sends requests one after another in order waits for it before sending
   * the next); `signal` withdraws it from the line (its requester went away).
   */
  async run<T>(attempt: () => Promise<T>, waitMs: number, opts: WaitOptions = {}): Promise<T> {
    const wakesSeen = this.wakes;
    if (opts.signal?.aborted) throw withdrawn();
    try {
      return await attempt();
    } catch (e) {
      if (!(waitMs > 0) || !isBusy(e)) throw e;
      if (opts.signal?.aborted) throw withdrawn();
      if (this.line.length >= this.maxWaiting) {
        throw new RmError(
          'limit',
          `${e.message}, and ${this.maxWaiting} job requests are waiting already (the most that may)`,
        );
      }
      const started = this.clock.now();
      return new Promise<T>((resolve, reject) => {
        const w: Waiter = {
          attempt,
          resolve: resolve as (v: unknown) => void,
          reject,
          lastError: e,
          trying: false,
          wakesSeen,
          signal: opts.signal,
          timer: this.clock.setTimer(waitMs, () => {
            this.remove(w);
            const s = ((this.clock.now() - started) / 1000).toFixed(1);
            const last = w.lastError;
            reject(
              last instanceof BusyUntil
                ? last.atDeadline()
                : new RmError('conflict', `${last.message} (still, after waiting ${s} s)`),
            );
          }),
        };
        this.line.push(w);
        opts.signal?.addEventListener(
          'abort',
          () => {
            // A try under way may still create the job: it settles the request (and the caller,
            // whose requester is gone, ends a job made meanwhile).
            if (!this.line.includes(w) || w.trying) return;
            this.remove(w);
            w.timer.cancel();
            reject(withdrawn());
          },
          { once: true },
        );
        if (this.wakes !== wakesSeen) this.schedule();
        opts.onQueued?.();
      });
    }
  }

  /** Workers or job slots were freed: the waiting requests try again, oldest first. */
  wake(): void {
    this.wakes++;
    this.schedule();
  }

  private schedule(): void {
    if (this.scheduled || !this.line.length) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      // Each try reserves its members synchronously before it awaits anything, so launching them
      // in order serves the oldest first without two taking the same workers.
      for (const w of [...this.line]) if (!w.trying) this.tryOne(w);
    });
  }

  /** Ends every wait (the sidecar stops). */
  close(reason: string): void {
    for (const w of this.line.splice(0)) {
      w.timer.cancel();
      w.reject(new RmError('unavailable', `the sidecar is stopping: ${reason}`));
    }
  }

  private tryOne(w: Waiter): void {
    w.trying = true;
    w.wakesSeen = this.wakes;
    w.attempt().then(
      (v) => {
        this.remove(w);
        w.timer.cancel();
        w.resolve(v);
      },
      (e: unknown) => {
        w.trying = false;
        if (!this.line.includes(w)) return; // timed out meanwhile
        if (w.signal?.aborted) {
          this.remove(w);
          w.timer.cancel();
          w.reject(withdrawn());
          return;
        }
        if (!isBusy(e)) {
          this.remove(w);
          w.timer.cancel();
          w.reject(e);
          return;
        }
        w.lastError = e;
        if (this.wakes !== w.wakesSeen) this.schedule();
      },
    );
  }

  private remove(w: Waiter): void {
    const i = this.line.indexOf(w);
    if (i >= 0) this.line.splice(i, 1);
  }
}
