// The in-process pool: long-lived namespaces ("epochs") of P ranks that the MPI library in each
// worker process joins once, for the life of the process. A rank is handed to each worker as it
// registers and is never reused; when the ranks of an epoch run out a new epoch is opened. An
// in-process job is a group of ranks of one epoch (see job-lifecycle.ts).
//
// Rank (seat) states: assigned (handed out at registration) → joining (the worker fetched its
// environment: its session is initialising) → ready (its MPI library reached the PMIx server)
// → retired (the worker left, its connection dropped, it finalized, or it could not join).
//
// Cohorts. Open MPI shares memory only between ranks declared on one node when the namespace is
// registered (PMIX_LOCAL_PEERS), and a rank's MPI init waits at most 2 s (libpmix's default for a
// local peer's modex) for every peer so declared, then fails for good. So the first epoch is not
// registered at once: it is *forming* while the workers that start together ask to join, and is
// registered once none has registered or asked for `settleMs` (at the latest `maxWaitMs` after the
// first asked). The workers of one host (and user) that asked by then form a cohort: their ranks
// share one node entry and they initialise together, right after the answer. A worker that died
// or never asked is simply not declared; every later joiner sits alone on its own virtual node
// (Open MPI treats a peer it did not learn of at init as remote: TCP), except when no worker of
// the current epoch is left or in use (a restart of every worker): then a new epoch forms the same
// way, at the next registration or at the first join whose epoch has no seat in use.
//
// Each epoch has a secret of its own (32 random bytes) that only the answer to a member's join
// carries: the tcp+mpi comm backend's hellos between members are bound to it (HMAC-SHA256, see
// python/dask_pmix/comm/hello.py), so that a process outside the pool cannot pass for a member.
// It is never part of a seat, an event or a listing.
//
// Plain TypeScript without I/O: the PMIx side of an epoch is the PoolBackend's.
import { randomBytes } from 'node:crypto';
import type { Clock, TimerHandle } from './clock.js';
import { RmError } from './errors.js';
import type { EventLog } from './events.js';
import type { Impl, Job, PoolSeat, Worker } from './types.js';
import type { WorkerPool } from './worker-pool.js';

/** Ranks that share one node: the workers of one host and user that joined a forming epoch. */
export interface PoolCohort {
  host: string;
  ranks: number[];
}

export interface PoolEpochSpec {
  epoch: number;
  namespace: string;
  size: number;
  /** Each a node shared by its ranks; every other rank sits alone on its own virtual node. */
  cohorts: PoolCohort[];
  /** The user a rank's client is registered as, where the worker said (else the backend's own). */
  users: Map<number, PoolUser>;
}

export interface PoolUser {
  uid: number;
  gid: number;
}

/** How the first epoch gathers the workers that start together into cohorts (see above). */
export interface CohortOptions {
  /** Quiet time (no worker registering or asking to join) that closes the forming epoch; 0: no cohorts. */
  settleMs: number;
  /** The latest the forming epoch is registered, after the first worker asked to join. */
  maxWaitMs: number;
}

/** The protocol side of the pool (PMIx): what the core needs to open and use an epoch. */
export interface PoolBackend {
  /**
   * Registers the epoch's namespace: `size` ranks, the ranks of each cohort on one shared node and
   * every other rank alone on its own virtual node, and every rank's client registered up front
   * (libpmix holds back direct-modex requests until all local clients of a namespace are
   * registered), as `spec.users` says or else as the backend's own user.
   */
  open(spec: PoolEpochSpec): Promise<void>;
  /** The environment a worker process sets before it initialises its session, to be `rank`. */
  rankEnv(namespace: string, rank: number): Record<string, string>;
  /**
   * Makes the rank's client one of this user (registered again if it was another's), before the
   * worker's process connects: the server admits a client only as the user it was registered as.
   */
  setUser(namespace: string, rank: number, user: PoolUser): Promise<void>;
  /** The backend's own user: what a client is registered as when its worker did not say. */
  readonly uid: number;
  readonly gid: number;
  /**
   * An in-process job failed or was aborted: tell its surviving members which members are gone,
   * so that their MPI library fails what waits on them. Never an event to the whole pool (Open
   * MPI's default handler aborts the process on codes fault tolerance does not handle).
   */
  notifyJobEnded(job: Readonly<Job>): Promise<void>;
  /** Forgets an epoch none of whose ranks is used any more. */
  close(namespace: string): Promise<void>;
}

