// The job lifecycle: creating a job, what its protocol reports about its members, its state
// machine, and its release.
//
//   pending → wiring → running → completed | failed | aborted
//
// pending: created, members frozen, environments handed out; wiring: a member reached the
// process manager; running: every member has; completed: every member finalized. A member lost,
// a wiring or job timeout, MPI_Abort or a DELETE end the job early. Once a job has ended and
// its members have left (or the release grace has passed), it is released: its backend tears
// the namespace down and its workers are unfrozen.
//
// An in-process job (mode inprocess) runs inside the worker processes, as a communicator over
// their ranks in one epoch of the pool (pool.ts): no namespace of its own and no new client.
// Its members join over REST and wait there until every member has (so that none enters
// MPI_Comm_create_from_group, which cannot be interrupted, before all are there); the job runs
// once the communicator's group construct (tagged with the job's tag) reaches the server; each
// member reports over REST when it is done, or that it failed.
//
// An in-process MPICH / Intel MPI job runs over workers that are each a world of their own
// (worlds.ts): its members join with the ports they accept on and get everyone's once all are
// there (the merge tree of merge-tree.ts builds the communicator in the workers, out of the
// server's sight); the job runs from then on.
//
// Plain TypeScript without I/O. The workers and psets it freezes belong to the facade
// (ResourceManager), which hands them in.
import { randomBytes } from 'node:crypto';
import { Admission, BusyUntil, type WaitOptions } from './admission.js';
import type { JobBackend } from './backend.js';
import { type Clock, isoTime, type TimerHandle } from './clock.js';
import {
  type CollectiveDelegate,
  type CollectiveObserver,
  type CollectiveResult,
  Collectives,
  type DelegatedCollective,
  type JoinRequest,
} from './collectives.js';
import { RmError } from './errors.js';
import type { EventLog } from './events.js';
import { KvStore } from './kv-store.js';
import { layoutMembers } from './layout.js';
import { acceptSteps, MAX_PORT_NAME } from './merge-tree.js';
import type { NameService } from './name-service.js';
import type { Policy } from './policy.js';
import type { Pool, PoolBackend, PoolPlan } from './pool.js';
import type { ProcessSets } from './process-sets.js';
import type { Returning } from './returning.js';
import {
  type Impl,
  isActive,
  type Job,
  type JobMember,
  type JobSpec,
  type JobState,
  type MemberState,
  type ProcessSet,
  type Worker,
} from './types.js';
import type { WorkerPool } from './worker-pool.js';
import { Worlds } from './worlds.js';

export interface JobLifecycleOptions {
  clock: Clock;
  policy: Policy;
  events: EventLog;
  names: NameService;
  workers: WorkerPool;
  psets: ProcessSets;
  backendFor: (impl: Impl) => JobBackend | undefined;
  /** Says which implementations can be served, for the error when one cannot. */
  impls: () => Impl[];
  wiringTimeoutSeconds: number;
  collectiveTimeoutMs: number;
  historySize: number;
  newJobId?: () => string;
  namespaceOf?: (jobId: string) => string;
  onCollective?: CollectiveObserver;
  onError?: (what: string, err: unknown) => void;
  /** Job requests that may wait for members or a job slot at once (default 256). */
  maxWaiting?: number;
  /** A job left the history (DELETE, or trimmed): its persisted record goes too. */
  onForgotten?: (job: Readonly<Job>) => void;
  /** The in-process pool, if the sidecar has one, and its protocol side. */
  pool: () => { pool: Pool; backend: PoolBackend } | undefined;
  /** The in-process worlds of MPICH / Intel MPI workers, if the sidecar has them. */
  worlds?: () => Worlds | undefined;
  /** Workers that left the cluster and are expected back (a request short of workers waits for them). */
  returning?: Returning;
}

/** One job request, across its tries while it waits in the admission line. */
interface JobRequest {
  started: number;
  /** In-process: members still joining the pool are waited for until then (0: not at all). */
  poolUntil: number;
  /** Workers that left within this long (the job's wiring timeout) and are expected back count. */
  windowMs: number;
  /** They are waited for until then (0: not at all), */
  backUntil: number;
  /** ... which is the end of this bound. */
  backBound: string;
  /** The most workers expected back that it waited for. */
  waitedFor: number;
  /** Members it named that it waited for under their ids. */
  waitedForIds: Set<string>;
  /** Wakes the line at backUntil, so that the wait ends then with its reason. */
  timer?: TimerHandle;
}

/** What the core holds for each job beyond its record. */
interface JobRuntime {
  job: Job;
  backend: JobBackend;
  collectives: Collectives;
  kv: KvStore;
  timers: TimerHandle[];
  notified?: Promise<void>;
  releasing?: Promise<void>;
  /** In-process jobs: settles once every member joined (or the job ended first). */
  joined?: Deferred;
  /** In-process jobs over worlds: each member's ports by merge step, in rank order. */
  ports?: (Record<string, string> | undefined)[];
  /**
   * Ranks that finalized before every member had connected. No MPI can have wired them up with
   * the rest, so the job does not count as running on their account: its wiring timeout holds.
   */
  finalizedWiring?: number[];
}

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
  reject: (e: Error) => void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

export class JobLifecycle {
  private readonly jobs = new Map<string, JobRuntime>();
  private readonly byNamespace = new Map<string, JobRuntime>();
  /** In-process jobs by tag (they share their pool's namespace). */
  private readonly byTag = new Map<string, JobRuntime>();
  /** What an in-process job asks of a protocol backend: nothing to prepare or tear down. */
  private readonly poolJobs: JobBackend;
  private stopping: string | undefined;
  /** Jobs whose backend is still preparing them: they count against the admission cap. */
  private creating = 0;
  private jobCounter = 0;
  private readonly idPrefix = Math.floor(Math.random() * 0x10000)
    .toString(16)
    .padStart(4, '0');
  /** Jobs created since start, for metrics. */
  created = 0;

