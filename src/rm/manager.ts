// The resource manager: the facade the protocol servers and the REST layer drive. It owns the
// worker pool and the process sets, and hands jobs to the job lifecycle (job-lifecycle.ts),
// which runs their state machine.
//
// Plain TypeScript without I/O: the protocol backends (JobBackend) do the protocol's side of
// creating and releasing a job, and the policy (a port, policy.ts) is injected.
import type { WaitOptions } from './admission.js';
import type { JobBackend } from './backend.js';
import { type Clock, isoTime, realClock } from './clock.js';
import type {
  CollectiveDelegate,
  CollectiveObserver,
  CollectiveResult,
  DelegatedCollective,
  JoinRequest,
} from './collectives.js';
import { ContextIds } from './context-ids.js';
import { ElasticJobs } from './elastic-jobs.js';
import { RmError } from './errors.js';
import { EventLog } from './events.js';
import { assertDistinct, JobLifecycle } from './job-lifecycle.js';
import type { KvStore } from './kv-store.js';
import { NameService } from './name-service.js';
import type { Policy } from './policy.js';
import { type CohortOptions, Pool, type PoolBackend } from './pool.js';
import { ProcessSets } from './process-sets.js';
import { Returning } from './returning.js';
import {
  IMPLS,
  type Impl,
  type Job,
  type JobMember,
  type JobMode,
  type JobSpec,
  type JobState,
  type PoolSeat,
  type ProcessSet,
  type PsetSpec,
  type RankRef,
  type Worker,
  type WorkerSpec,
} from './types.js';
import { WorkerPool } from './worker-pool.js';
import { type WorldBackend, Worlds } from './worlds.js';

export interface RmOptions {
  /** The decisions the core asks for (src/policy has the default). */
  policy: Policy;
  clock?: Clock;
  backends?: JobBackend[];
  /** Default wiring timeout of a job (seconds), when its request gives none. */
  wiringTimeoutSeconds?: number;
  /** Deadline of a collective (ms); 0: none. */
  collectiveTimeoutMs?: number;
  /** Released jobs kept for GET before the oldest are forgotten. */
  historySize?: number;
  /** Makes job ids; the default is a per-process prefix and a counter. */
  newJobId?: () => string;
  /** Namespace (PMIx) / kvsname (PMI) of a job. */
  namespaceOf?: (jobId: string) => string;
  onCollective?: CollectiveObserver;
  /** Backend failures and other trouble the core survives. */
  onError?: (what: string, err: unknown) => void;
  /** The in-process pool: ranks per epoch (0: none) and its protocol side. */
  pool?: { size: number; backend: PoolBackend; cohort?: CohortOptions };
  /** A job left the history (DELETE, or trimmed). */
  onJobForgotten?: (job: Readonly<Job>) => void;
  /** Job requests that may wait for members or a job slot at once (default 256). */
  maxWaitingJobs?: number;
  /** Bounds on what clients can make the core hold (RM_LIMITS has the defaults). */
  limits?: Partial<RmLimits>;
}

export interface RmLimits {
  workers: number;
  psets: number;
  /** Entries in the name service (MPI_Publish_name / PMI publish), over every job. */
  names: number;
}

export const RM_LIMITS: RmLimits = { workers: 4096, psets: 1024, names: 4096 };

/** What a worker process says of itself when it joins the pool. */
export interface WorkerIdentity {
  host?: string;
  pid?: number;
  uid?: number;
  gid?: number;
}

export class ResourceManager {
  readonly clock: Clock;
  readonly policy: Policy;
  readonly events: EventLog;
  readonly names: NameService;
  readonly limits: RmLimits;
  readonly contextIds = new ContextIds();
  /** Elastic jobs: their generations (jobs labelled with their id) and the drains made of them. */
  readonly elastic: ElasticJobs;
  private readonly workers = new WorkerPool();
  /** Workers that left and are expected back (their nanny restarts them, or dask-pmix replaces them). */
  private readonly returning: Returning;
  private readonly psets = new ProcessSets();
  private readonly backends = new Map<Impl, JobBackend>();
  private readonly jobs: JobLifecycle;
  private poolState: { pool: Pool; backend: PoolBackend } | undefined;
  private worldsState: Worlds | undefined;
  private readonly idPrefix = Math.floor(Math.random() * 0x10000)
    .toString(16)
    .padStart(4, '0');

