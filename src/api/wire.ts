// Between the core's plain objects and the model of record (proto/dask_pmix.proto): responses
// are protobuf messages turned into their JSON mapping (or encoded, for binary event frames),
// so the REST JSON is exactly what the .proto says.
import { dask_pmix } from '../proto/dask_pmix.js';
import { isoTime } from '../rm/clock.js';
import type { SequencedEvent } from '../rm/events.js';
import type {
  DrainRequest,
  ElasticJob,
  Impl,
  Job,
  JobMode,
  JobSpec,
  JobState,
  MemberState,
  PoolSeat,
  ProcessSet,
  PsetSpec,
  Selector,
  Worker,
  WorkerSpec,
  WorkerState,
} from '../rm/types.js';

export const pb = dask_pmix.v1;

/** The protobuf JSON mapping, with every field present (rank 0 is not left out). */
const JSON_OPTIONS = { enums: String, longs: Number, defaults: true, json: true } as const;
/** Events also name the kind they carry (the oneof), as `kind`. */
const EVENT_OPTIONS = { ...JSON_OPTIONS, oneofs: true } as const;

type Json = Record<string, unknown>;

const enumValue = <E extends Record<string, string | number>>(
  e: E,
  name: string | undefined,
): E[keyof E] | undefined => (name === undefined ? undefined : (e[name as keyof E] as E[keyof E]));

function selectorMsg(s: Selector): dask_pmix.v1.Selector {
  return pb.Selector.create({
    count: s.count,
    placement: enumValue(pb.Placement, s.placement ?? 'pack')!,
    tags: s.tags ?? [],
    resources: s.resources ?? {},
    hosts: s.hosts ?? [],
  });
}

export function poolSeatMsg(p: Readonly<PoolSeat>): dask_pmix.v1.PoolSeat {
  return pb.PoolSeat.create({
    epoch: p.epoch,
    namespace: p.namespace,
    rank: p.rank,
    state: enumValue(pb.PoolRankState, p.state)!,
    reason: p.reason ?? '',
    localPeers: p.localPeers ?? [],
    ...(p.impl ? { impl: enumValue(pb.Impl, p.impl)! } : {}),
  });
}

export function workerMsg(w: Readonly<Worker>): dask_pmix.v1.Worker {
  const m = pb.Worker.create({
    id: w.id,
    address: w.address,
    host: w.host,
    pid: w.pid,
    resources: { ...w.resources },
    tags: [...w.tags],
    state: enumValue(pb.WorkerState, w.state)!,
    jobId: w.jobId ?? '',
    registeredAt: w.registeredAt,
  });
  if (w.uid !== undefined) m.uid = w.uid;
  if (w.gid !== undefined) m.gid = w.gid;
  if (w.pool) m.pool = poolSeatMsg(w.pool);
  return m;
}

export function psetMsg(p: Readonly<ProcessSet>): dask_pmix.v1.ProcessSet {
  const m = pb.ProcessSet.create({
    name: p.name,
    members: [...p.members],
    createdAt: p.createdAt,
    jobId: p.jobId ?? '',
    gone: [...(p.gone ?? [])],
  });
  if (p.selector) m.selector = selectorMsg(p.selector);
  return m;
}

export function jobMsg(j: Readonly<Job>): dask_pmix.v1.Job {
  return pb.Job.create({
    id: j.id,
    impl: enumValue(pb.Impl, j.impl)!,
    mode: enumValue(pb.JobMode, j.mode)!,
    namespace: j.namespace,
    members: j.members.map((m) => {
      const msg = pb.JobMember.create({
        workerId: m.workerId,
        rank: m.rank,
        host: m.host,
        localRank: m.localRank,
        nodeRank: m.nodeRank,
        nodeId: m.nodeId,
        state: enumValue(pb.MemberState, m.state)!,
        reason: m.reason ?? '',
        endedJob: m.endedJob ?? false,
      });
      if (m.poolRank !== undefined) msg.poolRank = m.poolRank;
      return msg;
    }),
    state: enumValue(pb.JobState, j.state)!,
    createdAt: j.createdAt,
    startedAt: j.startedAt ?? '',
    endedAt: j.endedAt ?? '',
    releasedAt: j.releasedAt ?? '',
    error: j.error ?? '',
    pset: j.pset ?? '',
    owner: j.owner ?? '',
    wiringTimeoutSeconds: j.wiringTimeoutSeconds,
    timeoutSeconds: j.timeoutSeconds,
    labels: { ...j.labels },
    modeReason: j.modeReason ?? '',
    tag: j.tag,
  });
}