  private readonly admission: Admission;

  constructor(private readonly o: JobLifecycleOptions) {
    this.admission = new Admission(o.clock, o.maxWaiting ?? 256);
    // Workers freed, a job slot freed (a job ended), a worker joined: waiting requests try again.
    o.events.subscribe(({ event: e }) => {
      if (
        (e.kind === 'workerStateChanged' && e.to === 'available') ||
        e.kind === 'workerJoined' ||
        e.kind === 'psetDefined' ||
        e.kind === 'workerPoolChanged' ||
        (e.kind === 'jobStateChanged' && !isActive(e.to))
      )
        this.admission.wake();
    });
    this.poolJobs = {
      impls: [],
      prepare: async () => undefined,
      memberEnv: () => ({}),
      // Worlds (MPICH / Intel MPI) hear of the end from their members' watchers, not from the server.
      notifyEnded: async (job) => (job.impl === 'openmpi' ? o.pool()?.backend.notifyJobEnded(job) : undefined),
      release: async () => undefined,
      close: async () => undefined,
    };
  }

  private now(): string {
    return isoTime(this.o.clock.now());
  }

  get isStopping(): boolean {
    return this.stopping !== undefined;
  }

  // ---- creation ------------------------------------------------------------------------------

  /**
   * Creates a job: picks and freezes its members, lays out its ranks, and has its backend make
   * the namespace known. Fails without side effects.
   */
  create(spec: JobSpec, waitMs = 0, wait: WaitOptions = {}): Promise<Readonly<Job>> {
    const now = this.o.clock.now();
    // A request that may wait also waits (within that) for members still joining the pool, and
    // for workers that left the cluster and are expected back (within its wiring timeout).
    const poolUntil = waitMs > 0 && spec.poolJoinMs ? now + Math.min(waitMs, spec.poolJoinMs) : 0;
    const wiringMs = (spec.wiringTimeoutSeconds ?? this.o.wiringTimeoutSeconds) * 1000;
    const windowMs = Number.isNaN(wiringMs) ? 0 : Math.max(wiringMs, 0);
    const backMs = waitMs > 0 ? Math.min(waitMs, windowMs) : 0;
    const req: JobRequest = {
      started: now,
      poolUntil,
      windowMs,
      backUntil: backMs > 0 ? now + backMs : 0,
      backBound: windowMs <= waitMs ? "the job's wiring timeout" : "the request's wait",
      waitedFor: 0,
      waitedForIds: new Set(),
    };
    return this.admission.run(() => this.createNow(spec, req), waitMs, wait).finally(() => req.timer?.cancel());
  }

  /** Requests waiting for members or a job slot. */
  get waiting(): number {
    return this.admission.waiting;
  }

  private async createNow(spec: JobSpec, req: JobRequest): Promise<Readonly<Job>> {
    if (this.stopping !== undefined) throw new RmError('unavailable', `the sidecar is stopping: ${this.stopping}`);
    const backend = this.o.backendFor(spec.impl);
    if (!backend) {
      throw new RmError(
        'unprocessable',
        `this sidecar cannot serve ${spec.impl} jobs (it serves ${this.o.impls().join(', ') || 'none'})`,
      );
    }
    const wiring = spec.wiringTimeoutSeconds ?? this.o.wiringTimeoutSeconds;
    if (!(wiring > 0)) throw new RmError('bad_request', 'wiringTimeoutSeconds must be positive');
    if ((spec.timeoutSeconds ?? 0) < 0) throw new RmError('bad_request', 'timeoutSeconds must not be negative');
    const { workers, pset } = this.chooseMembers(spec, req);
    this.o.policy.admit({ activeJobs: this.active().length + this.creating, size: workers.length });

    let id = this.o.newJobId?.() ?? `j${this.idPrefix}-${++this.jobCounter}`;
    // Restored history may hold an id this run's counter would reuse.
    while (!this.o.newJobId && this.jobs.has(id)) id = `j${this.idPrefix}-${++this.jobCounter}`;
    if (this.jobs.has(id)) throw new RmError('conflict', `job id '${id}' is taken`);
    const plan = spec.mode === 'inprocess' ? this.planInprocess(workers, spec.impl) : undefined;
    if (plan && 'reason' in plan) this.cannotRunInprocess(spec, plan, req.poolUntil);
    const inprocess = plan !== undefined && !('reason' in plan);
    const worlds = inprocess && spec.impl !== 'openmpi';
    // A fork job's namespace carries 128 random bits: a PMIx rank is admitted by its namespace and
    // rank (and its uid), so the namespace is its credential, as PMI_ID is a PMI rank's, and a job
    // id that anyone may read does not give it away.
    const namespace =
      plan && !('reason' in plan) && !worlds
        ? plan.namespace
        : (this.o.namespaceOf?.(id) ?? `dask-pmix.${id}.${randomBytes(16).toString('hex')}`);
    const members = layoutMembers(workers);
    if (inprocess && !worlds) {
      for (const [i, m] of members.entries()) m.poolRank = workers[i]!.pool!.rank;
    }
    const job: Job = {
      id,
      impl: spec.impl,
      mode: inprocess ? 'inprocess' : 'fork',
      namespace,
      tag: `dask-pmix:${id}`,
      members,
      state: 'pending',
      createdAt: this.now(),
      wiringTimeoutSeconds: wiring,
      timeoutSeconds: spec.timeoutSeconds ?? 0,
      labels: { ...(spec.labels ?? {}) },
    };
    if (pset) job.pset = pset.name;
    if (spec.owner) job.owner = spec.owner;
    if (plan && 'reason' in plan) job.modeReason = plan.reason;
    const jobBackend = inprocess ? this.poolJobs : backend;

    // Reserve synchronously, so that a concurrent request cannot pick the same workers while
    // the backend works; undone if the backend refuses.
    const pool = this.o.workers;
    for (const w of workers) pool.setJob(w.id, id);
    if (pset) pset.jobId = id;
    const undo = () => {
      for (const w of workers) if (pool.get(w.id)?.jobId === id) pool.setJob(w.id, undefined);
      if (pset && pset.jobId === id) delete pset.jobId;
    };
    this.creating++;
    try {
      await jobBackend.prepare(job, new Map(workers.map((w) => [w.id, w])));
    } catch (err) {
      undo();
      throw new RmError(
        'unavailable',
        `the ${job.impl} backend could not prepare the job: ${err instanceof Error ? err.message : String(err)}`,
      );
    } finally {
      this.creating--;
    }
    const gone = workers.find((w) => pool.get(w.id)?.jobId !== id);
    if (this.stopping !== undefined || gone) {
      // The sidecar began to stop, or a member left, while the backend worked.
      undo();
      await jobBackend.release(job).catch((e: unknown) => this.o.onError?.('release', e));
      throw gone
        ? new RmError('conflict', `worker '${gone.id}' left while the job was being created`)
        : new RmError('unavailable', `the sidecar is stopping: ${this.stopping}`);
    }

    const rt: JobRuntime = {
      job,
      backend: jobBackend,
      collectives: new Collectives(job.members.length, this.o.clock, this.o.collectiveTimeoutMs, this.o.onCollective),
      kv: new KvStore(this.o.clock),
      timers: [],
    };
    this.jobs.set(id, rt);
    if (inprocess) {
      rt.joined = deferred();
      if (worlds) rt.ports = job.members.map(() => undefined);
      this.byTag.set(job.tag, rt);
    } else {
      this.byNamespace.set(namespace, rt);
    }
    this.created++;
    rt.timers.push(this.o.clock.setTimer(wiring * 1000, () => this.wiringExpired(rt)));
    for (const w of workers)
      this.o.events.emit({ kind: 'workerStateChanged', workerId: w.id, from: 'available', to: 'frozen', jobId: id });
    this.emitJob(rt, undefined, 'created');
    return job;
  }

