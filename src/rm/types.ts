// The resource manager's domain: plain data, no behaviour. The names and states mirror
// proto/dask_pmix.proto (the model of record); src/api converts between the two.

export type Impl = 'openmpi' | 'mpich' | 'intelmpi';
export const IMPLS: readonly Impl[] = ['openmpi', 'mpich', 'intelmpi'];

export type WorkerState = 'available' | 'frozen' | 'gone';
export type JobState = 'pending' | 'wiring' | 'running' | 'completed' | 'failed' | 'aborted';
export type MemberState = 'assigned' | 'connected' | 'finalized' | 'lost';
export type Placement = 'pack' | 'spread';
/**
 * How a job runs: inside the worker processes themselves, as a communicator over their ranks in
 * the long-lived pool (inprocess), or in a child each worker starts for the job (fork).
 */
export type JobMode = 'inprocess' | 'fork';

/** A worker's rank in the in-process pool: assigned → joining (its session is initialising) → ready → retired. */
export type PoolRankState = 'assigned' | 'joining' | 'ready' | 'retired';

/** A worker's place in the in-process pool: one rank of a long-lived namespace, never reused. */
export interface PoolSeat {
  /** Pools are numbered; a new epoch (namespace) starts when the ranks of the last run out. */
  epoch: number;
  namespace: string;
  rank: number;
  state: PoolRankState;
  /** Why it was retired. */
  reason?: string;
  /**
   * The pool ranks declared on its node, itself included, when it is in a cohort (workers of one
   * host that joined together and share memory); absent when it is alone on its own node.
   */
  localPeers?: number[];
  /** Set for MPICH / Intel MPI: the seat is a world of its own, of size 1 (worlds.ts). */
  impl?: Impl;
}

export function isActive(state: JobState): boolean {
  return state === 'pending' || state === 'wiring' || state === 'running';
}

export interface Worker {
  id: string;
  address: string;
  host: string;
  pid: number;
  /** The user its ranks run as; the sidecar's own when absent. */
  uid?: number;
  gid?: number;
  resources: Record<string, number>;
  tags: string[];
  state: WorkerState;
  /** The job it is frozen for. */
  jobId?: string;
  registeredAt: string;
  /** Its rank in the in-process pool, if the sidecar has a pool. */
  pool?: PoolSeat;
}

export interface WorkerSpec {
  id: string;
  address?: string;
  host: string;
  pid?: number;
  uid?: number;
  gid?: number;
  resources?: Record<string, number>;
  tags?: string[];
}

/** How to pick workers when no explicit list is given. */
export interface Selector {
  count: number;
  placement?: Placement;
  /** Every tag must be present on a chosen worker. */
  tags?: string[];
  /** Minimum amount of each resource. */
  resources?: Record<string, number>;
  /** Only these hosts. */
  hosts?: string[];
}

export interface ProcessSet {
  name: string;
  /** Worker ids in rank order. */
  members: string[];
  selector?: Selector;
  createdAt: string;
  /** The active job created from it. */
  jobId?: string;
  /** Members whose worker left the cluster (a job on the pset fails naming them until redefined). */
  gone?: string[];
}

export interface PsetSpec {
  name: string;
  members?: string[];
  selector?: Selector;
}

export interface JobMember {
  workerId: string;
  rank: number;
  host: string;
  /** Rank among this job's ranks on the same host. */
  localRank: number;
  /** Rank among all ranks on the host; one job per worker, so equal to localRank. */
  nodeRank: number;
  /** Index of the host among the job's hosts, in order of first appearance by rank. */
  nodeId: number;
  state: MemberState;
  /** Why it was lost. */
  reason?: string;
  /** Its loss or abort is what ended the job (the others may be lost afterwards, as a result). */
  endedJob?: boolean;
  /** In-process jobs: its worker's rank in the pool namespace. */
  poolRank?: number;
}

export interface Job {
  id: string;
  impl: Impl;
  /** The mode the job actually runs in. */
  mode: JobMode;
  /** Why it runs in fork mode although in-process was asked for. */
  modeReason?: string;
  /**
   * PMIx namespace or PMI kvsname, unique for the life of the sidecar; for an in-process job, the
   * pool namespace its members' ranks belong to (shared with the other jobs of that pool).
   */
  namespace: string;
  /** The string tag members pass to MPI_Comm_create_from_group (in-process jobs). */
  tag: string;
  members: JobMember[];
  state: JobState;
  createdAt: string;
  startedAt?: string;
  endedAt?: string;
  /** When its protocol state was torn down and its workers unfrozen. */
  releasedAt?: string;
  error?: string;
  pset?: string;
  owner?: string;
  wiringTimeoutSeconds: number;
  /** 0: no limit. */
  timeoutSeconds: number;
  labels: Record<string, string>;
}

/** Where a request that an elastic job give a worker back stands. */
export type DrainState = 'requested' | 'honoured' | 'lapsed' | 'overdue' | 'withdrawn';

export interface DrainRequest {
  workerId: string;
  /** Who asked: "retired by Dask", "Adaptive scaling down". */
  reason: string;
  state: DrainState;
  requestedAt: string;
  resolvedAt?: string;
  /** honoured: the first generation without the worker. */
  generation?: number;
}

/** One generation of an elastic job: a job labelled with the elastic job's id. */
export interface ElasticGeneration {
  generation: number;
  jobId: string;
  /** In rank order. */
  workers: string[];
  /** What started it: "" (the first), "-w; +w", "lost w". */
  change: string;
  state: JobState;
  createdAt: string;
  endedAt?: string;
  error?: string;
}

/** An elastic job's members over time and the drain requests made of it. */
export interface ElasticJob {
  id: string;
  generations: ElasticGeneration[];
  drains: DrainRequest[];
  /** Its newest generation's. */
  state?: JobState;
}

/** POST /v1/jobs: exactly one of pset, members or selector. */
export interface JobSpec {
  impl: Impl;
  /** inprocess: in the pool where every member can be, else fork (with the reason); default fork. */
  mode?: JobMode;
  /** mode inprocess: fail instead of running in fork mode when in-process cannot serve. */
  strictMode?: boolean;
  /**
   * mode inprocess, in a request that may wait: how long to wait for members whose worker has not
   * asked to join the pool yet before the mode is decided.
   */
  poolJoinMs?: number;
  pset?: string;
  members?: string[];
  selector?: Selector;
  owner?: string;
  wiringTimeoutSeconds?: number;
  timeoutSeconds?: number;
  labels?: Record<string, string>;
}

/** A process in a job, as the protocols name it. */
export interface RankRef {
  namespace: string;
  rank: number;
}
