// Publish / lookup / unpublish (MPI_Publish_name, MPI_Comm_accept's port exchange, PMI
// publish_name). Data published with range 'namespace' is seen only by ranks of the same job;
// 'session' (the default, and what PMIx's global ranges map to) by every job of this sidecar.
// A lookup may wait for a key; it fails at its deadline or when the waiting job ends.
import type { Clock, TimerHandle } from './clock.js';
import { RmError } from './errors.js';

export type PublishRange = 'namespace' | 'session';
/**
 * How long a datum lives: until its first lookup, until its publisher finalizes or is lost,
 * until its job is released ('app', the default: a port of an ended job is useless), or until
 * unpublished ('session').
 */
export type Persistence = 'first_read' | 'proc' | 'app' | 'session';

export interface Publisher {
  jobId: string;
  namespace: string;
  rank: number;
}

export interface Published<V> {
  key: string;
  value: V;
  publisher: Publisher;
  range: PublishRange;
  persistence: Persistence;
}

export interface PublishOptions {
  range?: PublishRange;
  persistence?: Persistence;
}

export interface LookupOptions {
  range?: PublishRange;
  /**
   * Wait until every key is published (true or 0), or until at least this many of them are
   * (PMIx's PMIX_WAIT is a count); then answer what is found.
   */
  wait?: boolean | number;
  timeoutMs?: number;
}

interface Waiter<V> {
  caller: Publisher;
  keys: string[];
  need: number;
  range: PublishRange;
  resolve: (d: Published<V>[]) => void;
  reject: (e: Error) => void;
  timer?: TimerHandle;
}

const scopeKey = (range: PublishRange, namespace: string, key: string) =>
  range === 'namespace' ? `ns\u0000${namespace}\u0000${key}` : `session\u0000${key}`;

/** V is the protocol's value type: PMIx values for PMIx, strings for PMI. */
export class NameService<V = unknown> {
  private readonly data = new Map<string, Published<V>>();
  private waiters: Waiter<V>[] = [];

  constructor(
    private readonly clock: Clock,
    private readonly maxWaitMs = 600_000,
    private readonly maxEntries = Infinity,
  ) {}

  publish(by: Publisher, entries: { key: string; value: V }[], opts: PublishOptions = {}): void {
    const range = opts.range ?? 'session';
    const persistence = opts.persistence ?? 'app';
    const seen = new Set<string>();
    for (const e of entries) {
      if (!e.key) throw new RmError('bad_request', 'a published key must not be empty');
      if (seen.has(e.key)) throw new RmError('bad_request', `key '${e.key}' published twice in one call`);
      seen.add(e.key);
      if (this.data.has(scopeKey(range, by.namespace, e.key))) {
        throw new RmError('conflict', `'${e.key}' is already published in range ${range}`);
      }
    }
    if (this.data.size + entries.length > this.maxEntries) {
      throw new RmError('limit', `the name service holds at most ${this.maxEntries} entries`);
    }
    for (const e of entries) {
      this.data.set(scopeKey(range, by.namespace, e.key), {
        key: e.key,
        value: e.value,
        publisher: { ...by },
        range,
        persistence,
      });
    }
    this.wake();
  }

  /** Finds every key or none; with `wait`, resolves once all (or the number asked) are published. */
  lookup(caller: Publisher, keys: string[], opts: LookupOptions = {}): Promise<Published<V>[]> {
    const range = opts.range ?? 'session';
    if (keys.length === 0) return Promise.reject(new RmError('bad_request', 'lookup needs at least one key'));
    const wait = opts.wait !== undefined && opts.wait !== false;
    const need = typeof opts.wait === 'number' && opts.wait > 0 ? Math.min(opts.wait, keys.length) : keys.length;
    const found = this.find(caller, keys, range, need);
    if (found) return Promise.resolve(found);
    if (!wait)
      return Promise.reject(new RmError('not_found', `not published: ${this.missing(caller, keys, range).join(', ')}`));
    return new Promise((resolve, reject) => {
      const w: Waiter<V> = { caller: { ...caller }, keys: [...keys], need, range, resolve, reject };
      const ms = Math.min(opts.timeoutMs ?? this.maxWaitMs, this.maxWaitMs);
      w.timer = this.clock.setTimer(ms, () => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(
          new RmError('timeout', `not published within ${ms} ms: ${this.missing(caller, keys, range).join(', ')}`),
        );
      });
      this.waiters.push(w);
    });
  }

  /** Removes `keys` (all of the caller's when empty) that the caller published; returns how many. */
  unpublish(caller: Publisher, keys: string[], range?: PublishRange): number {
    let n = 0;
    for (const [k, d] of this.data) {
      if (d.publisher.jobId !== caller.jobId || d.publisher.rank !== caller.rank) continue;
      if (range && d.range !== range) continue;
      if (keys.length > 0 && !keys.includes(d.key)) continue;
      this.data.delete(k);
      n++;
    }
    return n;
  }

  /** The publisher finalized or was lost: its 'proc' data goes. */
  procEnded(jobId: string, rank: number): void {
    for (const [k, d] of this.data) {
      if (d.persistence === 'proc' && d.publisher.jobId === jobId && d.publisher.rank === rank) this.data.delete(k);
    }
  }

  /** The job ended: its waiting lookups fail. */
  jobEnded(jobId: string, reason: string): void {
    const mine = this.waiters.filter((w) => w.caller.jobId === jobId);
    this.waiters = this.waiters.filter((w) => w.caller.jobId !== jobId);
    for (const w of mine) {
      w.timer?.cancel();
      w.reject(new RmError('aborted', reason));
    }
  }

  /** The job was released: everything it published that was not meant to outlive it goes. */
  jobReleased(jobId: string): void {
    for (const [k, d] of this.data) {
      if (d.publisher.jobId !== jobId) continue;
      if (d.persistence !== 'session' || d.range === 'namespace') this.data.delete(k);
    }
  }

  get size(): number {
    return this.data.size;
  }

  /** The published data for `keys`, if at least `need` of them are published. */
  private find(caller: Publisher, keys: string[], range: PublishRange, need = keys.length): Published<V>[] | undefined {
    const out: Published<V>[] = [];
    for (const key of keys) {
      const d = this.get(caller, key, range);
      if (d) out.push(d);
    }
    if (out.length < need) return undefined;
    for (const d of out) {
      if (d.persistence === 'first_read') this.data.delete(scopeKey(d.range, d.publisher.namespace, d.key));
    }
    return out;
  }

  private get(caller: Publisher, key: string, range: PublishRange): Published<V> | undefined {
    // The caller's own namespace first, then (unless restricted) what every job can see.
    return (
      this.data.get(scopeKey('namespace', caller.namespace, key)) ??
      (range === 'session' ? this.data.get(scopeKey('session', '', key)) : undefined)
    );
  }

  private missing(caller: Publisher, keys: string[], range: PublishRange): string[] {
    return keys.filter((k) => !this.get(caller, k, range));
  }

  private wake(): void {
    for (const w of [...this.waiters]) {
      const found = this.find(w.caller, w.keys, w.range, w.need);
      if (!found) continue;
      this.waiters = this.waiters.filter((x) => x !== w);
      w.timer?.cancel();
      w.resolve(found);
    }
  }
}
