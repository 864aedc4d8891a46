// The PMI backend of the resource manager: MPICH and Intel MPI jobs of src/rm, served by one
// PMI listener. It is both sides of the adapter:
//   - a JobBackend for the core (prepare → memberEnv → release), which hands each member
//     PMI_PORT, a PMI_ID and PMI_RANK / PMI_SIZE;
//   - the PmiJobCore of the wire server, which turns each connected member's commands into the
//     core's calls: the job's collectives, key-value store, name service and state machine.
//
// The one thing PMI adds on top of the core is when a put becomes visible: PMI says at the next
// barrier / kvs-fence (hydra caches puts until then), so a member's puts are staged here and
// committed to the job's store when that member's fence completes. All members' fences
// complete in one synchronous step in the core, and each commit runs before any further
// command can be read, so no rank sees a half-committed epoch.
import { execFile } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Job, JobBackend, JobMember, ResourceManager, Worker } from '../rm/index.js';
import { isActive } from '../rm/index.js';
import type { Trace } from './connection.js';
import { PmiError } from './errors.js';
import type { KvsLookup, PmiJobCore, PmiMember, PmiMemberInfo } from './job-core.js';
import { PmiListener } from './listener.js';

/** The collective a PMI-1 barrier and a PMI-2 kvs-fence join: the same one a PMIx fence joins. */
export const FENCE = 'fence';

/**
 * What each member of an MPICH / Intel MPI job gets besides the PMI variables, unless the
 * sidecar is configured otherwise. Waiting ranks busy-poll; on a worker that shares its cores
 * (with Dask threads, or with more ranks than cores) they must back off:
 * - MPICH >= 4.1 (ch4): MPIR_CVAR_CH4_PROGRESS_THROTTLE sleeps 1 us after that many polls
 *   without progress. Measured on 2 cores, 16 ranks, 200 Allreduces behind a 2 ms straggler:
 *   10.5 s without, 1.0 s with a count of 16 (the default count of 4096 helps much less).
 *   MPICH 4.0.2 has no such setting (nor any UCX one that applies: shared memory on one host
 *   is MPICH's own, and UCX_TLS changes nothing measurable there).
 * - Intel MPI backs off by itself when oversubscribed; spinning once and then sched_yield
 *   shaves a little more (0.64 s → 0.49 s in the same test with 8 ranks).
 */
export const DEFAULT_PMI_ENV: Readonly<Record<'mpich' | 'intelmpi', Readonly<Record<string, string>>>> = {
  mpich: {
    MPIR_CVAR_CH4_PROGRESS_THROTTLE: '1',
    MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT: '16',
  },
  intelmpi: {
    I_MPI_SPIN_COUNT: '1',
    I_MPI_THREAD_YIELD: '2',
  },
};

export interface PmiBackendOptions {
  rm: ResourceManager;
  /** Address to bind (default 127.0.0.1; 0.0.0.0 when workers on other hosts join). */
  host?: string;
  /** 0 (default) picks a free port. */
  port?: number;
  /** Host name members use in PMI_PORT; default: the bound address, or this host's name for 0.0.0.0. */
  advertisedHost?: string;
  /** Added to every member's environment; replaces DEFAULT_PMI_ENV of the job's impl. */
  extraEnv?: Readonly<Record<string, string>>;
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
const LOCAL_HOSTS = new Set([hostname(), 'localhost', '127.0.0.1', '::1']);

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

/** What the backend keeps per job. */
interface PmiJob {
  job: Readonly<Job>;
  pmiIds: number[];
  hosts: string[];
  /** Puts of each rank not yet committed by a fence. */
  staged: Map<string, string>[];
  /** Which ranks have a live connection. */
  connected: boolean[];
  /** Released by the core: nothing of it is reported any more. */
  released: boolean;
}

export class PmiBackend implements JobBackend, PmiJobCore {
  readonly impls = ['mpich', 'intelmpi'] as const;
  private readonly byPmiId = new Map<number, { pj: PmiJob; rank: number }>();
  private readonly jobs = new Map<string, PmiJob>();