interface Epoch {
  epoch: number;
  namespace: string;
  size: number;
  state: 'forming' | 'opening' | 'open' | 'failed' | 'closed';
  /** The next rank to hand out. */
  next: number;
  /** rank → worker id, for ranks handed out. */
  owners: Map<number, string>;
  /** Ranks whose client holds a connection. */
  connected: Set<number>;
  /** Settles when the namespace is registered (or could not be). */
  opened: Promise<void>;
  /** The epoch's secret (hex), handed only to its members in their join answer (see the top of this file). */
  secret: string;
  /** While forming: who asked to join, and the timer that closes it. */
  forming?: Forming;
}

interface Forming {
  /** Workers that asked to join, in order. */
  joined: Set<string>;
  /** When the first asked (the deadline counts from then), and when anyone last registered or asked. */
  firstJoinAt?: number;
  lastActivityAt: number;
  timer?: TimerHandle;
  settle: { resolve: () => void; reject: (err: unknown) => void };
}

export interface PoolOptions {
  /** Ranks per epoch; 0 disables the pool. */
  size: number;
  backend: PoolBackend;
  workers: WorkerPool;
  events: EventLog;
  clock: Clock;
  /** Namespace of an epoch. */
  namespaceOf: (epoch: number) => string;
  /** Cohorts in the first epoch; absent or settleMs 0: none, it opens at once. */
  cohort?: CohortOptions;
  onError?: (what: string, err: unknown) => void;
}

/** Why in-process cannot serve a job, or the epoch it runs in. */
/**
 * Where an in-process job can run, or why it cannot; `pending`: only because a member's worker has
 * not asked to join yet (its plugin is starting), which may change soon.
 */
export type PoolPlan = { epoch: number; namespace: string } | { reason: string; pending?: boolean };

export class Pool {
  private readonly epochs = new Map<string, Epoch>();
  private current: Epoch | undefined;
  /** The epoch being opened (or open, unused) while the current one still has room. */
  private next: Epoch | undefined;
  private epochCounter = 0;
  /** Workers waiting for a rank (the current epoch is full or still opening). */
  private readonly waiting = new Set<string>();
  /** Rejects once the sidecar stops: a join still waiting (for an epoch to open or to form, which
   * can take a cohort's whole wait) ends with it instead of holding the REST server's close. */
  private readonly stopped: Promise<never>;
  private stopWith!: (err: RmError) => void;
  private stopReason: string | undefined;

  constructor(private readonly o: PoolOptions) {
    if (!(Number.isInteger(o.size) && o.size > 0))
      throw new RmError('bad_request', 'the pool size must be a positive integer');
    this.stopped = new Promise<never>((_, reject) => {
      this.stopWith = reject;
    });
    this.stopped.catch(() => undefined);
  }

  /** The sidecar is stopping: joins waiting now, and any asked later, fail with `reason`. */
  stop(reason: string): void {
    this.stopReason ??= reason;
    this.stopWith(new RmError('unavailable', `cannot join the pool: ${reason}`));
  }

  private unlessStopped<T>(p: Promise<T>): Promise<T> {
    return Promise.race([p, this.stopped]);
  }

  get size(): number {
    return this.o.size;
  }

  isPoolNamespace(namespace: string): boolean {
    return this.epochs.has(namespace);
  }

  /** Each epoch still held: its number, state, size, ranks handed out and ranks connected. */
  epochSummaries(): { epoch: number; state: string; size: number; handedOut: number; connected: number }[] {
    return [...this.epochs.values()]
      .map((e) => ({ epoch: e.epoch, state: e.state, size: e.size, handedOut: e.next, connected: e.connected.size }))
      .sort((a, b) => a.epoch - b.epoch);
  }

