// Collectives of one job: a PMIx fence, a PMI-1 barrier and a PMI-2 kvs-fence are all a join
// under one name over a set of participating ranks. Each rank's n-th join under a name and
// participant set meets the other ranks' n-th join, so repeated barriers need no ids from the
// protocols. A collective completes when every participant has joined, and fails instead of
// hanging when a participant dies, the job ends, or its deadline passes.
import type { Clock, TimerHandle } from './clock.js';
import { RmError } from './errors.js';

export interface JoinRequest {
  /** e.g. 'fence' (PMIx fence, PMI-1 barrier, PMI-2 kvs-fence) or 'group:<name>'. */
  name: string;
  /** Ranks that take part; 'all' is every rank of the job. */
  participants: readonly number[] | 'all';
  /** Ranks this call joins for: one for a PMI client, all local ones for a PMIx server upcall. */
  contributors: readonly number[];
  /** What the contributors bring (PMIx fence data, PMIx group endpoint data). */
  data?: Uint8Array;
  timeoutMs?: number;
}

export interface Contribution {
  ranks: number[];
  data?: Uint8Array;
}

export interface CollectiveResult {
  /** Every join's contribution, ordered by its lowest rank. */
  contributions: Contribution[];
  /** From the first join to the last. */
  seconds: number;
}

interface Instance {
  key: string;
  name: string;
  participants: ReadonlySet<number>;
  arrived: Set<number>;
  contributions: Contribution[];
  waiters: { resolve: (r: CollectiveResult) => void; reject: (e: Error) => void }[];
  startedAt: number;
  timer?: TimerHandle;
}

export type CollectiveObserver = (name: string, seconds: number, outcome: 'ok' | 'failed' | 'timeout') => void;

/**
 * Carries out one collective of the job somewhere else (the PMI engine runs a PMI job's `fence`
 * on its own thread), under this model's rules: the core still decides which ranks are gone and
 * when the job ends, and tells the delegate, whose pending and later instances fail with the
 * messages it is given.
 */
export interface CollectiveDelegate {
  rankGone(rank: number, message: string): void;
  close(message: string): void;
}

/** What a delegate starts from, and where it reports each instance that ended. */
export interface DelegatedCollective {
  readonly timeoutMs: number;
  /** Ranks already gone, with the message their collectives fail with. */
  readonly gone: readonly (readonly [number, string])[];
  /** Set if the job has ended already. */
  readonly closed: string | undefined;
  observe(seconds: number, outcome: 'ok' | 'failed' | 'timeout'): void;
}

export class Collectives {
  private readonly pending = new Map<string, Instance>();
  private readonly epochs = new Map<string, number>();
  private readonly dead = new Map<number, string>();
  private readonly delegates = new Map<string, CollectiveDelegate>();
  private closedReason: string | undefined;
  /** Every rank, made once: most joins are over the whole job, and a join must cost O(contributors), not O(size). */
  private everyone: { list: readonly number[]; set: ReadonlySet<number> } | undefined;

  constructor(
    private readonly size: number,
    private readonly clock: Clock,
    private readonly defaultTimeoutMs: number,
    private readonly observer?: CollectiveObserver,
  ) {}