  private chooseMembers(spec: JobSpec, req: JobRequest): { workers: Worker[]; pset?: ProcessSet } {
    const given = (spec.pset ? 1 : 0) + (spec.members?.length ? 1 : 0) + (spec.selector ? 1 : 0);
    if (given !== 1)
      throw new RmError('bad_request', 'a job needs exactly one of pset, members (a non-empty list) or selector');
    const take = (ids: string[], what: string): Worker[] =>
      ids.map((id) => {
        const w = this.o.workers.get(id);
        if (!w) {
          // A worker named by its id comes back under it only when its address is fixed.
          if (this.o.returning?.has(id, req.windowMs)) {
            req.waitedForIds.add(id);
            this.waitForReturning(req, new RmError('unprocessable', `${what} '${id}' is not a registered worker`), 1);
          }
          // What ended the wait for it: a worker of its host registered under another address.
          const e = req.waitedForIds.has(id)
            ? new RmError(
                'unprocessable',
                `${what} '${id}' left the cluster and came back under another address, as a restarted worker ` +
                  'usually does: name the workers there are now, or ask for a number of members',
              )
            : new RmError('unprocessable', `${what} '${id}' is not a registered worker`);
          throw this.afterWaiting(req, e);
        }
        if (w.state !== 'available') throw new RmError('conflict', `worker '${id}' is already in job ${w.jobId}`);
        return w;
      });
    if (spec.members?.length) {
      assertDistinct(spec.members);
      return { workers: take(spec.members, 'member') };
    }
    if (spec.pset) {
      const p = this.o.psets.get(spec.pset);
      if (!p) throw new RmError('unprocessable', `no pset '${spec.pset}'`);
      if (p.gone?.length) {
        const e = new RmError(
          'unprocessable',
          `pset '${p.name}' names worker${p.gone.length > 1 ? 's' : ''} ${p.gone.join(', ')}, which left the ` +
            `cluster: redefine it (PUT /v1/psets/${p.name}) with the workers there are now`,
        );
        if (p.gone.every((id) => this.o.returning?.has(id, req.windowMs))) this.waitForReturning(req, e, p.gone.length);
        throw this.afterWaiting(req, e);
      }
      if (p.jobId) throw new RmError('conflict', `pset '${spec.pset}' is used by active job ${p.jobId}`);
      return { workers: take(p.members, `member of pset '${p.name}'`), pset: p };
    }
    const available = this.o.workers.list().filter((w) => w.state === 'available');
    const pool = this.o.pool()?.pool;
    const worlds = spec.impl !== 'openmpi' ? this.o.worlds?.() : undefined;
    if (spec.mode === 'inprocess' && (worlds || (pool && spec.impl === 'openmpi'))) {
      // Prefer workers that can run the job in-process (Open MPI: all in one epoch).
      const pooled = worlds
        ? worlds.candidates(available, spec.impl)
        : pool!.inprocessCandidates(available.filter((w) => !Worlds.isWorld(w.pool)));
      if (pooled.length >= spec.selector!.count) {
        try {
          return { workers: this.o.policy.select(spec.selector!, pooled) };
        } catch {
          // The selector needs others too: the job may still run, in fork mode.
        }
      }
    }
    try {
      return { workers: this.o.policy.select(spec.selector!, available) };
    } catch (e) {
      if (!(e instanceof RmError && e.kind === 'unprocessable')) throw e;
      // Enough matching workers exist, only some are in jobs now: the request may wait for them.
      if (this.couldSelectLater(spec.selector!))
        throw new RmError('conflict', `${e.message}; the others it could use are in jobs now`);
      // Enough would, with workers that left recently and are coming back: it may wait for those.
      const back = (this.o.returning?.within(req.windowMs) ?? [])
        .map((d) => d.worker)
        .filter((w) => this.couldSelectLater({ ...spec.selector!, count: 1 }, [w], false));
      if (back.length && this.couldSelectLater(spec.selector!, back)) this.waitForReturning(req, e, back.length);
      throw this.afterWaiting(req, e);
    }
  }