  /** Opens the first epoch ahead of the first worker (a sidecar start does). */
  start(): Promise<void> {
    this.ensureRoom();
    return this.upcoming()!.opened;
  }

  /** Hands the newly registered worker its rank, or queues it until an epoch has room. */
  seat(w: Worker): void {
    this.renewIfEmpty();
    const e = this.current;
    if (e && (e.state === 'open' || e.state === 'forming') && e.next < e.size) this.assign(e, w);
    else this.waiting.add(w.id);
    if (e?.forming) this.touch(e);
    this.ensureRoom();
  }

  private assign(e: Epoch, w: Worker): void {
    const rank = e.next++;
    e.owners.set(rank, w.id);
    w.pool = { epoch: e.epoch, namespace: e.namespace, rank, state: 'assigned' };
    this.waiting.delete(w.id);
    if (e.next >= e.size && this.next?.state === 'open') this.promote(this.next);
  }

  /** Opens the next epoch when the current one is missing, full or nearly full (a tenth left),
   * so that workers rarely wait for one. */
  private ensureRoom(): void {
    const cur = this.current;
    const low = Math.max(1, Math.floor(this.o.size / 10));
    const short = !cur || (cur.state === 'open' && cur.size - cur.next <= low);
    if (!short || this.next || cur?.state === 'opening') return;
    // The first epoch waits for the workers that start together (see the top of this file).
    this.openEpoch(!cur && this.epochCounter === 0 && this.cohorts);
  }

  private get cohorts(): boolean {
    return (this.o.cohort?.settleMs ?? 0) > 0;
  }

  /** A new epoch: the current one if there is none, else the next; forming (gathering cohorts) or registered at once. */
  private openEpoch(forming: boolean): Epoch {
    const cur = this.current;
    const n = this.epochCounter++;
    const epoch: Epoch = {
      epoch: n,
      namespace: this.o.namespaceOf(n),
      size: this.o.size,
      state: 'opening',
      next: 0,
      owners: new Map(),
      connected: new Set(),
      opened: Promise.resolve(),
      secret: randomBytes(32).toString('hex'),
    };
    this.epochs.set(epoch.namespace, epoch);
    if (!cur) this.current = epoch;
    else this.next = epoch;
    if (forming) {
      epoch.state = 'forming';
      epoch.opened = new Promise<void>((resolve, reject) => {
        epoch.forming = { joined: new Set(), lastActivityAt: this.o.clock.now(), settle: { resolve, reject } };
      });
      epoch.opened.catch(() => undefined);
      this.seatWaiting(epoch);
      return epoch;
    }
    epoch.opened = this.register(epoch, {
      epoch: n,
      namespace: epoch.namespace,
      size: epoch.size,
      cohorts: [],
      users: new Map(),
    });
    epoch.opened.catch(() => undefined);
    return epoch;
  }

  /**
   * Every worker of the current epoch is gone (the cluster restarted its workers, or scaled to
   * zero and up again): the workers that register now start a new epoch that gathers them into
   * cohorts as the first one did, instead of each sitting alone on a node of the old one. No
   * worker of the old epoch is left to share a job with, so nothing is lost by leaving it.
   */
  private renewIfEmpty(): void {
    const cur = this.current;
    if (!this.cohorts || !cur || cur.state !== 'open' || cur.next === 0 || this.next) return;
    for (const [rank, id] of cur.owners) {
      const s = this.o.workers.get(id)?.pool;
      if (s && s.namespace === cur.namespace && s.rank === rank && s.state !== 'retired') return;
    }
    this.current = undefined;
    this.openEpoch(true);
    this.closeIfUnused(cur);
  }