function drainMsg(d: Readonly<DrainRequest>): dask_pmix.v1.DrainRequest {
  return pb.DrainRequest.create({
    workerId: d.workerId,
    reason: d.reason,
    state: enumValue(pb.DrainState, d.state)!,
    requestedAt: d.requestedAt,
    resolvedAt: d.resolvedAt ?? '',
    generation: d.generation ?? 0,
  });
}

function elasticMsg(e: Readonly<ElasticJob>): dask_pmix.v1.ElasticJob {
  return pb.ElasticJob.create({
    id: e.id,
    generations: e.generations.map((g) => ({
      generation: g.generation,
      jobId: g.jobId,
      workers: g.workers,
      change: g.change,
      state: enumValue(pb.JobState, g.state)!,
      createdAt: g.createdAt,
      endedAt: g.endedAt ?? '',
      error: g.error ?? '',
    })),
    drains: e.drains.map(drainMsg),
    state: e.state ? enumValue(pb.JobState, e.state)! : pb.JobState.JOB_STATE_UNSPECIFIED,
  });
}

export function eventMsg(e: SequencedEvent): dask_pmix.v1.Event {
  const ev = e.event;
  const base = { seq: e.seq, time: isoTime(e.time) };
  const ws = (s: WorkerState) => enumValue(pb.WorkerState, s)!;
  const js = (s: JobState | undefined) => (s ? enumValue(pb.JobState, s)! : pb.JobState.JOB_STATE_UNSPECIFIED);
  const ms = (s: MemberState) => enumValue(pb.MemberState, s)!;
  switch (ev.kind) {
    case 'workerJoined':
      return pb.Event.create({ ...base, workerJoined: { worker: workerMsg(ev.worker) } });
    case 'workerLeft':
      return pb.Event.create({ ...base, workerLeft: { workerId: ev.workerId, reason: ev.reason } });
    case 'workerStateChanged':
      return pb.Event.create({
        ...base,
        workerStateChanged: { workerId: ev.workerId, from: ws(ev.from), to: ws(ev.to), jobId: ev.jobId ?? '' },
      });
    case 'psetDefined':
      return pb.Event.create({ ...base, psetDefined: { pset: psetMsg(ev.pset) } });
    case 'psetDeleted':
      return pb.Event.create({ ...base, psetDeleted: { name: ev.name } });
    case 'jobStateChanged':
      return pb.Event.create({
        ...base,
        jobStateChanged: {
          jobId: ev.jobId,
          from: js(ev.from),
          to: js(ev.to),
          reason: ev.reason ?? '',
          job: jobMsg(ev.job),
        },
      });
    case 'workerPoolChanged':
      return pb.Event.create({ ...base, workerPoolChanged: { workerId: ev.workerId, pool: poolSeatMsg(ev.pool) } });
    case 'memberStateChanged':
      return pb.Event.create({
        ...base,
        memberStateChanged: {
          jobId: ev.jobId,
          workerId: ev.workerId,
          rank: ev.rank,
          from: ms(ev.from),
          to: ms(ev.to),
          reason: ev.reason ?? '',
        },
      });
    case 'healthChanged':
      return pb.Event.create({
        ...base,
        healthChanged: { status: ev.status, pmixStalledSeconds: ev.pmixStalledSeconds },
      });
    case 'drainChanged':
      return pb.Event.create({ ...base, drainChanged: { elasticId: ev.elasticId, drain: drainMsg(ev.drain) } });
  }
}