  /**
   * The request is short of workers by no more than `back` that left the cluster recently and are
   * expected back (returning.ts): while it may wait (until req.backUntil) it waits for them, woken
   * as workers join; after that, or if it may not wait at all, it fails saying so.
   */
  private waitForReturning(req: JobRequest, e: RmError, back: number): never {
    const now = this.o.clock.now();
    req.waitedFor = Math.max(req.waitedFor, back);
    const them = back === 1 ? '1 worker that left the cluster is' : `${back} workers that left the cluster are`;
    const why = `expected back (${back === 1 ? 'its nanny restarts it' : 'their nannies restart them'}, or dask-pmix replaces ${back === 1 ? 'it' : 'them'})`;
    if (now < req.backUntil) {
      req.timer ??= this.o.clock.setTimer(req.backUntil - now, () => this.admission.wake());
      const bound = ((req.backUntil - req.started) / 1000).toFixed(1);
      throw new BusyUntil(
        `${e.message}; ${them} ${why}: the job waits for them, for up to ${bound} s (${req.backBound})`,
        () => this.backTimedOut(req, e, back),
      );
    }
    if (!req.backUntil)
      throw new RmError(
        'unprocessable',
        `${e.message}; ${them} ${why}, but this request may not wait (POST /v1/jobs?wait=<s>)`,
      );
    throw this.backTimedOut(req, e, back);
  }

  private backTimedOut(req: JobRequest, e: RmError, missing: number): RmError {
    const s = ((this.o.clock.now() - req.started) / 1000).toFixed(1);
    const n = req.waitedFor;
    return new RmError(
      'unprocessable',
      `${e.message}; waited ${s} s (${req.backBound}) for ${n} worker${n === 1 ? '' : 's'} expected back ` +
        `(restarted by ${n === 1 ? 'its nanny' : 'their nannies'} or replaced by dask-pmix), and ${missing} did not return`,
    );
  }

  /** The request's final error: it names the wait for workers expected back, if it waited. */
  private afterWaiting(req: JobRequest, e: RmError): RmError {
    if (!req.waitedFor) return e;
    const s = ((this.o.clock.now() - req.started) / 1000).toFixed(1);
    const n = req.waitedFor;
    return new RmError(
      e.kind,
      `${e.message} (after waiting ${s} s for ${n} worker${n === 1 ? '' : 's'} expected back)`,
    );
  }

  /**
   * An in-process job whose members cannot all run in-process: it waits while only members still
   * joining the pool stand in the way (until `poolUntil`), fails if it asked for in-process only,
   * and otherwise runs in fork mode with the reason.
   */
  private cannotRunInprocess(spec: JobSpec, plan: { reason: string; pending?: boolean }, poolUntil: number): void {
    const now = this.o.clock.now();
    if (plan.pending && now < poolUntil) {
      // Tried again when a worker's pool seat changes, and at the deadline whatever happens.
      this.o.clock.setTimer(poolUntil - now, () => this.admission.wake());
      throw new RmError('conflict', `${plan.reason}; the job waits for it to join`);
    }
    if (spec.strictMode) {
      const waited = plan.pending && poolUntil ? ` (after waiting for it to join the pool)` : '';
      throw new RmError('unprocessable', `the job asked to run in-process, but ${plan.reason}${waited}`);
    }
  }

  /** Whether the job can run in-process over these workers, or why not. */
  private planInprocess(workers: readonly Worker[], impl: Impl): PoolPlan {
    if (impl === 'openmpi') {
      const inPool = this.o.pool()?.pool;
      if (!inPool) return { reason: 'this sidecar has no in-process pool' };
      const other = workers.find((w) => Worlds.isWorld(w.pool));
      if (other) return { reason: `worker '${other.id}' runs ${other.pool!.impl}, not in the Open MPI pool` };
      return inPool.plan(workers, impl);
    }
    const worlds = this.o.worlds?.();
    if (!worlds?.impls.includes(impl)) return { reason: `this sidecar has no in-process seats for ${impl}` };
    return worlds.plan(workers, impl);
  }

  /** Whether the selector could pick from every registered worker (as if free) and `more`. */
  private couldSelectLater(
    sel: JobSpec['selector'] & object,
    more: readonly Worker[] = [],
    registered = true,
  ): boolean {
    try {
      this.o.policy.select(sel, [
        ...(registered ? this.o.workers.list().map((w) => ({ ...w, state: 'available' as const })) : []),
        ...more,
      ]);
      return true;
    } catch {
      return false;
    }
  }

  // ---- queries and requests from REST --------------------------------------------------------

  get(id: string): Readonly<Job> {
    return this.require(id).job;
  }

  list(): readonly Readonly<Job>[] {
    return [...this.jobs.values()].map((rt) => rt.job);
  }

  active(): readonly Readonly<Job>[] {
    return this.list().filter((j) => isActive(j.state));
  }