  /** Registers the epoch's namespace with the backend. */
  private register(epoch: Epoch, spec: PoolEpochSpec): Promise<void> {
    epoch.state = 'opening';
    return this.o.backend.open(spec).then(
      () => {
        epoch.state = 'open';
        const c = this.current;
        if (c === epoch) this.seatWaiting(epoch);
        else if (c?.state !== 'open' || c.next >= c.size) this.promote(epoch);
      },
      (err: unknown) => {
        epoch.state = 'failed';
        this.epochs.delete(epoch.namespace);
        if (this.next === epoch) this.next = undefined;
        if (this.current === epoch) this.current = undefined;
        this.o.onError?.('open pool epoch', err);
        throw err;
      },
    );
  }

  /**
   * A worker asks to join an open epoch whose workers went away and in which no seat is in use
   * (every other one is retired or, like its own, only handed out): the workers of a restart, whose
   * seats the old epoch gave out while the old workers were still going away. They move to a new
   * epoch that gathers them into cohorts, as the first one did.
   */
  private renewForJoin(w: Worker): void {
    const cur = this.current;
    if (
      !this.cohorts ||
      !cur ||
      cur.state !== 'open' ||
      this.next ||
      w.pool?.namespace !== cur.namespace ||
      w.pool.state !== 'assigned'
    )
      return;
    const movers: Worker[] = [];
    let gone = 0;
    for (const [rank, id] of cur.owners) {
      const x = this.o.workers.get(id);
      const s = x?.pool;
      if (!x || !s || s.namespace !== cur.namespace || s.rank !== rank || s.state === 'retired') {
        gone++;
        continue;
      }
      if (s.state !== 'assigned') return;
      movers.push(x);
    }
    // Only an epoch whose workers went away: a fresh one (the next epoch, just opened) is kept.
    if (gone === 0) return;
    this.current = undefined;
    const e = this.openEpoch(true);
    for (const x of movers) {
      delete x.pool;
      this.assign(e, x);
      this.emit(x);
    }
    this.closeIfUnused(cur);
  }

  // ---- cohorts: the forming first epoch --------------------------------------------------------

  /** A worker registered, asked to join or left while the epoch forms: the quiet time starts again. */
  private touch(e: Epoch): void {
    const f = e.forming!;
    f.lastActivityAt = this.o.clock.now();
    if (f.firstJoinAt !== undefined) this.arm(e);
  }

  private arm(e: Epoch): void {
    const f = e.forming!;
    const c = this.o.cohort!;
    f.timer?.cancel();
    const at = Math.min(f.lastActivityAt + c.settleMs, f.firstJoinAt! + c.maxWaitMs);
    f.timer = this.o.clock.setTimer(Math.max(0, at - this.o.clock.now()), () => this.tick(e));
  }

  /** Closes the forming epoch when every worker seated in it asked to join (or left) and it was
   * quiet for settleMs, or at the deadline; else waits for the others until the deadline. */
  private tick(e: Epoch): void {
    const f = e.forming;
    if (!f || e.state !== 'forming') return;
    const now = this.o.clock.now();
    const deadline = f.firstJoinAt! + this.o.cohort!.maxWaitMs;
    const everyone = [...e.owners].every(([rank, id]) => {
      const w = this.o.workers.get(id);
      return (
        f.joined.has(id) ||
        !w?.pool ||
        w.pool.namespace !== e.namespace ||
        w.pool.rank !== rank ||
        w.pool.state === 'retired'
      );
    });
    if (now < deadline && !everyone) {
      f.timer = this.o.clock.setTimer(deadline - now, () => this.tick(e));
      return;
    }
    this.closeForming(e);
  }