  constructor(private readonly opts: RmOptions) {
    this.clock = opts.clock ?? realClock;
    this.policy = opts.policy;
    this.events = new EventLog(() => this.clock.now());
    this.limits = { ...RM_LIMITS, ...opts.limits };
    this.names = new NameService(this.clock, undefined, this.limits.names);
    this.returning = new Returning(this.clock, this.limits.workers);
    this.jobs = new JobLifecycle({
      clock: this.clock,
      policy: this.policy,
      events: this.events,
      names: this.names,
      workers: this.workers,
      psets: this.psets,
      backendFor: (impl) => this.backends.get(impl),
      impls: () => this.impls,
      wiringTimeoutSeconds: opts.wiringTimeoutSeconds ?? 60,
      collectiveTimeoutMs: opts.collectiveTimeoutMs ?? 0,
      historySize: opts.historySize ?? 1000,
      ...(opts.newJobId ? { newJobId: opts.newJobId } : {}),
      ...(opts.namespaceOf ? { namespaceOf: opts.namespaceOf } : {}),
      ...(opts.onCollective ? { onCollective: opts.onCollective } : {}),
      ...(opts.onError ? { onError: opts.onError } : {}),
      ...(opts.onJobForgotten ? { onForgotten: opts.onJobForgotten } : {}),
      ...(opts.maxWaitingJobs !== undefined ? { maxWaiting: opts.maxWaitingJobs } : {}),
      pool: () => this.poolState,
      worlds: () => this.worldsState,
      returning: this.returning,
    });
    this.elastic = new ElasticJobs(() => this.jobs.list(), this.events, this.clock);
    for (const b of opts.backends ?? []) this.addBackend(b);
    if (opts.pool) this.installPool(opts.pool.size, opts.pool.backend, opts.pool.cohort);
  }

  /**
   * Gives the sidecar an in-process pool of `size` ranks per epoch (0: none), served by
   * `backend`; workers registered later get a rank as they register, those already there now.
   */
  installPool(size: number, backend: PoolBackend, cohort?: CohortOptions): void {
    if (this.poolState) throw new Error('a pool is already installed');
    if (size <= 0) return;
    const pool = new Pool({
      size,
      backend,
      workers: this.workers,
      events: this.events,
      clock: this.clock,
      namespaceOf: (epoch) => `dask-pmix.pool-${this.idPrefix}.${epoch}`,
      ...(cohort ? { cohort } : {}),
      ...(this.opts.onError ? { onError: this.opts.onError } : {}),
    });
    this.poolState = { pool, backend };
    for (const w of this.workers.list()) pool.seat(w);
  }

  /**
   * Lets MPICH / Intel MPI worker processes be in-process seats, each a world of its own
   * (worlds.ts), served by `backend` (the PMI listener).
   */
  installWorlds(backend: WorldBackend): void {
    if (this.worldsState) throw new Error('worlds are already installed');
    this.worldsState = new Worlds({
      backend,
      workers: this.workers,
      events: this.events,
      namespaceOf: (n) => `dask-pmix.world-${this.idPrefix}.${n}`,
    });
  }

  /** The in-process worlds of MPICH / Intel MPI workers, if this sidecar has them. */
  get worlds(): Worlds | undefined {
    return this.worldsState;
  }

  /** The in-process pool, if this sidecar has one. */
  get pool(): Pool | undefined {
    return this.poolState?.pool;
  }

  addBackend(b: JobBackend): void {
    for (const impl of b.impls) {
      if (this.backends.has(impl)) throw new Error(`a backend for ${impl} is already installed`);
      this.backends.set(impl, b);
    }
  }

  /** The implementations jobs can be created for. */
  get impls(): Impl[] {
    return IMPLS.filter((i) => this.backends.has(i));
  }

  get isStopping(): boolean {
    return this.jobs.isStopping;
  }

  /** Jobs created since start, for metrics. */
  get jobsCreated(): number {
    return this.jobs.created;
  }

  private now(): string {
    return isoTime(this.clock.now());
  }

  // ---- workers -------------------------------------------------------------------------------