  /** The active job `workerId` is a member of, with its member record. */
  activeMembership(workerId: string, jobId: string): { job: Readonly<Job>; member: Readonly<JobMember> } | undefined {
    const rt = this.jobs.get(jobId);
    const member = rt?.job.members.find((x) => x.workerId === workerId);
    return rt && member && isActive(rt.job.state) ? { job: rt.job, member } : undefined;
  }

  /** DELETE: aborts the job if it is active, releases it at once and forgets it. */
  async delete(id: string, reason = 'deleted over REST'): Promise<Readonly<Job>> {
    const rt = this.require(id);
    this.end(rt, 'aborted', reason);
    await this.release(rt);
    if (this.jobs.get(id) === rt) this.forget(rt);
    return rt.job;
  }

  /** The complete protocol environment `workerId` must set to join job `jobId` as its rank. */
  memberEnv(
    jobId: string,
    workerId: string,
  ): { job: Readonly<Job>; member: Readonly<JobMember>; env: Record<string, string> } {
    const rt = this.require(jobId);
    const member = rt.job.members.find((m) => m.workerId === workerId);
    if (!member) throw new RmError('not_found', `worker '${workerId}' is not a member of job ${jobId}`);
    if (!isActive(rt.job.state))
      throw new RmError('conflict', `job ${jobId} is ${rt.job.state}${rt.job.error ? `: ${rt.job.error}` : ''}`);
    if (member.state !== 'assigned')
      throw new RmError('conflict', `rank ${member.rank} of job ${jobId} is already ${member.state}`);
    const worker = this.o.workers.get(workerId);
    if (!worker) throw new RmError('conflict', `worker '${workerId}' has left`);
    return { job: rt.job, member, env: rt.backend.memberEnv(rt.job, member, worker) };
  }

  /** A member's process died, as its worker saw it (the protocol may not notice at once). */
  reportMemberLost(jobId: string, workerId: string, reason: string): Readonly<Job> {
    const rt = this.require(jobId);
    const member = rt.job.members.find((m) => m.workerId === workerId);
    if (!member) throw new RmError('not_found', `worker '${workerId}' is not a member of job ${jobId}`);
    this.loseMember(rt, member, reason);
    return rt.job;
  }

  /** The member of `jobId` on `workerId` is gone (its worker left, or its process died). */
  memberGone(jobId: string, workerId: string, reason: string): void {
    const rt = this.jobs.get(jobId);
    const m = rt?.job.members.find((x) => x.workerId === workerId);
    if (rt && m) this.loseMember(rt, m, reason);
  }

  private require(id: string): JobRuntime {
    const rt = this.jobs.get(id);
    if (!rt) throw new RmError('not_found', `no job '${id}'`);
    return rt;
  }

  // ---- the protocol side: what PMIx and PMI servers report and ask -------------------------

  /** The job and member behind a protocol's (namespace, rank); throws not_found. */
  findMember(namespace: string, rank: number): { job: Readonly<Job>; member: Readonly<JobMember> } {
    const rt = this.runtimeOf(namespace);
    const member = rt.job.members[rank];
    if (!member) throw new RmError('not_found', `job ${rt.job.id} has no rank ${rank} (size ${rt.job.members.length})`);
    return { job: rt.job, member };
  }

  /** The job of a namespace / kvsname, if it is still known. */
  byNamespaceOf(namespace: string): Readonly<Job> | undefined {
    return this.byNamespace.get(namespace)?.job;
  }

  /** A member's MPI library reached the process manager. Throws if its job is over. */
  memberConnected(namespace: string, rank: number): void {
    const rt = this.runtimeOf(namespace);
    const m = this.memberOf(rt, rank);
    if (!isActive(rt.job.state)) throw new RmError('aborted', `job ${rt.job.id} is ${rt.job.state}`);
    if (m.state === 'connected') return;
    if (m.state !== 'assigned') throw new RmError('conflict', `rank ${rank} of job ${rt.job.id} is ${m.state}`);
    this.setMember(rt, m, 'connected');
    if (rt.job.state === 'pending') this.transition(rt, 'wiring', `rank ${rank} connected`);
    if (!rt.finalizedWiring && rt.job.members.every((x) => x.state === 'connected' || x.state === 'finalized'))
      this.started(rt, 'every member connected');
  }

  private started(rt: JobRuntime, reason: string): void {
    rt.job.startedAt = this.now();
    this.transition(rt, 'running', reason);
    if (rt.job.timeoutSeconds > 0) {
      rt.timers.push(
        this.o.clock.setTimer(rt.job.timeoutSeconds * 1000, () =>
          this.end(rt, 'failed', `job timeout: still running after ${rt.job.timeoutSeconds} s`),
        ),
      );
    }
  }

  /** A member finalized cleanly. The job completes when every member has. */
  memberFinalized(namespace: string, rank: number): void {
    const rt = this.runtimeOf(namespace);
    this.finalize(rt, this.memberOf(rt, rank));
  }

  private finalize(rt: JobRuntime, m: JobMember): void {
    if (m.state === 'finalized' || m.state === 'lost') return;
    if (rt.job.state === 'pending' || rt.job.state === 'wiring') (rt.finalizedWiring ??= []).push(m.rank);
    this.setMember(rt, m, 'finalized');
    this.o.names.procEnded(rt.job.id, m.rank);
    rt.collectives.markGone(m.rank, 'has finalized');
    if (isActive(rt.job.state) && rt.job.members.every((x) => x.state === 'finalized')) {
      this.end(rt, 'completed', 'every member finalized');
    } else if (!isActive(rt.job.state)) {
      this.releaseIfLeft(rt);
    }
  }

  /** A member's process went away without finalizing (connection lost, killed). */
  memberLost(namespace: string, rank: number, reason: string): void {
    const rt = this.runtimeOf(namespace);
    this.loseMember(rt, this.memberOf(rt, rank), reason);
  }