export const toJson = {
  worker: (w: Readonly<Worker>): Json => pb.Worker.toObject(workerMsg(w), JSON_OPTIONS),
  pset: (p: Readonly<ProcessSet>): Json => pb.ProcessSet.toObject(psetMsg(p), JSON_OPTIONS),
  job: (j: Readonly<Job>): Json => pb.Job.toObject(jobMsg(j), JSON_OPTIONS),
  event: (e: SequencedEvent): Json => pb.Event.toObject(eventMsg(e), EVENT_OPTIONS),
  elastic: (e: Readonly<ElasticJob>): Json => pb.ElasticJob.toObject(elasticMsg(e), JSON_OPTIONS),
  drain: (d: Readonly<DrainRequest>): Json => pb.DrainRequest.toObject(drainMsg(d), JSON_OPTIONS),
  poolEnv: (workerId: string, seat: Readonly<PoolSeat>, env: Record<string, string>, commSecret?: string): Json =>
    pb.PoolEnv.toObject(
      pb.PoolEnv.create({ workerId, pool: poolSeatMsg(seat), env, commSecret: commSecret ?? '' }),
      JSON_OPTIONS,
    ),
  joinJob: (r: { ready: boolean; job: Readonly<Job>; ports?: Record<string, string>[] }): Json =>
    pb.JoinJobResponse.toObject(
      pb.JoinJobResponse.create({
        ready: r.ready,
        job: jobMsg(r.job),
        ...(r.ports ? { ports: r.ports.map((ports) => ({ ports })) } : {}),
      }),
      JSON_OPTIONS,
    ),
  memberEnv: (m: {
    jobId: string;
    workerId: string;
    rank: number;
    size: number;
    impl: Impl;
    env: Record<string, string>;
  }): Json => pb.MemberEnv.toObject(pb.MemberEnv.create({ ...m, impl: enumValue(pb.Impl, m.impl)! }), JSON_OPTIONS),
  health: (h: {
    status: string;
    version: string;
    pmixVersion: string;
    uptimeSeconds: number;
    impls: Impl[];
    pmixStalledSeconds?: number;
  }): Json =>
    pb.Health.toObject(pb.Health.create({ ...h, impls: h.impls.map((i) => enumValue(pb.Impl, i)!) }), JSON_OPTIONS),
};

/** A job as a reader without the token sees it: without its namespace (a fork job's ranks' credential). */
export function withoutNamespace(j: Readonly<Job>): Json {
  const { namespace: _, ...rest } = toJson.job(j);
  return rest;
}

/** An event as a reader without the token sees it: a job it carries loses its namespace. */
export function eventWithoutNamespace(e: SequencedEvent): Json {
  const obj = toJson.event(e);
  const changed = obj.jobStateChanged as { job?: Json } | undefined;
  if (changed?.job) {
    const { namespace: _, ...job } = changed.job;
    return { ...obj, jobStateChanged: { ...changed, job } };
  }
  return obj;
}

// ---- requests: validated JSON (the schemas come from the same .proto) to the core's specs --

type SelectorJson = {
  count: number;
  placement?: string;
  tags?: string[];
  resources?: Record<string, number>;
  hosts?: string[];
};

function selectorSpec(s: SelectorJson): Selector {
  const out: Selector = { count: s.count };
  if (s.placement) out.placement = s.placement as Selector['placement'];
  if (s.tags?.length) out.tags = s.tags;
  if (s.resources && Object.keys(s.resources).length) out.resources = s.resources;
  if (s.hosts?.length) out.hosts = s.hosts;
  return out;
}

export function workerSpec(b: {
  id: string;
  host: string;
  address?: string;
  pid?: number;
  uid?: number;
  gid?: number;
  resources?: Record<string, number>;
  tags?: string[];
}): WorkerSpec {
  const s: WorkerSpec = { id: b.id, host: b.host };
  if (b.address) s.address = b.address;
  if (b.pid !== undefined) s.pid = b.pid;
  if (b.uid !== undefined) s.uid = b.uid;
  if (b.gid !== undefined) s.gid = b.gid;
  if (b.resources) s.resources = b.resources;
  if (b.tags) s.tags = b.tags;
  return s;
}

export function psetSpec(name: string, b: { members?: string[]; selector?: SelectorJson }): PsetSpec {
  const s: PsetSpec = { name };
  if (b.members?.length) s.members = b.members;
  if (b.selector) s.selector = selectorSpec(b.selector);
  return s;
}

export function jobSpec(b: {
  impl: string;
  mode?: string;
  pset?: string;
  members?: string[];
  selector?: SelectorJson;
  owner?: string;
  wiringTimeoutSeconds?: number;
  timeoutSeconds?: number;
  labels?: Record<string, string>;
  strictMode?: boolean;
  poolJoinSeconds?: number;
}): JobSpec {
  const s: JobSpec = { impl: b.impl as Impl };
  if (b.mode) s.mode = b.mode as JobMode;
  if (b.pset) s.pset = b.pset;
  if (b.members?.length) s.members = b.members;
  if (b.selector) s.selector = selectorSpec(b.selector);
  if (b.owner) s.owner = b.owner;
  if (b.wiringTimeoutSeconds) s.wiringTimeoutSeconds = b.wiringTimeoutSeconds;
  if (b.timeoutSeconds) s.timeoutSeconds = b.timeoutSeconds;
  if (b.labels) s.labels = b.labels;
  if (b.strictMode) s.strictMode = true;
  if (b.poolJoinSeconds) s.poolJoinMs = b.poolJoinSeconds * 1000;
  return s;
}