  registerWorker(spec: WorkerSpec): Readonly<Worker> {
    if (!spec.id) throw new RmError('bad_request', 'a worker needs an id');
    if (!spec.host) throw new RmError('bad_request', 'a worker needs a host');
    if (this.workers.size >= this.limits.workers && !this.workers.get(spec.id)) {
      throw new RmError('limit', `at most ${this.limits.workers} workers may be registered`);
    }
    const w = this.workers.add(spec, this.now());
    this.returning.joined(w);
    this.pool?.seat(w);
    this.events.emit({ kind: 'workerJoined', worker: structuredClone(w) });
    for (const p of this.psets.memberBack(w.id)) this.events.emit({ kind: 'psetDefined', pset: structuredClone(p) });
    return w;
  }

  getWorker(id: string): Readonly<Worker> {
    return this.workers.require(id);
  }

  listWorkers(): readonly Readonly<Worker>[] {
    return this.workers.list();
  }

  /**
   * The worker left the cluster (retired, crashed, removed over REST). If it was a member of an
   * active job, that member is lost, which fails the job under the default policy. `returning`:
   * it is expected back (its nanny restarts it, or dask-pmix replaces it), so that a job request
   * short of workers meanwhile waits for it (within its wiring timeout) instead of failing.
   */
  removeWorker(id: string, reason = 'removed', opts: { returning?: boolean } = {}): Readonly<Worker> {
    const w = this.workers.remove(id);
    if (opts.returning) this.returning.left(w);
    if (w.jobId) this.jobs.memberGone(w.jobId, id, `its worker left (${reason})`);
    this.worlds?.retire(w, `its worker left (${reason})`);
    this.pool?.retire(w, `its worker left (${reason})`);
    this.events.emit({ kind: 'workerLeft', workerId: id, reason });
    for (const p of this.psets.memberGone(id)) this.events.emit({ kind: 'psetDefined', pset: structuredClone(p) });
    return w;
  }

  // ---- the in-process pool (pool.ts) ---------------------------------------------------------

  private requirePool(): Pool {
    if (!this.pool) throw new RmError('unprocessable', 'this sidecar has no in-process pool (serve --pool-size 0)');
    return this.pool;
  }

  /**
   * The worker process is about to initialise its MPI session in the pool: records what it says
   * of itself (its own host, pid, uid and gid) and answers its rank, the environment to set and,
   * for a rank of an Open MPI epoch, the epoch's secret (pool.ts; for this worker only).
   */
  joinPool(
    workerId: string,
    who: WorkerIdentity,
    waitMs = 30_000,
    impl: Impl = 'openmpi',
  ): Promise<{ worker: Readonly<Worker>; seat: PoolSeat; env: Record<string, string>; secret?: string }> {
    const worlds = impl === 'openmpi' ? undefined : this.worlds;
    if (impl !== 'openmpi' && !worlds)
      throw new RmError(
        'unprocessable',
        `this sidecar has no in-process seats for ${impl} (no PMI listener, or serve --pool-size 0)`,
      );
    const pool = worlds ? undefined : this.requirePool();
    const w = this.workers.require(workerId);
    if (who.host !== undefined && who.host !== w.host && w.state !== 'available') {
      throw new RmError('conflict', `worker '${workerId}' is in job ${w.jobId}; its host cannot change now`);
    }
    if (worlds) {
      // Its Open MPI pool rank, handed out at registration, will never be used.
      if (w.pool && !Worlds.isWorld(w.pool))
        this.pool?.retire(w, `it runs ${impl}: its in-process seat is a world of its own`);
      this.workers.identify(workerId, who);
      const { seat, env } = worlds.join(w, impl);
      return Promise.resolve({ worker: w, seat, env });
    }
    if (Worlds.isWorld(w.pool))
      throw new RmError('conflict', `worker '${workerId}' already has its ${w.pool!.impl} world`);
    this.workers.identify(workerId, who);
    return pool!
      .join(workerId, waitMs)
      .then(({ seat, env, secret }) => ({ worker: this.workers.require(workerId), seat, env, secret }));
  }

  /** The worker's pool rank is of no use (its session failed to start, or it gives it up). */
  leavePool(workerId: string, reason: string): Readonly<Worker> {
    const w = this.workers.require(workerId);
    if (Worlds.isWorld(w.pool)) this.worlds?.retire(w, reason);
    else if (this.pool || !this.worlds) this.requirePool().retire(w, reason);
    return w;
  }

  /** Why a connection as this world must be refused, or undefined to admit it. */
  worldRefusal(namespace: string): string | undefined {
    return this.worlds?.refusal(namespace) ?? (this.worlds ? undefined : 'this sidecar has no in-process worlds');
  }