  /** A member called MPI_Abort / PMIx_Abort / PMI abort: the whole job is aborted. */
  abort(namespace: string, rank: number, status: number, message: string): void {
    const rt = this.runtimeOf(namespace);
    this.abortBy(rt, this.memberOf(rt, rank), status, message);
  }

  private abortBy(rt: JobRuntime, m: JobMember, status: number, message: string): void {
    if (isActive(rt.job.state)) m.endedJob = true;
    this.end(rt, 'aborted', `rank ${m.rank} aborted the job with status ${status}${message ? `: ${message}` : ''}`);
  }

  // ---- in-process jobs ------------------------------------------------------------------------

  private inprocessJob(jobId: string): { rt: JobRuntime } {
    const rt = this.require(jobId);
    if (rt.job.mode !== 'inprocess')
      throw new RmError('conflict', `job ${jobId} runs in ${rt.job.mode} mode, not in-process`);
    return { rt };
  }

  private inprocessMember(jobId: string, workerId: string): { rt: JobRuntime; m: JobMember } {
    const { rt } = this.inprocessJob(jobId);
    const m = rt.job.members.find((x) => x.workerId === workerId);
    if (!m) throw new RmError('not_found', `worker '${workerId}' is not a member of job ${jobId}`);
    return { rt, m };
  }

  /**
   * A member of an in-process job is there (its task runs, its session is up). Resolves with
   * ready=true once every member is, or ready=false after `waitMs` (ask again); rejects once the
   * job has ended.
   */
  async join(
    jobId: string,
    workerId: string,
    waitMs: number,
    ports?: Readonly<Record<string, string>>,
  ): Promise<{ job: Readonly<Job>; ready: boolean; ports?: Record<string, string>[] }> {
    const { rt, m } = this.inprocessMember(jobId, workerId);
    if (!isActive(rt.job.state))
      throw new RmError('aborted', `job ${jobId} is ${rt.job.state}${rt.job.error ? `: ${rt.job.error}` : ''}`);
    if (rt.ports) this.takePorts(rt, m, ports);
    if (m.state === 'assigned') {
      this.setMember(rt, m, 'connected');
      if (rt.job.state === 'pending') this.transition(rt, 'wiring', `rank ${m.rank} joined`);
      if (rt.job.members.every((x) => x.state === 'connected')) {
        rt.joined!.resolve();
        // Worlds build the communicator among themselves: the server sees nothing more of it.
        if (rt.ports) this.started(rt, 'every member joined with its ports');
      }
    } else if (m.state !== 'connected') {
      throw new RmError('conflict', `rank ${m.rank} of job ${jobId} is already ${m.state}`);
    }
    let timer: TimerHandle | undefined;
    const ready = await Promise.race([
      rt.joined!.promise.then(() => true),
      new Promise<boolean>((resolve) => (timer = this.o.clock.setTimer(waitMs, () => resolve(false)))),
    ]).finally(() => timer?.cancel());
    return ready && rt.ports ? { job: rt.job, ready, ports: rt.ports.map((p) => ({ ...p })) } : { job: rt.job, ready };
  }

  /** A world member's ports: exactly one for each merge step it accepts at (merge-tree.ts). */
  private takePorts(rt: JobRuntime, m: JobMember, ports: Readonly<Record<string, string>> | undefined): void {
    const want = acceptSteps(m.rank, rt.job.members.length).map(String);
    const got = Object.keys(ports ?? {});
    if (got.length !== want.length || !want.every((k) => got.includes(k))) {
      throw new RmError(
        'bad_request',
        `rank ${m.rank} of ${rt.job.members.length} accepts at merge steps [${want.join(',')}] and must bring one port for each, not [${got.join(',')}]`,
      );
    }
    for (const [k, v] of Object.entries(ports ?? {})) {
      if (typeof v !== 'string' || v.length === 0 || v.length > MAX_PORT_NAME)
        throw new RmError('bad_request', `the port for merge step ${k} must be 1-${MAX_PORT_NAME} characters`);
    }
    const had = rt.ports![m.rank];
    if (had && JSON.stringify(had) !== JSON.stringify(ports ?? {}))
      throw new RmError('conflict', `rank ${m.rank} of job ${rt.job.id} joined already with other ports`);
    rt.ports![m.rank] = { ...(ports ?? {}) };
  }

  /**
   * A group was constructed over ranks of a pool (MPI_Comm_create_from_group). When its name is
   * an in-process job's tag, the job's communicator exists: the job runs. Other groups (the
   * communicators a job builds for itself) change nothing.
   */
  groupConstructed(namespace: string, group: string, ranks: readonly number[]): void {
    // Open MPI names the PMIx group of MPI_Comm_create_from_group(tag) "<tag>-[[job,vpid],rank].<n>".
    const cut = group.lastIndexOf('-[[');
    const rt = this.byTag.get(group) ?? (cut > 0 ? this.byTag.get(group.slice(0, cut)) : undefined);
    if (!rt || rt.job.namespace !== namespace) return;
    const want = rt.job.members
      .map((m) => m.poolRank)
      .sort((a, b) => a! - b!)
      .join(',');
    const got = [...ranks].sort((a, b) => a - b).join(',');
    if (want !== got)
      throw new RmError('bad_request', `group '${group}' has pool ranks ${got}, but job ${rt.job.id} has ${want}`);
    if (!isActive(rt.job.state))
      throw new RmError('aborted', `job ${rt.job.id} is ${rt.job.state}${rt.job.error ? `: ${rt.job.error}` : ''}`);
    if (rt.job.state === 'running') return;
    for (const m of rt.job.members) if (m.state === 'assigned') this.setMember(rt, m, 'connected');
    rt.joined?.resolve();
    this.started(rt, 'the communicator was built');
  }

