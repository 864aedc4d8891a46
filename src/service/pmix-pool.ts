// The PMIx side of the in-process pool: each epoch is one namespace of P ranks registered up
// front with the embedded libpmix server, as research H found Open MPI 5.0.x needs:
// - every rank alone on its own virtual node (LOCAL_SIZE 1), except the ranks of a cohort, which
//   share one node (and so shared memory): a rank's init waits (2 s at most) for the modex of
//   every peer declared on its node and fails without it, so a cohort holds only workers that
//   are initialising together (src/rm/pool.ts decides which);
// - every rank's client registered up front: libpmix holds back direct-modex requests until all
//   local clients of a namespace are registered, with no timeout;
// - members initialise without any fence over the namespace (async modex, no data collection,
//   async init) and with fault tolerance, so that a pool rank's death does not kill its peers.
import { join } from 'node:path';
import { type Info, info, Keys, type NamespaceLayout, type PmixServer, type Proc, v } from '../pmix/index.js';
import type { Job, PoolBackend, PoolEpochSpec, PoolUser } from '../rm/index.js';
import type { PmixClients } from './pmix-clients.js';
import { jobEndMessage, jobEndStatus, notifyRanks, registerNamespace, teardownNamespace } from './pmix-namespace.js';

/** What every pool rank needs beyond the members' default Open MPI settings. */
export const POOL_OMPI_ENV: Readonly<Record<string, string>> = {
  OMPI_MCA_pmix_base_async_modex: '1',
  OMPI_MCA_pmix_base_collect_data: '0',
  OMPI_MCA_async_mpi_init: '1',
  OMPI_MCA_mpi_ft_enable: '1',
  // Revokes stay local (each member's watcher revokes its own communicator): the world model that
  // every pool rank also initialises (dask_pmix.worker.world_model) would otherwise broadcast them,
  // and the message names the communicator by the sender's local index, which session-made
  // communicators do not share across processes, so it can revoke another one.
  OMPI_MCA_mpi_ft_reliable_bcast: '0',
  // coll/han ignores failed sub-communicator splits and crashed survivors after a member's death
  // (fixed after 5.0.x); with one rank per virtual node it turns itself off anyway.
  OMPI_MCA_coll: '^han,hcoll',
  // An error with no MPI object to report it on returns instead of aborting the worker.
  OMPI_MCA_mpi_initial_errhandler: 'mpi_errors_return',
  // The worker's PMIx event handler hears at once that its server is gone (dask_pmix.worker.lifeline).
  PMIX_MCA_pmix_event_caching_window: '0',
};

/** The name of a pool rank's virtual node. */
export const virtualNode = (rank: number): string => `dask-pmix-vnode${rank}`;

/** The name of the node a cohort's ranks share (Open MPI names its shared-memory segments after it). */
export const cohortNode = (index: number): string => `dask-pmix-cohort${index}`;

export interface PmixPoolOptions {
  server: PmixServer;
  clients: PmixClients;
  /** The server's rendezvous directory; each epoch's session files go below it. */
  tmpdir: string;
  /** The members' Open MPI settings (the pool's own are added). */
  ompiEnv: Record<string, string>;
  onError?: (what: string, err: unknown) => void;
}

export class PmixPool implements PoolBackend {
  readonly uid = process.getuid?.() ?? 0;
  readonly gid = process.getgid?.() ?? 0;
  private readonly epochs = new Map<
    string,
    { size: number; nodes: Map<number, string>; users: Map<number, PoolUser> }
  >();

  constructor(private readonly o: PmixPoolOptions) {}

