// The PMIx backend: an Open MPI job is a PMIx namespace of exactly its members, registered with
// the embedded libpmix server. Each member's environment is what PMIx_server_setup_fork gives
// for its rank, with PMIX_HOSTNAME set to its worker's host and the Open MPI settings that make
// a joining rank behave.
import { join } from 'node:path';
import { info, Keys, type NamespaceLayout, type PmixServer, type Proc, Rank, Status, v } from '../pmix/index.js';
import type { Job, JobBackend, JobMember, Worker } from '../rm/index.js';
import type { PmixClients } from './pmix-clients.js';
import { jobEndMessage, jobEndStatus, notifyRanks, registerNamespace, teardownNamespace } from './pmix-namespace.js';

export interface PmixBackendOptions {
  server: PmixServer;
  /** Which clients still hold a connection (fed by the upcall handlers). */
  clients: PmixClients;
  /** The server's rendezvous directory; each job's session files go below it. */
  tmpdir: string;
  /** Added to every member's environment (OMPI_MCA_* settings). */
  ompiEnv: Record<string, string>;
  /**
   * How long a released job's namespace waits for its clients to disconnect (default 5 min); then
   * their connections are shut down, and the namespace is torn down at most 10 s later.
   */
  drainTimeoutMs?: number;
  onError?: (what: string, err: unknown) => void;
}

export class PmixBackend implements JobBackend {
  readonly impls = ['openmpi'] as const;
  private readonly server: PmixServer;
  /** Jobs whose pset is defined in libpmix, to delete it on release. */
  private readonly definedPsets = new Map<string, string>();
  /** Namespaces of released jobs waiting for their clients to disconnect. */
  private readonly draining = new Set<string>();
  private closed = false;

  constructor(private readonly opts: PmixBackendOptions) {
    this.server = opts.server;
  }

  private procOf(job: Readonly<Job>, rank: number): Proc {
    return { nspace: job.namespace, rank };
  }

  async prepare(job: Readonly<Job>, workers: ReadonlyMap<string, Readonly<Worker>>): Promise<void> {
    const layout: NamespaceLayout = {
      nspace: job.namespace,
      tmpdir: join(this.opts.tmpdir, 'jobs', job.namespace),
      ranks: job.members.map((m) => ({
        rank: m.rank,
        host: m.host,
        localRank: m.localRank,
        nodeRank: m.nodeRank,
        nodeId: m.nodeId,
        // Open MPI 5.0.x resolves a custom pset by each rank's PMIX_PSET_NAME; harmless otherwise.
        ...(job.pset ? { psetName: job.pset } : {}),
      })),
    };
    await registerNamespace(this.server, layout);
    const registered: Proc[] = [];
    try {
      for (const m of job.members) {
        const w = workers.get(m.workerId);
        const proc = this.procOf(job, m.rank);
        await this.server.registerClient(proc, w?.uid ?? process.getuid?.() ?? 0, w?.gid ?? process.getgid?.() ?? 0);
        registered.push(proc);
      }
      if (job.pset) {
        await this.server.defineProcessSet(
          job.pset,
          job.members.map((m) => this.procOf(job, m.rank)),
        );
        this.definedPsets.set(job.id, job.pset);
      }
    } catch (err) {
      for (const p of registered) await this.server.deregisterClient(p).catch(() => undefined);
      await this.server.deregisterNspace(job.namespace).catch(() => undefined);
      throw err;
    }
  }

  memberEnv(job: Readonly<Job>, member: Readonly<JobMember>, worker: Readonly<Worker>): Record<string, string> {
    const env = this.server.setupFork(this.procOf(job, member.rank));
    // setup_fork names the server's host; the rank must believe it runs where it does, or Open
    // MPI assumes shared memory with ranks on other hosts.
    env.PMIX_HOSTNAME = worker.host;
    return { ...env, ...this.opts.ompiEnv };
  }