  /** Declares the cohorts of the workers that asked, and registers the namespace. */
  private closeForming(e: Epoch): void {
    const f = e.forming!;
    f.timer?.cancel();
    e.forming = undefined;
    const users = new Map<number, PoolUser>();
    const groups = new Map<string, { host: string; ranks: number[]; workers: Worker[] }>();
    for (const id of f.joined) {
      const w = this.o.workers.get(id);
      const s = w?.pool;
      if (!w || !s || s.namespace !== e.namespace || s.state === 'retired') continue;
      const user = this.userOf(w);
      users.set(s.rank, user);
      // One cohort per host and user: Open MPI's shared memory and single copy stay within a user.
      const key = JSON.stringify([w.host, user.uid, user.gid]);
      const g = groups.get(key) ?? { host: w.host, ranks: [], workers: [] };
      g.ranks.push(s.rank);
      g.workers.push(w);
      groups.set(key, g);
    }
    const cohorts: PoolCohort[] = [];
    const members: Worker[] = [];
    for (const g of groups.values()) {
      if (g.ranks.length < 2) continue;
      const ranks = [...g.ranks].sort((a, b) => a - b);
      cohorts.push({ host: g.host, ranks });
      for (const w of g.workers) w.pool!.localPeers = ranks;
      members.push(...g.workers);
    }
    this.register(e, { epoch: e.epoch, namespace: e.namespace, size: e.size, cohorts, users }).then(
      f.settle.resolve,
      (err: unknown) => {
        for (const w of members) delete w.pool?.localPeers;
        f.settle.reject(err);
      },
    );
  }

  private userOf(w: Worker): PoolUser {
    return { uid: w.uid ?? this.o.backend.uid, gid: w.gid ?? this.o.backend.gid };
  }

  /** The epoch a worker without a rank waits for. */
  private upcoming(): Epoch | undefined {
    return this.next ?? this.current;
  }

  /** Makes `e` the epoch that takes new workers, and seats the workers that waited. */
  private promote(e: Epoch): void {
    const old = this.current;
    this.current = e;
    if (this.next === e) this.next = undefined;
    if (old && old !== e) this.closeIfUnused(old);
    this.seatWaiting(e);
  }

  private seatWaiting(e: Epoch): void {
    for (const id of [...this.waiting]) {
      const w = this.o.workers.get(id);
      if (!w || w.pool) {
        this.waiting.delete(id);
        continue;
      }
      if (e.next >= e.size) break;
      this.assign(e, w);
      this.emit(w);
    }
    this.ensureRoom();
  }

  private emit(w: Worker): void {
    if (w.pool) this.o.events.emit({ kind: 'workerPoolChanged', workerId: w.id, pool: structuredClone(w.pool) });
  }

  private seatOf(namespace: string, rank: number): { e: Epoch; w: Worker | undefined } {
    const e = this.epochs.get(namespace);
    if (!e) throw new RmError('not_found', `no pool with namespace '${namespace}'`);
    const id = e.owners.get(rank);
    const w = id ? this.o.workers.get(id) : undefined;
    return { e, w: w?.pool?.namespace === namespace && w.pool.rank === rank ? w : undefined };
  }

  // ---- the worker side ------------------------------------------------------------------------