  async open(spec: PoolEpochSpec): Promise<void> {
    const shared = new Map<number, { host: string; localRank: number; nodeId: number }>();
    for (const [nodeId, c] of spec.cohorts.entries()) {
      for (const [localRank, rank] of c.ranks.entries())
        shared.set(rank, { host: cohortNode(nodeId), localRank, nodeId });
    }
    let nodeId = spec.cohorts.length;
    const layout: NamespaceLayout = {
      nspace: spec.namespace,
      tmpdir: join(this.o.tmpdir, 'pools', spec.namespace),
      ranks: Array.from({ length: spec.size }, (_, rank) => {
        const c = shared.get(rank);
        return c
          ? { rank, host: c.host, localRank: c.localRank, nodeRank: c.localRank, nodeId: c.nodeId }
          : { rank, host: virtualNode(rank), localRank: 0, nodeRank: 0, nodeId: nodeId++ };
      }),
    };
    await registerNamespace(this.o.server, layout);
    const users = new Map<number, PoolUser>();
    this.epochs.set(spec.namespace, {
      size: spec.size,
      nodes: new Map([...shared].map(([r, c]) => [r, c.host])),
      users,
    });
    const results = await Promise.allSettled(
      layout.ranks.map(({ rank }) => {
        const u = spec.users.get(rank) ?? this;
        users.set(rank, { uid: u.uid, gid: u.gid });
        return this.o.server.registerClient({ nspace: spec.namespace, rank }, u.uid, u.gid);
      }),
    );
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) {
      await this.close(spec.namespace).catch(() => undefined);
      throw (failed as PromiseRejectedResult).reason;
    }
  }

  rankEnv(namespace: string, rank: number): Record<string, string> {
    const env = this.o.server.setupFork({ nspace: namespace, rank });
    // The rank's node is virtual (its own, or its cohort's); Open MPI must not take the real
    // host's name for it.
    env.PMIX_HOSTNAME = this.epochs.get(namespace)?.nodes.get(rank) ?? virtualNode(rank);
    return { ...env, ...this.o.ompiEnv, ...POOL_OMPI_ENV };
  }

  async setUser(namespace: string, rank: number, user: PoolUser): Promise<void> {
    const e = this.epochs.get(namespace);
    const now = e?.users.get(rank);
    if (!e || !now) throw new Error(`no pool rank ${rank} in ${namespace}`);
    if (now.uid === user.uid && now.gid === user.gid) return;
    // libpmix keeps one record per registered client and checks a connecting client's uid and
    // gid against it: the record is replaced before the worker's process connects. The namespace
    // stays fully registered meanwhile (libpmix does not take back "all registered").
    const proc: Proc = { nspace: namespace, rank };
    await this.o.server.deregisterClient(proc);
    e.users.delete(rank);
    await this.o.server.registerClient(proc, user.uid, user.gid);
    e.users.set(rank, { uid: user.uid, gid: user.gid });
  }

  async notifyJobEnded(job: Readonly<Job>): Promise<void> {
    // Only the members whose process is gone (connection dropped) are named: fault tolerance
    // marks a named process failed for good, and a living worker must serve later jobs.
    const attached = new Set(this.o.clients.snapshot()[job.namespace] ?? []);
    const ranks = job.members.map((m) => m.poolRank).filter((r): r is number => r !== undefined);
    const dead = ranks.filter((r) => !attached.has(r));
    const alive = ranks.filter((r) => attached.has(r));
    if (dead.length === 0 || alive.length === 0) return;
    // A code Open MPI's fault-tolerance handler takes (it reads each PMIX_PROC value as a failed
    // process).
    const status = jobEndStatus(job);
    const items: Info[] = [
      jobEndMessage(job),
      ...dead.map((rank) => info(Keys.EVENT_AFFECTED_PROC, v.proc({ nspace: job.namespace, rank }))),
    ];
    const targets = alive.map((rank) => ({ nspace: job.namespace, rank }));
    await notifyRanks(this.o.server, job.namespace, status, items, targets, this.o.onError);
  }

  async close(namespace: string): Promise<void> {
    const size = this.epochs.get(namespace)?.size ?? 0;
    this.epochs.delete(namespace);
    const ranks = Array.from({ length: size }, (_, rank) => rank);
    await teardownNamespace(this.o.server, namespace, ranks, join(this.o.tmpdir, 'pools', namespace), this.o.onError);
  }
}