  async notifyEnded(job: Readonly<Job>): Promise<void> {
    const lost = job.members.filter((m) => m.state === 'lost').map((m) => this.procOf(job, m.rank));
    // A code Open MPI 5 registers a handler for. A default handler would not do: libpmix 5.0.x
    // drops a client's default registration unless another one exists already, so only
    // registered codes reach clients.
    const status = jobEndStatus(job);
    const items = [
      jobEndMessage(job),
      info(Keys.EVENT_TERMINATE_JOB, v.bool(true)),
      info(Keys.JOB_TERM_STATUS, v.status(status)),
    ];
    if (lost.length > 0) items.push(info(Keys.EVENT_AFFECTED_PROCS, v.procs(lost)));
    // Only the job's own clients.
    const everyRank = [{ nspace: job.namespace, rank: Rank.WILDCARD }];
    await notifyRanks(this.server, job.namespace, status, items, everyRank, this.opts.onError);
    // Then the job-level event, as PRRTE sends it: PMIX_EVENT_JOB_END (PMIX_ERR_JOB_TERMINATED)
    // naming the proc that ended the job (the whole namespace when none did), for the handlers
    // registered for it alone.
    const culprit = job.members.find((m) => m.endedJob) ?? job.members.find((m) => m.state === 'lost');
    const jobEnd = [
      info(Keys.EVENT_NON_DEFAULT, v.bool(true)),
      info(Keys.JOB_TERM_STATUS, v.status(status)),
      info(
        Keys.EVENT_AFFECTED_PROC,
        v.proc(culprit ? this.procOf(job, culprit.rank) : { nspace: job.namespace, rank: Rank.WILDCARD }),
      ),
      jobEndMessage(job),
    ];
    await notifyRanks(this.server, job.namespace, Status.ERR_JOB_TERMINATED, jobEnd, everyRank, this.opts.onError);
  }

  /**
   * Deletes the job's pset at once (the next job may define it again), and deregisters the
   * clients and the namespace once none of them holds a connection any more (see PmixClients):
   * at once for a job whose members never connected or were lost, a moment after the last
   * finalize, or when the lingering members of a deleted job go. Members that linger past
   * drainTimeoutMs are disconnected (libpmix then finds them gone, as if they had left).
   */
  async release(job: Readonly<Job>): Promise<void> {
    const pset = this.definedPsets.get(job.id);
    if (pset) {
      this.definedPsets.delete(job.id);
      await this.server.deleteProcessSet(pset).catch((e: unknown) => this.opts.onError?.('deleteProcessSet', e));
    }
    const teardown = async () => {
      if (this.closed) return;
      await teardownNamespace(
        this.server,
        job.namespace,
        job.members.map((m) => m.rank),
        join(this.opts.tmpdir, 'jobs', job.namespace),
        this.opts.onError,
      );
    };
    const clients = this.opts.clients;
    if (clients.count(job.namespace) === 0) return teardown();
    const drain = async () => {
      const ms = this.opts.drainTimeoutMs ?? 300_000;
      if (!(await clients.drained(job.namespace, ms))) {
        const lingering = clients.count(job.namespace);
        const shut = this.server.disconnectClients(job.namespace);
        this.opts.onError?.(
          'release',
          new Error(
            `${lingering} client(s) of ${job.namespace} still connected ${ms / 1000} s after the job ended: ${shut} connection(s) shut down`,
          ),
        );
        if (!(await clients.drained(job.namespace, 10_000))) clients.forget(job.namespace);
      }
      await teardown();
    };
    this.draining.add(job.namespace);
    void drain()
      .catch((e: unknown) => this.opts.onError?.('deregisterNspace', e))
      .finally(() => this.draining.delete(job.namespace));
  }

  /** Namespaces of released jobs whose teardown waits for connected clients. */
  get lingering(): string[] {
    return [...this.draining];
  }

  async close(): Promise<void> {
    // The server itself is stopped by whoever started it; its finalize drops what is left.
    this.closed = true;
  }
}
