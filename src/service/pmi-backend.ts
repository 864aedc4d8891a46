// The PMI backend of the resource manager: MPICH and Intel MPI jobs of src/rm, served by one
// PMI listener (src/pmi). It is both sides of the adapter:
//   - a JobBackend for the core (prepare → memberEnv → release), which hands each member
//     PMI_PORT, a PMI_ID and PMI_RANK / PMI_SIZE;
//   - the PmiJobCore of the wire server, which binds each connecting client to its member
//     (pmi-member.ts turns that member's commands into the core's calls).
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { EngineJob } from '../pmi/engine.js';
import {
  checkPeerUid,
  LIMITS,
  newPmiId,
  type PmiConnectionInfo,
  PmiError,
  type PmiJobCore,
  PmiListener,
  type PmiMember,
  processMapping,
  type Trace,
} from '../pmi/index.js';
import type { Impl, Job, JobBackend, JobMember, ResourceManager, Worker } from '../rm/index.js';
import { DEFAULT_MEMBER_ENV } from './default-env.js';
import { FENCE, type PmiJob, RmPmiMember } from './pmi-member.js';
import { asPmiError } from './pmi-names.js';

/**
 * What the clients of one job may store, a budget a hostile or broken client cannot exceed:
 * going past it is the client's error (rc=-1 msg=...), never the sidecar's memory. The engine
 * keeps it (native/src/pmi/job.cc).
 */
export interface PmiJobLimits {
  /** Distinct keys held, staged and committed (node attributes included). */
  kvEntries: number;
  /** Bytes of keys and values held, staged and committed. */
  kvBytes: number;
  /** put / kvs-put / info-putnodeattr calls over the job's life (overwrites included). */
  puts: number;
}

/**
 * Far above what MPI needs (MPICH puts a few keys per rank, and a node root's business card
 * as nine 1 KiB segments: a 4,096-rank job on 256 hosts holds about 15,000 entries and 5 MB),
 * and far below what would hurt the sidecar.
 */
export const DEFAULT_PMI_JOB_LIMITS: Readonly<PmiJobLimits> = {
  kvEntries: 65_536,
  kvBytes: 32 * 1024 * 1024,
  puts: 1_048_576,
};

export interface PmiBackendOptions {
  rm: ResourceManager;
  /** Address to bind (default 127.0.0.1; 0.0.0.0 when workers on other hosts join). */
  host?: string;
  /** 0 (default) picks a free port. */
  port?: number;
  /** Host name members use in PMI_PORT; default: the bound address, or this host's name for 0.0.0.0. */
  advertisedHost?: string;
  /** Added to every member's environment; replaces DEFAULT_MEMBER_ENV of the job's impl. */
  extraEnv?: Readonly<Record<string, string>>;
  /** See PmiListenerOptions. */
  bindTimeoutMs?: number;
  maxUnbound?: number;
  onTcpConnection?: (socket: Socket) => void;
  /** Per-job bounds on what clients may store (default DEFAULT_PMI_JOB_LIMITS). */
  limits?: Readonly<PmiJobLimits>;
  trace?: Trace;
  onError?: (what: string, err: unknown) => void;
  /**
   * An hwloc XML topology of this host, handed to members on this host as the job attribute
   * PMI_hwloc_xmlfile, as hydra does: each rank then loads it instead of discovering the
   * topology itself (on 2 cores, 16 MPICH 4.0.2 ranks: MPI_Init 0.65 s → 0.49 s). A path, or
   * true (the default) to write one with `lstopo-no-graphics --of xml` if hwloc is installed,
   * or false for none.
   */
  topology?: string | boolean;
}

/** Host names under which a worker runs on the sidecar's own host. */
export const LOCAL_HOSTS = new Set([hostname(), 'localhost', '127.0.0.1', '::1']);

/** The uid a worker's ranks run as: the one it registered with, else the sidecar's own (as for PMIx). */
export function workerUid(worker: Readonly<Worker> | undefined): number {
  return worker?.uid ?? process.getuid?.() ?? 0;
}

/** Writes this host's hwloc topology as XML; undefined when hwloc's lstopo is not installed. */
async function writeTopology(): Promise<{ file: string; dir: string } | undefined> {
  const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-hwloc-'));
  const file = join(dir, 'topology.xml');
  try {
    await promisify(execFile)('lstopo-no-graphics', ['--of', 'xml', '--force', file], { timeout: 10_000 });
    return { file, dir };
  } catch {
    rmSync(dir, { recursive: true, force: true });
    return undefined;
  }
}