  /**
   * The worker is about to initialise its MPI session in the pool: its environment. Waits (up to
   * `waitMs`) for an epoch to open if the worker has no rank yet. A worker that runs as another
   * user than the pool's clients were registered as cannot join (its rank is retired, with the
   * reason, and its jobs run in fork mode). `secret`: its epoch's secret, for this worker only.
   */
  async join(
    workerId: string,
    waitMs: number,
  ): Promise<{ seat: PoolSeat; env: Record<string, string>; secret: string }> {
    if (this.stopReason !== undefined) throw new RmError('unavailable', `cannot join the pool: ${this.stopReason}`);
    let w = this.o.workers.require(workerId);
    const deadline = this.o.clock.now() + waitMs;
    while (!w.pool) {
      // The epoch it waits for may fill up first (a forming one): then it waits for the next.
      this.ensureRoom();
      const e = this.upcoming();
      if (!e) throw new RmError('unavailable', 'the pool has no epoch open');
      const left = deadline - this.o.clock.now();
      if (left <= 0) throw new RmError('timeout', `worker '${workerId}' got no pool rank within ${waitMs} ms`);
      await this.unlessStopped(
        withTimeout(this.o.clock, e.opened, left, `the pool epoch ${e.epoch} did not open within ${waitMs} ms`),
      );
      w = this.o.workers.require(workerId);
      if (!w.pool && this.upcoming() === e)
        throw new RmError('unavailable', `worker '${workerId}' has no pool rank yet; try again`);
    }
    this.renewForJoin(w);
    let seat = w.pool!;
    const check = () => {
      if (seat.state === 'retired')
        throw new RmError('conflict', `worker '${workerId}' left the pool: ${seat.reason ?? 'retired'}`);
      if (seat.state === 'ready')
        throw new RmError('conflict', `pool rank ${seat.rank} of worker '${workerId}' is already connected`);
    };
    check();
    const e = this.epochs.get(seat.namespace);
    if (e?.forming) {
      // The epoch is gathering the workers that start together: answered when it is registered.
      const f = e.forming;
      f.joined.add(w.id);
      f.firstJoinAt ??= this.o.clock.now();
      this.touch(e);
      await this.unlessStopped(
        withTimeout(this.o.clock, e.opened, waitMs, `the pool epoch ${e.epoch} was not registered within ${waitMs} ms`),
      );
      w = this.o.workers.require(workerId);
      if (w.pool?.namespace !== seat.namespace || w.pool.rank !== seat.rank)
        throw new RmError('conflict', `worker '${workerId}' lost its pool rank`);
      seat = w.pool;
      check();
    }
    if (seat.state === 'assigned') {
      seat.state = 'joining';
      this.emit(w);
    }
    try {
      await this.o.backend.setUser(seat.namespace, seat.rank, this.userOf(w));
    } catch (err) {
      this.retire(
        w,
        `its client could not be registered as uid ${w.uid}/gid ${w.gid}: ${err instanceof Error ? err.message : String(err)}`,
      );
      throw new RmError('unavailable', `worker '${workerId}' cannot join the pool: ${seat.reason}`);
    }
    check();
    const epoch = this.epochs.get(seat.namespace);
    if (!epoch) throw new RmError('conflict', `worker '${workerId}' lost its pool rank`);
    return { seat, env: this.o.backend.rankEnv(seat.namespace, seat.rank), secret: epoch.secret };
  }

  /** The worker's rank is of no more use (it left, or its session failed): never reused. */
  retire(w: Worker, reason: string): void {
    this.waiting.delete(w.id);
    if (!w.pool || w.pool.state === 'retired') return;
    w.pool.state = 'retired';
    w.pool.reason = reason;
    this.emit(w);
    const e = this.epochs.get(w.pool.namespace);
    if (e?.forming) this.touch(e);
    if (e && e !== this.current) this.closeIfUnused(e);
  }

  /** Whether an in-process job can run over these workers, and in which epoch. */
  plan(workers: readonly Worker[], impl: Impl): PoolPlan {
    if (impl !== 'openmpi') return { reason: `${impl} has no in-process pool (only Open MPI has)` };
    let epoch: number | undefined;
    let namespace = '';
    for (const w of workers) {
      const s = w.pool;
      if (!s) return { reason: `worker '${w.id}' has no pool rank` };
      if (s.state === 'retired') return { reason: `worker '${w.id}' left the pool: ${s.reason ?? 'retired'}` };
      if (s.state === 'assigned')
        return {
          reason: `worker '${w.id}' has not joined the pool (no dask-pmix worker plugin, or it has not started yet)`,
          pending: true,
        };
      if (epoch !== undefined && s.epoch !== epoch)
        return { reason: `the members are in different pool epochs (${epoch} and ${s.epoch})` };
      epoch = s.epoch;
      namespace = s.namespace;
    }
    if (epoch === undefined) return { reason: 'no members' };
    return { epoch, namespace };
  }

  /** Workers of one epoch that can run in-process: those of the epoch with the most of them. */
  inprocessCandidates(available: readonly Worker[]): Worker[] {
    const byEpoch = new Map<number, Worker[]>();
    for (const w of available) {
      if (w.pool && (w.pool.state === 'joining' || w.pool.state === 'ready')) {
        const list = byEpoch.get(w.pool.epoch) ?? [];
        list.push(w);
        byEpoch.set(w.pool.epoch, list);
      }
    }
    return [...byEpoch.values()].sort((a, b) => b.length - a.length)[0] ?? [];
  }