  private constructor(
    private readonly opts: PmiBackendOptions,
    readonly listener: PmiListener,
    /** PMI_hwloc_xmlfile for members on this host. */
    readonly topologyFile: string | undefined,
    private readonly ownedTopologyDir: string | undefined,
  ) {}

  /** Starts the listener. Install the result with `rm.addBackend`. */
  static async start(opts: PmiBackendOptions): Promise<PmiBackend> {
    const topo = opts.topology === false ? undefined : typeof opts.topology === 'string' ? { file: opts.topology, dir: undefined } : await writeTopology();
    let self: PmiBackend | undefined;
    // The listener needs its core before it accepts anything; the backend is that core.
    const core: PmiJobCore = { attach: (id) => self!.attach(id) };
    const listener = await PmiListener.start({
      core, host: opts.host, port: opts.port, trace: opts.trace, onError: opts.onError,
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

  async prepare(job: Readonly<Job>): Promise<void> {
    const pj: PmiJob = {
      job,
      pmiIds: job.members.map(() => this.newPmiId()),
      hosts: job.members.map((m) => m.host),
      staged: job.members.map(() => new Map()),
      connected: job.members.map(() => false),
      released: false,
    };
    pj.pmiIds.forEach((id, rank) => this.byPmiId.set(id, { pj, rank }));
    this.jobs.set(job.id, pj);
  }

  memberEnv(job: Readonly<Job>, member: Readonly<JobMember>, _worker: Readonly<Worker>): Record<string, string> {
    const pj = this.require(job.id);
    const impl = job.impl === 'intelmpi' ? 'intelmpi' : 'mpich';
    return {
      ...(this.opts.extraEnv ?? DEFAULT_PMI_ENV[impl]),
      PMI_PORT: this.pmiPort,
      PMI_ID: String(pj.pmiIds[member.rank]),
      // Only read by clients that skip the PMI_ID handshake (MPICH 4.0.x without PMI_ID);
      // MPICH 5's auto-detection also takes PMI_SIZE as the sign of a PMI-1 launcher.
      PMI_RANK: String(member.rank),
      PMI_SIZE: String(job.members.length),
    };
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
    this.jobs.delete(job.id);
    for (const id of pj.pmiIds) this.byPmiId.delete(id);
  }

  async close(): Promise<void> {
    await this.listener.close();
    if (this.ownedTopologyDir) rmSync(this.ownedTopologyDir, { recursive: true, force: true });
  }

  // ---- PmiJobCore ----------------------------------------------------------------------------

  attach(pmiId: number): PmiMember {
    const e = this.byPmiId.get(pmiId);
    if (!e) throw new PmiError(`unknown PMI_ID ${pmiId}: no active MPICH/Intel MPI job has such a member`);
    const { pj, rank } = e;
    if (pj.connected[rank]) throw new PmiError(`PMI_ID ${pmiId} (rank ${rank} of job ${pj.job.id}) is already connected`);
    this.opts.rm.memberConnected(pj.job.namespace, rank);
    pj.connected[rank] = true;
    const local = LOCAL_HOSTS.has(pj.hosts[rank]!);
    return new RmPmiMember(this.opts.rm, pj, rank, local ? this.topologyFile : undefined, () => {
      pj.connected[rank] = false;
    });
  }

  private require(jobId: string): PmiJob {
    const pj = this.jobs.get(jobId);
    if (!pj) throw new Error(`job ${jobId} was not prepared by the PMI backend`);
    return pj;
  }

  /** A random positive int32 no live member has: a stale env from another job cannot hit it by chance. */
  private newPmiId(): number {
    for (;;) {
      const id = randomInt(1, 2 ** 31 - 1);
      if (!this.byPmiId.has(id)) return id;
    }
  }
}

/** Keys of node attributes inside the job's store: control characters never occur in PMI keys. */
const nodeKey = (host: string, key: string) => `\u0001node\u0001${host}\u0001${key}`;

class RmPmiMember implements PmiMember {
  readonly info: PmiMemberInfo;
  private readonly ns: string;
  private readonly host: string;

  constructor(
    private readonly rm: ResourceManager,
    private readonly pj: PmiJob,
    private readonly rank: number,
    private readonly topologyFile: string | undefined,
    private readonly detach: () => void,
  ) {
    const job = pj.job;
    this.ns = job.namespace;
    this.host = pj.hosts[rank]!;
    this.info = {
      jobId: job.id,
      kvsname: job.namespace,
      rank,
      size: job.members.length,
      appnum: 0,
      universeSize: job.members.length,
      hosts: pj.hosts,
    };
  }

  /** Throws the job's end as the client's error once it failed, was aborted or completed. */
  private live(): void {
    if (this.pj.released) throw new PmiError(`job ${this.info.jobId} has ended and been released`);
    const job = this.rm.jobByNamespace(this.ns);
    if (!job) throw new PmiError(`job ${this.info.jobId} has been released`);
    if (!isActive(job.state)) throw new PmiError(`job ${job.id} ${job.state}${job.error ? `: ${job.error}` : ''}`);
  }

  private get publisher() {
    return { jobId: this.info.jobId, namespace: this.ns, rank: this.rank };
  }

  put(key: string, value: string): void {
    this.live();
    this.pj.staged[this.rank]!.set(key, value);
  }

  get(key: string): KvsLookup {
    this.live();
    const own = this.pj.staged[this.rank]!.get(key);
    if (own !== undefined) return { found: true, value: own };
    const v = this.rm.kv(this.ns).get(key);
    if (v !== undefined) return { found: true, value: v };
    return this.pj.staged.some((s) => s.has(key)) ? { found: false, why: 'unfenced' } : { found: false, why: 'unknown' };
  }

  async fence(): Promise<void> {
    this.live();
    await this.rm.collective(this.ns, { name: FENCE, participants: 'all', contributors: [this.rank] });
    // Runs in the same microtask drain as every other member's commit (see the file comment).
    const staged = this.pj.staged[this.rank]!;
    const kv = this.rm.kv(this.ns);
    for (const [k, v] of staged) kv.put(this.rank, k, v);
    staged.clear();
  }

  jobAttr(key: string): string | undefined {
    this.live();
    return key === 'PMI_hwloc_xmlfile' ? this.topologyFile : undefined;
  }

  putNodeAttr(key: string, value: string): void {
    this.live();
    this.rm.kv(this.ns).put(this.rank, nodeKey(this.host, key), value);
  }

  async getNodeAttr(key: string, wait: boolean): Promise<string | undefined> {
    this.live();
    const kv = this.rm.kv(this.ns);
    const k = nodeKey(this.host, key);
    return wait ? kv.waitFor(k) : kv.get(k);
  }

  publish(service: string, port: string): void {
    this.live();
    this.rm.names.publish(this.publisher, [{ key: service, value: port }], { range: 'session' });
  }

  async lookup(service: string): Promise<string> {
    this.live();
    const [d] = await this.rm.names.lookup(this.publisher, [service], { range: 'session' });
    const v = d?.value as unknown;
    if (typeof v === 'string') return v;
    // Published through PMIx by an Open MPI job: a typed value.
    if (v && typeof v === 'object' && typeof (v as { value?: unknown }).value === 'string') return (v as { value: string }).value;
    throw new PmiError(`service ${service} was published with a value PMI cannot carry`);
  }

  unpublish(service: string): void {
    this.live();
    if (this.rm.names.unpublish(this.publisher, [service]) === 0) {
      throw new PmiError(`service ${service} is not published by this process`);
    }
  }

  abort(exitCode: number, message: string): void {
    this.rm.abort(this.ns, this.rank, exitCode, message);
  }

  finalize(): void {
    this.pj.staged[this.rank]!.clear();
    if (!this.pj.released) this.rm.memberFinalized(this.ns, this.rank);
  }

  disconnected(reason: string): void {
    this.detach();
    if (this.pj.released) return;
    const job = this.rm.jobByNamespace(this.ns);
    if (!job) return;
    const m = job.members[this.rank];
    if (m && m.state === 'connected') this.rm.memberLost(this.ns, this.rank, reason);
  }
}
