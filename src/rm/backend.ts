// The protocol backend: what the core needs from a process-management protocol to run a job.
// One per wire protocol: PMIx (Open MPI) and PMI-1/PMI-2 (MPICH, Intel MPI).
import type { Impl, Job, JobMember, Worker } from './types.js';

/**
 * A protocol backend turns a job of the core into something its MPI library can join, and
 * tears it down again. The core calls it; the backend's protocol server calls the core back
 * (ResourceManager: memberConnected, memberFinalized, memberLost, abort, collective, kv,
 * names, findMember) as clients connect, fence and leave.
 *
 * Call order for one job: prepare → memberEnv (any number of times, while the job is active)
 * → [notifyEnded, if it failed or was aborted] → release. Calls for different jobs interleave.
 * Every method must validate nothing the core already validated and must never take the
 * sidecar down: prepare and release may reject (the core logs it), notifyEnded must not.
 */
export interface JobBackend {
  /** The MPI implementations it serves, e.g. ['openmpi'] or ['mpich', 'intelmpi']. */
  readonly impls: readonly Impl[];

  /**
   * Makes the job's namespace (PMIx) or kvsname (PMI) known to the protocol server, with its
   * ranks, hosts and sizes, before any member is handed an environment. A rejection refuses
   * the job: the core then undoes everything and the REST request fails without side effects.
   * `workers` are the members' workers by id (host, uid, gid).
   */
  prepare(job: Readonly<Job>, workers: ReadonlyMap<string, Readonly<Worker>>): Promise<void>;

  /**
   * The environment `member` must set to join as its rank, protocol part only. PMIx: the
   * setup_fork output with PMIX_HOSTNAME set to the worker's host. PMI: PMI_PORT=host:port,
   * PMI_ID, PMI_RANK, PMI_SIZE, and never any PMIX_* variable.
   */
  memberEnv(job: Readonly<Job>, member: Readonly<JobMember>, worker: Readonly<Worker>): Record<string, string>;

  /**
   * The job failed or was aborted (`job.error` says why): tell the members that are still
   * connected, e.g. a PMIx event or a PMI-1 abort, so they stop instead of hanging. Best effort.
   */
  notifyEnded(job: Readonly<Job>): Promise<void>;

  /**
   * Forgets the job: deregister its clients, then its namespace (PMIx); drop its kvsname and
   * close its members' connections (PMI). Called once, after the job ended and its members
   * left or the release grace expired.
   */
  release(job: Readonly<Job>): Promise<void>;

  /** The sidecar is stopping; every job has been released. */
  close(): Promise<void>;
}