  /** A world's MPI library bound its PMI connection. */
  worldConnected(namespace: string): void {
    if (!this.worlds) throw new RmError('unprocessable', 'this sidecar has no in-process worlds');
    this.worlds.connected(namespace);
  }

  /**
   * A world's connection ended: finalized (the worker process exits) or lost (it died). The
   * world is retired, and the job its worker is in fails at once.
   */
  worldGone(namespace: string, reason: string): void {
    const w = this.worlds?.gone(namespace, reason);
    if (w?.jobId) this.jobs.memberGone(w.jobId, w.id, reason);
  }

  /** PMI abort from a world: the job its worker is in is aborted. */
  worldAbort(namespace: string, status: number, message: string): void {
    const w = this.worlds?.workerOf(namespace);
    if (!w) throw new RmError('not_found', `world ${namespace} belongs to no registered worker`);
    if (w.jobId) this.jobs.abortFrom(w.jobId, w.id, status, message);
  }

  isPoolNamespace(namespace: string): boolean {
    return this.pool?.isPoolNamespace(namespace) ?? false;
  }

  /** Why a connection as this pool rank must be refused, or undefined to admit it. */
  poolRefusal(namespace: string, rank: number): string | undefined {
    return this.requirePool().refusal(namespace, rank);
  }

  /** A pool rank's MPI library reached the PMIx server. */
  poolClientConnected(namespace: string, rank: number): void {
    this.requirePool().connected(namespace, rank);
  }

  /**
   * A pool rank's connection ended: finalized (the worker closed its session) or lost (the
   * worker process died). The rank is retired, and the job its worker is in fails at once.
   */
  poolClientGone(namespace: string, rank: number, reason: string): void {
    const w = this.requirePool().disconnected(namespace, rank, reason);
    if (w?.jobId) this.jobs.memberGone(w.jobId, w.id, reason);
  }

  /** MPI_Abort from a pool rank: the job its worker is in is aborted. */
  poolAbort(namespace: string, rank: number, status: number, message: string): void {
    const w = this.requirePool().workerAt(namespace, rank);
    if (!w) throw new RmError('not_found', `pool rank ${rank} of ${namespace} belongs to no registered worker`);
    if (w.jobId) this.jobs.abortFrom(w.jobId, w.id, status, message);
  }

  /** A group was constructed over pool ranks (an in-process job's communicator, or another). */
  poolGroupConstructed(namespace: string, group: string, ranks: readonly number[]): void {
    this.jobs.groupConstructed(namespace, group, ranks);
  }

  // ---- process sets --------------------------------------------------------------------------

  /**
   * Takes back what an earlier run of the sidecar defined: process sets (their members register
   * again as their workers do) and the job history (an active job there is failed here).
   */
  restore(state: { psets: ProcessSet[]; jobs: Job[] }, reason: string): void {
    for (const p of state.psets) {
      if (!this.psets.get(p.name)) this.psets.define(p.name, p.members, p.selector, p.createdAt);
    }
    for (const j of state.jobs) this.jobs.restore(j, reason);
  }

  definePset(spec: PsetSpec): Readonly<ProcessSet> {
    ProcessSets.validateName(spec.name);
    if (this.psets.get(spec.name)) throw new RmError('conflict', `pset '${spec.name}' already exists`);
    if (this.psets.size >= this.limits.psets)
      throw new RmError('limit', `at most ${this.limits.psets} psets may be defined`);
    const members = this.resolvePsetMembers(spec);
    const p = this.psets.define(spec.name, members, spec.selector, this.now());
    this.events.emit({ kind: 'psetDefined', pset: structuredClone(p) });
    return p;
  }

  /** PUT: replaces the members of an existing pset that no active job uses. */
  redefinePset(spec: PsetSpec): Readonly<ProcessSet> {
    const old = this.psets.require(spec.name);
    if (old.jobId) throw new RmError('conflict', `pset '${spec.name}' is used by active job ${old.jobId}`);
    const members = this.resolvePsetMembers(spec);
    this.psets.delete(spec.name);
    const p = this.psets.define(spec.name, members, spec.selector, this.now());
    this.events.emit({ kind: 'psetDefined', pset: structuredClone(p) });
    return p;
  }