  /**
   * Every member of in-process job `jobId` is there (they met at the scheduler's join barrier)
   * and derives its communicator from the one they kept since job `from`, over the same members
   * or more (MPI_Comm_dup or MPI_Comm_create_group, which the server does not see, in place of a
   * group construct): the job runs.
   */
  reused(jobId: string, from: string): Readonly<Job> {
    const { rt } = this.inprocessJob(jobId);
    if (rt.ports) throw new RmError('conflict', `job ${jobId} is a job of MPI worlds: it runs once its members joined`);
    if (!isActive(rt.job.state))
      throw new RmError('aborted', `job ${jobId} is ${rt.job.state}${rt.job.error ? `: ${rt.job.error}` : ''}`);
    if (rt.job.state === 'running') return rt.job;
    for (const m of rt.job.members) if (m.state === 'assigned') this.setMember(rt, m, 'connected');
    rt.joined?.resolve();
    this.started(rt, `its members derive their communicator from the one kept since job ${from}`);
    return rt.job;
  }

  /**
   * A member of an in-process job is done: its function returned (ok) or failed (reason). A
   * member whose MPI library saw other members fail (failedRanks) often says so before the
   * server notices their death: the failed ones are blamed, not it.
   */
  leave(
    jobId: string,
    workerId: string,
    ok: boolean,
    reason: string,
    failedRanks: readonly number[] = [],
  ): Readonly<Job> {
    const { rt, m } = this.inprocessMember(jobId, workerId);
    if (ok) {
      this.finalize(rt, m);
      return rt.job;
    }
    for (const r of failedRanks) {
      const peer = rt.job.members[r];
      if (peer && peer !== m)
        this.loseMember(rt, peer, `rank ${m.rank} (worker ${m.workerId}) saw its process fail: ${reason}`);
    }
    this.loseMember(rt, m, reason);
    return rt.job;
  }

  /**
   * Every member of in-process job `jobId` has returned from its function (the scheduler saw each
   * rank's task finish): they all leave it at once, as if each had said so.
   */
  complete(jobId: string): Readonly<Job> {
    const { rt } = this.inprocessJob(jobId);
    for (const m of rt.job.members) this.finalize(rt, m);
    return rt.job;
  }

  /** The member of job `jobId` on `workerId` aborted (MPI_Abort from its worker's pool rank). */
  abortFrom(jobId: string, workerId: string, status: number, message: string): void {
    const rt = this.jobs.get(jobId);
    const m = rt?.job.members.find((x) => x.workerId === workerId);
    if (rt && m) this.abortBy(rt, m, status, message);
  }