  join(req: JoinRequest): Promise<CollectiveResult> {
    try {
      return this.joinOrThrow(req);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Hands the collective `name` over to `delegate` (see CollectiveDelegate); joins of it here
   * are refused from now on.
   */
  delegate(name: string, delegate: CollectiveDelegate): DelegatedCollective {
    if (this.delegates.has(name))
      throw new RmError('conflict', `collective '${name}' is already carried out elsewhere`);
    this.delegates.set(name, delegate);
    return {
      timeoutMs: this.defaultTimeoutMs,
      gone: [...this.dead].map(([r, why]) => [r, goneMessage(name, r, why)] as const),
      closed: this.closedReason,
      observe: (seconds, outcome) => this.observer?.(name, seconds, outcome),
    };
  }

  private joinOrThrow(req: JoinRequest): Promise<CollectiveResult> {
    if (this.closedReason !== undefined) throw new RmError('aborted', this.closedReason);
    if (this.delegates.has(req.name))
      throw new RmError('conflict', `collective '${req.name}' of this job is carried out elsewhere`);
    let participants: readonly number[];
    let pset: ReadonlySet<number>;
    if (req.participants === 'all') {
      this.everyone ??= { list: range(this.size), set: new Set(range(this.size)) };
      ({ list: participants, set: pset } = this.everyone);
    } else {
      participants = [...new Set(req.participants)].sort((a, b) => a - b);
      for (const r of participants) {
        if (!Number.isInteger(r) || r < 0 || r >= this.size)
          throw new RmError('bad_request', `rank ${r} is not in the job (size ${this.size})`);
      }
      pset = new Set(participants);
    }
    if (participants.length === 0) throw new RmError('bad_request', `collective '${req.name}' has no participants`);
    if (req.contributors.length === 0) throw new RmError('bad_request', `a join of '${req.name}' needs a contributor`);
    for (const r of req.contributors) {
      if (!pset.has(r)) throw new RmError('bad_request', `rank ${r} is not a participant of '${req.name}'`);
    }
    const sig = participants.length === this.size ? '*' : participants.join(',');
    let epoch = 0;
    for (const r of req.contributors) epoch = Math.max(epoch, this.epochs.get(`${req.name}|${sig}|${r}`) ?? 0);
    for (const r of req.contributors) this.epochs.set(`${req.name}|${sig}|${r}`, epoch + 1);
    const key = `${req.name}|${sig}|${epoch}`;
    let inst = this.pending.get(key);
    for (const [r, why] of this.dead) {
      // A rank that is gone and has not joined this instance never will.
      if (pset.has(r) && !req.contributors.includes(r) && !inst?.arrived.has(r)) {
        for (const c of req.contributors) this.epochs.set(`${req.name}|${sig}|${c}`, epoch);
        throw new RmError('aborted', goneMessage(req.name, r, why));
      }
    }
    if (!inst) {
      inst = {
        key,
        name: req.name,
        participants: pset,
        arrived: new Set(),
        contributions: [],
        waiters: [],
        startedAt: this.clock.now(),
      };
      const timeoutMs = req.timeoutMs ?? this.defaultTimeoutMs;
      if (timeoutMs > 0) {
        const i = inst;
        inst.timer = this.clock.setTimer(timeoutMs, () => {
          const missing = [...i.participants].filter((r) => !i.arrived.has(r));
          this.fail(
            i,
            new RmError(
              'timeout',
              `collective '${i.name}' timed out after ${timeoutMs} ms waiting for ranks ${missing.join(',')}`,
            ),
            'timeout',
          );
        });
      }
      this.pending.set(key, inst);
    }
    for (const r of req.contributors) {
      if (inst.arrived.has(r)) throw new RmError('bad_request', `rank ${r} joined '${req.name}' twice`);
    }
    for (const r of req.contributors) inst.arrived.add(r);
    const c: Contribution = { ranks: [...req.contributors].sort((a, b) => a - b) };
    if (req.data) c.data = req.data;
    inst.contributions.push(c);
    const done = new Promise<CollectiveResult>((resolve, reject) => inst.waiters.push({ resolve, reject }));
    if (inst.arrived.size === inst.participants.size) this.complete(inst);
    return done;
  }

  private complete(inst: Instance): void {
    this.pending.delete(inst.key);
    inst.timer?.cancel();
    const seconds = (this.clock.now() - inst.startedAt) / 1000;
    const contributions = [...inst.contributions].sort((a, b) => (a.ranks[0] ?? 0) - (b.ranks[0] ?? 0));
    this.observer?.(inst.name, seconds, 'ok');
    for (const w of inst.waiters) w.resolve({ contributions, seconds });
  }

  private fail(inst: Instance, err: RmError, outcome: 'failed' | 'timeout'): void {
    if (!this.pending.delete(inst.key)) return;
    inst.timer?.cancel();
    this.observer?.(inst.name, (this.clock.now() - inst.startedAt) / 1000, outcome);
    for (const w of inst.waiters) w.reject(err);
  }

  /** A rank that will never join again (lost, or finalized): fails the collectives it owes. */
  markGone(rank: number, why: string): void {
    if (!this.dead.has(rank)) this.dead.set(rank, why);
    for (const inst of [...this.pending.values()]) {
      if (inst.participants.has(rank) && !inst.arrived.has(rank)) {
        this.fail(inst, new RmError('aborted', goneMessage(inst.name, rank, why)), 'failed');
      }
    }
    for (const [name, d] of this.delegates) d.rankGone(rank, goneMessage(name, rank, why));
  }

  /** The job ended: every pending collective fails, and so does every later join. */
  close(reason: string): void {
    this.closedReason = reason;
    for (const inst of [...this.pending.values()]) this.fail(inst, new RmError('aborted', reason), 'failed');
    for (const d of this.delegates.values()) d.close(reason);
  }

  get pendingCount(): number {
    return this.pending.size;
  }
}

function goneMessage(name: string, rank: number, why: string): string {
  return `collective '${name}' cannot complete: rank ${rank} ${why}`;
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}