export class PmiBackend implements JobBackend, PmiJobCore {
  readonly impls = ['mpich', 'intelmpi'] as const;
  private readonly byPmiId = new Map<string, { pj: PmiJob; rank: number }>();
  private readonly jobs = new Map<string, PmiJob>();
  /** Members of something else than a job of the core (the in-process worlds, pmi-worlds.ts). */
  private others: ((pmiId: string, conn: PmiConnectionInfo) => PmiMember | undefined) | undefined;

  private constructor(
    private readonly opts: PmiBackendOptions,
    readonly listener: PmiListener,
    /** PMI_hwloc_xmlfile for members on this host. */
    readonly topologyFile: string | undefined,
    private readonly ownedTopologyDir: string | undefined,
  ) {}

  /** Starts the listener. Install the result with `rm.addBackend`. */
  static async start(opts: PmiBackendOptions): Promise<PmiBackend> {
    const topo =
      opts.topology === false
        ? undefined
        : typeof opts.topology === 'string'
          ? { file: opts.topology, dir: undefined }
          : await writeTopology();
    let self: PmiBackend | undefined;
    // The listener needs its core before it accepts anything; the backend is that core.
    const core: PmiJobCore = { attach: (id, conn) => self!.attach(id, conn) };
    const listener = await PmiListener.start({
      core,
      host: opts.host,
      port: opts.port,
      trace: opts.trace,
      onError: opts.onError,
      bindTimeoutMs: opts.bindTimeoutMs,
      maxUnbound: opts.maxUnbound,
      onTcpConnection: opts.onTcpConnection,
    });
    self = new PmiBackend(opts, listener, topo?.file, topo?.dir);
    return self;
  }

  /** PMI_PORT handed to members. */
  get pmiPort(): string {
    const bound = this.listener.host;
    const host = this.opts.advertisedHost ?? (bound === '0.0.0.0' || bound === '::' ? hostname() : bound);
    return `${host}:${this.listener.port}`;
  }

  // ---- JobBackend ----------------------------------------------------------------------------

  async prepare(job: Readonly<Job>, workers: ReadonlyMap<string, Readonly<Worker>>): Promise<void> {
    const pj: PmiJob = {
      job,
      pmiIds: job.members.map(() => newPmiId()),
      hosts: job.members.map((m) => m.host),
      uids: job.members.map((m) => workerUid(workers.get(m.workerId))),
      connected: job.members.map(() => false),
      released: false,
    };
    for (const [rank, id] of pj.pmiIds.entries()) this.byPmiId.set(id, { pj, rank });
    this.jobs.set(job.id, pj);
  }

  memberEnv(job: Readonly<Job>, member: Readonly<JobMember>, _worker: Readonly<Worker>): Record<string, string> {
    const pj = this.require(job.id);
    return this.rankEnv(job.impl, pj.pmiIds[member.rank]!, member.host, member.rank, job.members.length);
  }

  /** What a rank with credential `pmiId` sets to join: the impl's settings and PMI's own. */
  rankEnv(impl: Impl, pmiId: string, host: string, rank: number, size: number): Record<string, string> {
    return {
      ...(this.opts.extraEnv ?? DEFAULT_MEMBER_ENV[impl === 'intelmpi' ? 'intelmpi' : 'mpich']),
      PMI_PORT: this.pmiPort,
      // The credential; whoever starts the rank binds the connection with it and hands it to
      // MPI as PMI_FD (dask_pmix.pmi_connect, see src/pmi/credential.ts).
      PMI_ID: pmiId,
      // Ranks on this host: a UNIX socket the starter prefers to PMI_PORT (no TCP on loopback).
      ...(LOCAL_HOSTS.has(host) && this.listener.socketPath ? { DASK_PMIX_PMI_SOCKET: this.listener.socketPath } : {}),
      // Read by MPI clients on a PMI_FD; MPICH 5's auto-detection also takes PMI_SIZE as the
      // sign of a PMI-1 launcher.
      PMI_RANK: String(rank),
      PMI_SIZE: String(size),
    };
  }

  /** Serves members that are not ranks of a job of the core too: `attach` answers their credentials. */
  serveAlso(attach: (pmiId: string, conn: PmiConnectionInfo) => PmiMember | undefined): void {
    this.others = attach;
  }

  /**
   * Nothing to send: PMI has no message a server may send unasked. Members waiting in a
   * barrier / kvs-fence or a node-attribute wait have just had the job's error as their reply
   * (the core failed those waits), and every later command of the job's members gets it too.
   *
   * Hanging up instead would be PMI's way of hydra killing the job, but MPICH 5's PMI client
   * dereferences a NULL buffer when its server closes the connection while it waits for a
   * reply (PMIU_cmd_read after PMIU_read_cmd hits EOF), so the rank would die of SIGSEGV
   * rather than report the error. MPICH 4.0.2 ignores rc in barrier_out, so it notices the
   * failure only at its next put/get/lookup.
   */
  async notifyEnded(): Promise<void> {}