  // ---- the protocol side ----------------------------------------------------------------------

  /** Why a connection as this rank must be refused: only a worker that is joining may connect. */
  refusal(namespace: string, rank: number): string | undefined {
    const e = this.epochs.get(namespace);
    if (!e) return `no pool with namespace '${namespace}'`;
    const id = e.owners.get(rank);
    const w = id ? this.o.workers.get(id) : undefined;
    if (!w?.pool || w.pool.namespace !== namespace || w.pool.rank !== rank)
      return `pool rank ${rank} belongs to no registered worker`;
    if (w.pool.state === 'retired') return `pool rank ${rank} was retired: ${w.pool.reason ?? ''}`;
    if (w.pool.state === 'ready') return `pool rank ${rank} is connected already`;
    if (w.pool.state === 'assigned') return `worker '${w.id}' has not asked to join the pool`;
    return undefined;
  }

  /** A pool rank's MPI library reached the PMIx server; returns its worker. */
  connected(namespace: string, rank: number): Worker {
    const { e, w } = this.seatOf(namespace, rank);
    e.connected.add(rank);
    if (!w) throw new RmError('not_found', `pool rank ${rank} of ${namespace} belongs to no registered worker`);
    const seat = w.pool!;
    if (seat.state === 'retired')
      throw new RmError('conflict', `pool rank ${rank} of ${namespace} was retired: ${seat.reason ?? ''}`);
    seat.state = 'ready';
    this.emit(w);
    return w;
  }

  /** A pool rank's connection ended (finalized or dropped); returns its worker, if registered. */
  disconnected(namespace: string, rank: number, reason: string): Worker | undefined {
    const { e, w } = this.seatOf(namespace, rank);
    e.connected.delete(rank);
    if (w) this.retire(w, reason);
    else if (e !== this.current) this.closeIfUnused(e);
    return w;
  }

  /** The worker of a pool rank, if it is still registered. */
  workerAt(namespace: string, rank: number): Worker | undefined {
    return this.seatOf(namespace, rank).w;
  }

  private closeIfUnused(e: Epoch): void {
    if (e.state !== 'open' || e === this.current || e === this.next || e.connected.size > 0) return;
    for (const id of e.owners.values()) {
      const w = this.o.workers.get(id);
      if (w?.pool?.namespace === e.namespace && w.pool.state !== 'retired') return;
    }
    e.state = 'closed';
    this.epochs.delete(e.namespace);
    this.o.backend.close(e.namespace).catch((err: unknown) => this.o.onError?.('close pool epoch', err));
  }

  /** For /metrics and GET: epochs and ranks by state. */
  stats(): { epochs: number; ranks: Record<string, number> } {
    const ranks: Record<string, number> = { free: 0, assigned: 0, joining: 0, ready: 0, retired: 0 };
    for (const e of this.epochs.values()) {
      if (e.state !== 'open' && e.state !== 'opening' && e.state !== 'forming') continue;
      ranks.free! += e.size - e.next;
      for (const [rank, id] of e.owners) {
        const w = this.o.workers.get(id);
        const s = w?.pool?.namespace === e.namespace && w.pool.rank === rank ? w.pool.state : 'retired';
        ranks[s] = (ranks[s] ?? 0) + 1;
      }
    }
    return { epochs: this.epochs.size, ranks };
  }
}

function withTimeout<T>(clock: Clock, p: Promise<T>, ms: number, message: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = clock.setTimer(ms, () => reject(new RmError('timeout', message)));
    p.then(
      (v) => {
        t.cancel();
        resolve(v);
      },
      (err: unknown) => {
        t.cancel();
        reject(
          err instanceof RmError
            ? err
            : new RmError(
                'unavailable',
                `the pool epoch could not be opened: ${err instanceof Error ? err.message : String(err)}`,
              ),
        );
      },
    );
  });
}