  /** Joins a collective of the job (fence, barrier, kvs-fence, group construct). */
  collective(namespace: string, req: JoinRequest): Promise<CollectiveResult> {
    try {
      return this.runtimeOf(namespace).collectives.join(req);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Hands a collective of the job over to a delegate (collectives.ts CollectiveDelegate). */
  delegateCollective(namespace: string, name: string, delegate: CollectiveDelegate): DelegatedCollective {
    return this.runtimeOf(namespace).collectives.delegate(name, delegate);
  }

  /** The job's key-value space (PMI put/get, kvs-put/kvs-get, node attributes). */
  kv(namespace: string): KvStore {
    return this.runtimeOf(namespace).kv;
  }

  private runtimeOf(namespace: string): JobRuntime {
    const rt = this.byNamespace.get(namespace);
    if (!rt) throw new RmError('not_found', `no job with namespace '${namespace}'`);
    return rt;
  }

  private memberOf(rt: JobRuntime, rank: number): JobMember {
    const m = rt.job.members[rank];
    if (!m) throw new RmError('not_found', `job ${rt.job.id} has no rank ${rank} (size ${rt.job.members.length})`);
    return m;
  }

  private loseMember(rt: JobRuntime, m: JobMember, reason: string): void {
    if (m.state === 'finalized' || m.state === 'lost') return;
    m.reason = reason;
    this.setMember(rt, m, 'lost', reason);
    this.o.names.procEnded(rt.job.id, m.rank);
    rt.collectives.markGone(m.rank, `was lost (${reason})`);
    if (isActive(rt.job.state)) {
      if (this.o.policy.onMemberLost(rt.job, m) === 'fail') {
        m.endedJob = true;
        this.end(rt, 'failed', `rank ${m.rank} (worker ${m.workerId}) was lost: ${reason}`);
      }
    } else {
      this.releaseIfLeft(rt);
    }
  }

  // ---- state machine -------------------------------------------------------------------------

  private setMember(rt: JobRuntime, m: JobMember, to: MemberState, reason?: string): void {
    const from = m.state;
    m.state = to;
    const e = { kind: 'memberStateChanged' as const, jobId: rt.job.id, workerId: m.workerId, rank: m.rank, from, to };
    this.o.events.emit(reason ? { ...e, reason } : e);
  }

  private transition(rt: JobRuntime, to: JobState, reason: string): void {
    const from = rt.job.state;
    rt.job.state = to;
    this.emitJob(rt, from, reason);
  }

  private emitJob(rt: JobRuntime, from: JobState | undefined, reason: string): void {
    const e = {
      kind: 'jobStateChanged' as const,
      jobId: rt.job.id,
      to: rt.job.state,
      reason,
      job: structuredClone(rt.job),
    };
    this.o.events.emit(from ? { ...e, from } : e);
  }

  private wiringExpired(rt: JobRuntime): void {
    if (rt.job.state !== 'pending' && rt.job.state !== 'wiring') return;
    const missing = rt.job.members.filter((m) => m.state === 'assigned').map((m) => m.rank);
    const early = rt.finalizedWiring ?? [];
    const s = (n: number) => (n === 1 ? '' : 's');
    const why = [
      ...(missing.length ? [`rank${s(missing.length)} ${missing.join(',')} did not connect`] : []),
      ...(early.length
        ? [`rank${s(early.length)} ${early.join(',')} finalized before every member had connected`]
        : []),
    ];
    this.end(rt, 'failed', `wiring timeout: ${why.join('; ')} within ${rt.job.wiringTimeoutSeconds} s`);
  }

  /** Ends an active job; a job that already ended stays as it is. */
  private end(rt: JobRuntime, to: 'completed' | 'failed' | 'aborted', reason: string): void {
    const job = rt.job;
    if (!isActive(job.state)) return;
    for (const t of rt.timers.splice(0)) t.cancel();
    job.endedAt = this.now();
    if (to !== 'completed') job.error = reason;
    rt.collectives.close(`job ${job.id} ${to}: ${reason}`);
    rt.joined?.reject(new RmError('aborted', `job ${job.id} ${to}: ${reason}`));
    rt.kv.close(`job ${job.id} ${to}: ${reason}`);
    this.o.names.jobEnded(job.id, `job ${job.id} ${to}: ${reason}`);
    this.transition(rt, to, reason);
    if (to !== 'completed') {
      rt.notified = rt.backend.notifyEnded(job).catch((e: unknown) => this.o.onError?.('notifyEnded', e));
    }
    if (!this.releaseIfLeft(rt)) {
      rt.timers.push(this.o.clock.setTimer(this.o.policy.releaseGraceMs, () => void this.release(rt)));
    }
  }

  /** Releases the ended job if none of its members is still connected; true if it did. */
  private releaseIfLeft(rt: JobRuntime): boolean {
    if (isActive(rt.job.state) || rt.job.members.some((m) => m.state === 'connected')) return false;
    void this.release(rt);
    return true;
  }

  /** Tears the job down once: backend first, then the workers are free again. */
  private release(rt: JobRuntime): Promise<void> {
    rt.releasing ??= (async () => {
      for (const t of rt.timers.splice(0)) t.cancel();
      await rt.notified;
      try {
        await rt.backend.release(rt.job);
      } catch (e) {
        this.o.onError?.('release', e);
      }
      this.o.names.jobReleased(rt.job.id);
      rt.job.releasedAt = this.now();
      for (const m of rt.job.members) {
        if (this.o.workers.get(m.workerId)?.jobId !== rt.job.id) continue;
        this.o.workers.setJob(m.workerId, undefined);
        this.o.events.emit({
          kind: 'workerStateChanged',
          workerId: m.workerId,
          from: 'frozen',
          to: 'available',
          jobId: rt.job.id,
        });
      }
      const p = rt.job.pset ? this.o.psets.get(rt.job.pset) : undefined;
      if (p && p.jobId === rt.job.id) delete p.jobId;
      this.trimHistory();
    })();
    return rt.releasing;
  }

  private trimHistory(): void {
    const released = [...this.jobs.values()].filter((rt) => rt.job.releasedAt);
    for (const rt of released.slice(0, Math.max(0, released.length - this.o.historySize))) this.forget(rt);
  }

  private forget(rt: JobRuntime): void {
    this.o.onForgotten?.(rt.job);
    this.jobs.delete(rt.job.id);
    if (this.byNamespace.get(rt.job.namespace) === rt) this.byNamespace.delete(rt.job.namespace);
    if (this.byTag.get(rt.job.tag) === rt) this.byTag.delete(rt.job.tag);
  }

  /**
   * Takes back the record of a job from an earlier run of the sidecar, as history: released, and
   * failed if it was still active (nothing serves its namespace any more).
   */
  restore(job: Job, reason: string): void {
    if (this.jobs.has(job.id)) return;
    const now = this.now();
    if (isActive(job.state)) {
      job.state = 'failed';
      job.error = reason;
      job.endedAt = now;
      for (const m of job.members) {
        if (m.state === 'assigned' || m.state === 'connected') Object.assign(m, { state: 'lost', reason });
      }
    }
    job.releasedAt ||= now;
    this.jobs.set(job.id, {
      job,
      backend: this.poolJobs,
      collectives: new Collectives(job.members.length, this.o.clock, 0),
      kv: new KvStore(this.o.clock),
      timers: [],
      releasing: Promise.resolve(),
    });
    this.trimHistory();
  }

  /** Waits until the job is released (for tests and shutdown). */
  async released(id: string): Promise<void> {
    const rt = this.require(id);
    if (isActive(rt.job.state)) throw new RmError('conflict', `job ${id} is still ${rt.job.state}`);
    await (rt.releasing ?? this.release(rt));
  }

  /** Refuses new jobs, aborts the active ones (their members are told) and releases every job. */
  async shutdown(reason: string): Promise<void> {
    this.admission.close(reason);
    this.stopping ??= reason;
    for (const rt of this.jobs.values()) this.end(rt, 'aborted', reason);
    await Promise.all([...this.jobs.values()].map((rt) => this.release(rt)));
  }

  /** Jobs by state, for /metrics. */
  countByState(): Record<JobState, number> {
    const jobs: Record<JobState, number> = { pending: 0, wiring: 0, running: 0, completed: 0, failed: 0, aborted: 0 };
    for (const rt of this.jobs.values()) jobs[rt.job.state]++;
    return jobs;
  }
}

export function assertDistinct(ids: readonly string[]): void {
  const seen = new Set<string>();
  for (const id of ids) {
    if (seen.has(id)) throw new RmError('bad_request', `worker '${id}' is listed twice`);
    seen.add(id);
  }
}