  /**
   * Forgets the job's PMI_IDs. Connections stay open until their clients close them (see
   * notifyEnded for why they are never cut): MPICH sends PMI finalize only when its process
   * exits, so a worker that ran MPI_Finalize keeps its connection until then. Their commands
   * get the job's end as an error, finalize an ack.
   */
  async release(job: Readonly<Job>): Promise<void> {
    const pj = this.jobs.get(job.id);
    if (!pj) return;
    pj.released = true;
    if (pj.engine) {
      pj.engine.release(`job ${job.id} has ended and been released`);
      this.listener.engine.forget(pj.engine);
    }
    this.jobs.delete(job.id);
    for (const id of pj.pmiIds) this.byPmiId.delete(id);
  }

  async close(): Promise<void> {
    await this.listener.close();
    if (this.ownedTopologyDir) rmSync(this.ownedTopologyDir, { recursive: true, force: true });
  }

  // ---- PmiJobCore ----------------------------------------------------------------------------

  attach(pmiId: string, conn: PmiConnectionInfo): PmiMember {
    const e = this.byPmiId.get(pmiId);
    if (!e) {
      const other = this.others?.(pmiId, conn);
      if (other) return other;
    }
    // The guess is not echoed: an answer must not help the next one.
    if (!e) throw new PmiError('unknown PMI_ID: no active MPICH/Intel MPI job has such a member');
    const { pj, rank } = e;
    // Before anything else, and changing nothing: a stranger holding the credential neither
    // learns the rank's state nor takes the credential from the rank it belongs to.
    checkPeerUid(conn.peerUid(), pj.uids[rank]!);
    if (pj.connected[rank]) throw new PmiError(`the PMI_ID of rank ${rank} of job ${pj.job.id} is already connected`);
    try {
      this.opts.rm.memberConnected(pj.job.namespace, rank);
    } catch (e) {
      throw asPmiError(e);
    }
    pj.connected[rank] = true;
    pj.engine ??= this.engineJob(pj);
    const local = LOCAL_HOSTS.has(pj.hosts[rank]!);
    return new RmPmiMember(this.opts.rm, pj, rank, pj.engine, local ? this.topologyFile : undefined, () => {
      pj.connected[rank] = false;
    });
  }

  /**
   * The job in the native engine, with the core's `fence` collective handed over to it: the
   * core goes on deciding who is gone and when the job ends, the engine applies it.
   */
  private engineJob(pj: PmiJob): EngineJob {
    const { job, hosts } = pj;
    const size = job.members.length;
    const nodes = new Map<string, number>();
    for (const h of hosts) if (!nodes.has(h)) nodes.set(h, nodes.size);
    // Longer than a reply line can carry: MPICH falls back to exchanging host names.
    const mapping = hosts.length === size ? processMapping(hosts) : '';
    const derived: [string, string][] = [
      ['universeSize', String(size)],
      ['PMI_universe_size', String(size)],
    ];
    if (mapping !== '' && mapping.length <= LIMITS.valueMax - 64) derived.push(['PMI_process_mapping', mapping]);
    let engine: EngineJob | undefined;
    const delegated = this.opts.rm.delegateCollective(job.namespace, FENCE, {
      rankGone: (rank, message) => engine?.rankGone(rank, message),
      close: (message) => engine?.close(message),
    });
    engine = this.listener.engine.createJob({
      jobId: job.id,
      kvsname: job.namespace,
      size,
      appnum: 0,
      universeSize: size,
      node: hosts.map((h) => nodes.get(h)!),
      derived,
      localAttrs: this.topologyFile ? [['PMI_hwloc_xmlfile', this.topologyFile]] : [],
      local: hosts.map((h) => LOCAL_HOSTS.has(h)),
      limits: this.opts.limits ?? DEFAULT_PMI_JOB_LIMITS,
      timeoutMs: delegated.timeoutMs,
    });
    engine.onFence = (seconds, outcome) => delegated.observe(seconds, outcome);
    for (const [rank, message] of delegated.gone) engine.rankGone(rank, message);
    if (delegated.closed !== undefined) engine.close(delegated.closed);
    return engine;
  }

  private require(jobId: string): PmiJob {
    const pj = this.jobs.get(jobId);
    if (!pj) throw new Error(`job ${jobId} was not prepared by the PMI backend`);
    return pj;
  }
}