  deletePset(name: string): Readonly<ProcessSet> {
    const p = this.psets.require(name);
    if (p.jobId) throw new RmError('conflict', `pset '${name}' is used by active job ${p.jobId}`);
    this.psets.delete(name);
    this.events.emit({ kind: 'psetDeleted', name });
    return p;
  }

  getPset(name: string): Readonly<ProcessSet> {
    return this.psets.require(name);
  }

  listPsets(): readonly Readonly<ProcessSet>[] {
    return this.psets.list();
  }

  /** The processes a pset's members are right now: their ranks in the active jobs they are in. */
  psetProcs(name: string): RankRef[] {
    const p = this.psets.require(name);
    const out: RankRef[] = [];
    for (const id of p.members) {
      const w = this.workers.get(id);
      const found = w?.jobId ? this.jobs.activeMembership(id, w.jobId) : undefined;
      if (found) out.push({ namespace: found.job.namespace, rank: found.member.rank });
    }
    return out;
  }

  private resolvePsetMembers(spec: PsetSpec): string[] {
    if ((spec.members?.length ? 1 : 0) + (spec.selector ? 1 : 0) !== 1) {
      throw new RmError('bad_request', 'a pset needs exactly one of members (a non-empty list) or selector');
    }
    if (spec.members) {
      assertDistinct(spec.members);
      for (const id of spec.members) {
        if (!this.workers.get(id)) throw new RmError('unprocessable', `no worker '${id}'`);
      }
      // The workers' own id strings: a pset costs a reference per member, whatever the request held.
      return spec.members.map((id) => this.workers.get(id)!.id);
    }
    return this.policy
      .select(
        spec.selector!,
        this.workers.list().filter((w) => w.state === 'available'),
      )
      .map((w) => w.id);
  }

  // ---- jobs (the lifecycle lives in job-lifecycle.ts) ----------------------------------------

  /**
   * Creates a job: picks and freezes its members, lays out its ranks, and has its backend make
   * the namespace known. Fails without side effects.
   */
  createJob(spec: JobSpec, opts: { waitMs?: number } & WaitOptions = {}): Promise<Readonly<Job>> {
    return this.jobs.create(spec, opts.waitMs ?? 0, { onQueued: opts.onQueued, signal: opts.signal });
  }

  /** Workers that left the cluster and are expected back (returning.ts). */
  get workersExpectedBack(): number {
    return this.returning.size;
  }

  /** Job requests waiting for members or a job slot. */
  get waitingJobs(): number {
    return this.jobs.waiting;
  }

  getJob(id: string): Readonly<Job> {
    return this.jobs.get(id);
  }

  listJobs(): readonly Readonly<Job>[] {
    return this.jobs.list();
  }

  activeJobs(): readonly Readonly<Job>[] {
    return this.jobs.active();
  }

  /** DELETE: aborts the job if it is active, releases it at once and forgets it. */
  deleteJob(id: string, reason = 'deleted over REST'): Promise<Readonly<Job>> {
    return this.jobs.delete(id, reason);
  }

  /** The complete protocol environment `workerId` must set to join job `jobId` as its rank. */
  memberEnv(
    jobId: string,
    workerId: string,
  ): { job: Readonly<Job>; member: Readonly<JobMember>; env: Record<string, string> } {
    return this.jobs.memberEnv(jobId, workerId);
  }

  /** A member's process died, as its worker saw it (the protocol may not notice at once). */
  reportMemberLost(jobId: string, workerId: string, reason: string): Readonly<Job> {
    return this.jobs.reportMemberLost(jobId, workerId, reason);
  }

  /** Waits until the job is released (for tests and shutdown). */
  released(id: string): Promise<void> {
    return this.jobs.released(id);
  }

  /**
   * In-process jobs: the member on `workerId` is there. Resolves with ready=true once every member
   * is (then each builds the communicator), or ready=false after `waitMs`; rejects once the job ended.
   * A member of an MPICH / Intel MPI job brings the ports it accepts on (merge-tree.ts) and gets
   * every member's, in rank order, once all are there.
   */
  joinJob(
    jobId: string,
    workerId: string,
    waitMs: number,
    ports?: Readonly<Record<string, string>>,
  ): Promise<{ job: Readonly<Job>; ready: boolean; ports?: Record<string, string>[] }> {
    return this.jobs.join(jobId, workerId, waitMs, ports);
  }

  /**
   * In-process jobs: the member on `workerId` is done, with its function's outcome; a member that
   * failed because its MPI library saw other members fail names them (failedRanks, job ranks).
   */
  completeJob(jobId: string): Readonly<Job> {
    return this.jobs.complete(jobId);
  }

  /**
   * In-process jobs: every member is there and derives its communicator from the one kept since
   * job `from`, over the same members or more (the server sees no group construct for it): the
   * job runs.
   */
  reusedJob(jobId: string, from: string): Readonly<Job> {
    return this.jobs.reused(jobId, from);
  }

  leaveJob(
    jobId: string,
    workerId: string,
    ok: boolean,
    reason: string,
    failedRanks: readonly number[] = [],
  ): Readonly<Job> {
    return this.jobs.leave(jobId, workerId, ok, reason, failedRanks);
  }

  // ---- the protocol side: what PMIx and PMI servers report and ask -------------------------

  /** The job and member behind a protocol's (namespace, rank); throws not_found. */
  findMember(namespace: string, rank: number): { job: Readonly<Job>; member: Readonly<JobMember> } {
    if (this.isPoolNamespace(namespace)) {
      // A pool rank acts for the in-process job its worker is in.
      const w = this.pool!.workerAt(namespace, rank);
      const found = w?.jobId ? this.jobs.activeMembership(w.id, w.jobId) : undefined;
      if (!found) throw new RmError('not_found', `pool rank ${rank} of ${namespace} is in no active job`);
      return found;
    }
    return this.jobs.findMember(namespace, rank);
  }

  /** The job of a namespace / kvsname, if it is still known. */
  jobByNamespace(namespace: string): Readonly<Job> | undefined {
    return this.jobs.byNamespaceOf(namespace);
  }

  /** A member's MPI library reached the process manager. Throws if its job is over. */
  memberConnected(namespace: string, rank: number): void {
    this.jobs.memberConnected(namespace, rank);
  }

  /** A member finalized cleanly. The job completes when every member has. */
  memberFinalized(namespace: string, rank: number): void {
    this.jobs.memberFinalized(namespace, rank);
  }

  /** A member's process went away without finalizing (connection lost, killed). */
  memberLost(namespace: string, rank: number, reason: string): void {
    this.jobs.memberLost(namespace, rank, reason);
  }

  /** A member called MPI_Abort / PMIx_Abort / PMI abort: the whole job is aborted. */
  abort(namespace: string, rank: number, status: number, message: string): void {
    this.jobs.abort(namespace, rank, status, message);
  }

  /** Joins a collective of the job (fence, barrier, kvs-fence, group construct). */
  collective(namespace: string, req: JoinRequest): Promise<CollectiveResult> {
    return this.jobs.collective(namespace, req);
  }

  /** Hands a collective of the job over to a delegate (collectives.ts CollectiveDelegate). */
  delegateCollective(namespace: string, name: string, delegate: CollectiveDelegate): DelegatedCollective {
    return this.jobs.delegateCollective(namespace, name, delegate);
  }

  /** The job's key-value space (PMI put/get, kvs-put/kvs-get, node attributes). */
  kv(namespace: string): KvStore {
    return this.jobs.kv(namespace);
  }

  // ---- life cycle ----------------------------------------------------------------------------

  /**
   * Stops: refuses new jobs, aborts the active ones (their members are told), releases every
   * job at once, and closes the backends.
   */
  async shutdown(reason = 'the sidecar is stopping'): Promise<void> {
    this.pool?.stop(reason);
    await this.jobs.shutdown(reason);
    for (const b of new Set(this.backends.values())) {
      await b.close().catch((e: unknown) => this.opts.onError?.('close', e));
    }
  }

  /** Counts for /metrics. */
  stats(): {
    workers: Record<string, number>;
    jobs: Record<JobState, number>;
    modes: Record<JobMode, number>;
    psets: number;
    names: number;
    pool?: { epochs: number; ranks: Record<string, number> };
  } {
    const workers: Record<string, number> = { available: 0, frozen: 0 };
    for (const w of this.workers.list()) workers[w.state] = (workers[w.state] ?? 0) + 1;
    const modes: Record<JobMode, number> = { inprocess: 0, fork: 0 };
    for (const j of this.jobs.list()) modes[j.mode]++;
    const out = { workers, jobs: this.jobs.countByState(), modes, psets: this.psets.size, names: this.names.size };
    return this.pool ? { ...out, pool: this.pool.stats() } : out;
  }
}
