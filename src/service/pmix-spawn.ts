// MPI_Comm_spawn for Open MPI ranks: the sidecar acts as the resource manager that PRRTE is under
// mpirun. A spawn request from a rank of an active job gets a namespace of its own (job info
// naming the parent, its apps, a node of its own), registered with libpmix with every client,
// and the processes are started here, by the sidecar, never by the Dask worker (a GPU worker
// cannot fork). Open MPI's parent and children then find each other themselves: the parent's
// root opens a port that reaches the children as OMPI_PARENT_PORT in the app's env, both roots
// publish and look up their members under it (the name service), and both sides PMIx_Connect
// (ompi/dpm/dpm.c, v5.0.x); with every process a client of this one server, libpmix completes the
// connect and the disconnect's fence itself.
//
// The children belong to the parent's job: they are terminated (SIGTERM, then SIGKILL after a
// bound) and reaped when the job ends for any reason or the sidecar stops, and their namespace is
// deregistered once they are gone. A child that dies before the job ends, or aborts, ends the
// job, as a failed process does under mpirun. Their output goes to the sidecar's log.
import { type ChildProcess, spawn as startProcess } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { hostname, networkInterfaces } from 'node:os';
import { join } from 'node:path';
import {
  findString,
  Keys,
  type NamespaceLayout,
  PmixError,
  type PmixServer,
  type Proc,
  type SpawnArgs,
  Status,
} from '../pmix/index.js';
import { isActive, type ResourceManager } from '../rm/index.js';
import type { PmixClients } from './pmix-clients.js';
import { registerNamespace, teardownNamespace } from './pmix-namespace.js';

export interface SpawnLimits {
  /** Processes one MPI_Comm_spawn may ask for. */
  maxProcsPerSpawn: number;
  /** Spawned processes of one job alive at once. */
  maxProcsPerJob: number;
}

export const DEFAULT_SPAWN_LIMITS: Readonly<SpawnLimits> = { maxProcsPerSpawn: 64, maxProcsPerJob: 64 };

/** Bytes of one child's output (stdout and stderr together) that reach the log; the rest is counted. */
const OUTPUT_LOG_BYTES = 1 << 20;

type LogFn = (level: 'debug' | 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void;

export interface PmixSpawnerOptions {
  server: PmixServer;
  rm: ResourceManager;
  clients: PmixClients;
  /** The server's rendezvous directory; each spawned namespace's session files go below it. */
  tmpdir: string;
  /** The members' Open MPI settings; the app's own env (the parent's OMPI_MCA_*) comes on top. */
  ompiEnv: Record<string, string>;
  limits?: Partial<SpawnLimits>;
  /** Between SIGTERM and SIGKILL (default 5 s). */
  killGraceMs?: number;
  /** How long a process may take to start (default 10 s). */
  launchTimeoutMs?: number;
  /** How long a gone namespace waits for libpmix to see its clients' connections close (default 10 s). */
  drainTimeoutMs?: number;
  log?: LogFn;
}

interface Child {
  rank: number;
  pid: number;
  process: ChildProcess;
  exited: Promise<void>;
  exit?: { code: number | null; signal: NodeJS.Signals | null };
  finalized: boolean;
  logged: number;
  dropped: number;
}

interface Spawned {
  nspace: string;
  jobId: string;
  /** The job member acting for this namespace (the spawning rank, or its own ancestor's). */
  anchor: Proc;
  children: Child[];
  ranks: number;
  /** Its processes are still being started. */
  launching: boolean;
  /** Terminating or terminated: exits are expected, not failures. */
  ending: boolean;
  gone?: Promise<void>;
}

export class PmixSpawner {
  private readonly limits: SpawnLimits;
  private readonly byNs = new Map<string, Spawned>();
  private readonly alive = new Map<string, number>();
  private seq = 0;
  private closed = false;

  constructor(private readonly o: PmixSpawnerOptions) {
    this.limits = { ...DEFAULT_SPAWN_LIMITS, ...o.limits };
    o.rm.events.subscribe(({ event }) => {
      if (event.kind === 'jobStateChanged' && !isActive(event.to)) this.jobEnded(event.jobId);
    });
  }

  /** Whether `nspace` is one this spawner started. */
  owns(nspace: string): boolean {
    return this.byNs.has(nspace);
  }

  /** The job a spawned namespace belongs to. */
  jobOf(nspace: string): string | undefined {
    return this.byNs.get(nspace)?.jobId;
  }

  /** Spawned processes of the job alive now. */
  aliveFor(jobId: string): number {
    return this.alive.get(jobId) ?? 0;
  }

  /** Pids of the job's spawned processes still running (for tests and diagnostics). */
  pidsOf(jobId: string): number[] {
    return [...this.byNs.values()]
      .filter((s) => s.jobId === jobId)
      .flatMap((s) => s.children.filter((c) => !c.exit).map((c) => c.pid));
  }

  /** The spawn upcall: starts the processes and answers the new namespace once all are running. */
  async spawn(a: SpawnArgs): Promise<string> {
    if (this.closed) throw new PmixError(Status.ERR_NOT_AVAILABLE, 'the sidecar is stopping');
    const { rm } = this.o;
    const via = this.byNs.get(a.proc.nspace);
    const anchor = via ? via.anchor : a.proc;
    const { job, member } = rm.findMember(anchor.nspace, anchor.rank);
    const where = `MPI_Comm_spawn from ${a.proc.nspace}:${a.proc.rank} (job ${job.id})`;
    if (!isActive(job.state)) throw new PmixError(Status.ERR_JOB_TERMINATED, `${where}: the job is ${job.state}`);
    const worker = rm.getWorker(member.workerId);
    if (!isLocalHost(worker.host)) {
      throw this.refuse(
        Status.ERR_NOT_SUPPORTED,
        `${where}: its worker runs on ${worker.host}, and dask-pmix starts spawned processes only on the sidecar's host (${hostname()})`,
      );
    }
    const me = { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
    const user = { uid: worker.uid ?? me.uid, gid: worker.gid ?? me.gid };
    if ((user.uid !== me.uid || user.gid !== me.gid) && me.uid !== 0) {
      throw this.refuse(
        Status.ERR_NO_PERMISSIONS,
        `${where}: its worker runs as uid ${user.uid}, and this sidecar (uid ${me.uid}) cannot start processes as another user`,
      );
    }
    if (a.apps.length === 0) throw this.refuse(Status.ERR_BAD_PARAM, `${where}: no app to start`);
    for (const app of a.apps) {
      if (!app.cmd) throw this.refuse(Status.ERR_BAD_PARAM, `${where}: an app without a command`);
      if (!Number.isInteger(app.maxprocs) || app.maxprocs < 1)
        throw this.refuse(Status.ERR_BAD_PARAM, `${where}: '${app.cmd}' asks for ${app.maxprocs} processes`);
    }
    const n = a.apps.reduce((s, app) => s + app.maxprocs, 0);
    const { maxProcsPerSpawn, maxProcsPerJob } = this.limits;
    if (n > maxProcsPerSpawn) {
      throw this.refuse(
        Status.ERR_OUT_OF_RESOURCE,
        `${where} asks for ${n} processes; one spawn may start at most ${maxProcsPerSpawn} (serve --max-spawn-procs)`,
      );
    }
    const running = this.aliveFor(job.id);
    if (running + n > maxProcsPerJob) {
      throw this.refuse(
        Status.ERR_OUT_OF_RESOURCE,
        `${where} asks for ${n} processes while ${running} it spawned still run; a job may have at most ${maxProcsPerJob} (serve --max-spawn-procs-per-job)`,
      );
    }
    const cwds = a.apps.map((app) => app.cwd || findString(app.info, Keys.WDIR) || process.cwd());
    for (const cwd of cwds) {
      if (!existsSync(cwd) || !statSync(cwd).isDirectory())
        throw this.refuse(Status.ERR_BAD_PARAM, `${where}: working directory ${cwd} does not exist`);
    }

    const nspace = `dask-pmix-spawn${++this.seq}-${job.id}`.slice(0, 255);
    // The children share a node of their own: they share memory among themselves and reach the
    // parent over the network transport, whatever node the parent's ranks believe they are on.
    const node = `dask-pmix-spawn-node${this.seq}`;
    const dir = join(this.o.tmpdir, 'spawned', nspace);
    const appOf: number[] = a.apps.flatMap((app, k) => Array.from({ length: app.maxprocs }, () => k));
    const layout: NamespaceLayout = {
      nspace,
      tmpdir: dir,
      apps: a.apps.map((app) => app.maxprocs),
      parent: a.proc,
      ranks: appOf.map((appnum, rank) => ({ rank, host: node, localRank: rank, nodeRank: rank, nodeId: 0, appnum })),
    };
    const sp: Spawned = { nspace, jobId: job.id, anchor, children: [], ranks: n, launching: true, ending: false };
    this.byNs.set(nspace, sp);
    this.alive.set(job.id, running + n);
    try {
      await registerNamespace(this.o.server, layout);
      for (let rank = 0; rank < n; rank++) await this.o.server.registerClient({ nspace, rank }, user.uid, user.gid);
      for (let rank = 0; rank < n; rank++) {
        const k = appOf[rank]!;
        const app = a.apps[k]!;
        sp.children.push(
          await this.start(sp, rank, app.cmd, app.argv, this.envOf(nspace, rank, node, app.env), cwds[k]!, user),
        );
      }
    } catch (err) {
      this.o.log?.('warn', 'MPI_Comm_spawn failed to start its processes', { nspace, job: job.id, err: String(err) });
      // Those never started are counted no longer; the others as they are reaped.
      this.alive.set(job.id, Math.max(0, (this.alive.get(job.id) ?? 0) - (n - sp.children.length)));
      await this.terminate(sp);
      if (err instanceof PmixError) throw err;
      throw new PmixError(
        Status.ERR_JOB_FAILED_TO_LAUNCH,
        `${where}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    sp.launching = false;
    // The job may have ended while the processes started: they go with it.
    if (!isActive(rm.getJob(job.id).state) || this.closed) {
      void this.terminate(sp);
      throw new PmixError(Status.ERR_JOB_TERMINATED, `${where}: the job ended while its processes started`);
    }
    this.o.log?.('info', 'MPI_Comm_spawn started processes', {
      nspace,
      job: job.id,
      parent: `${a.proc.nspace}:${a.proc.rank}`,
      cmd: a.apps.map((app) => app.cmd),
      pids: sp.children.map((c) => c.pid),
    });
    return nspace;
  }

  private refuse(status: number, message: string): PmixError {
    // Only the status reaches the rank (MPI_ERR_SPAWN): the reason is in the sidecar's log.
    this.o.log?.('warn', message, { upcall: 'spawn' });
    return new PmixError(status, message);
  }

  /** The child's environment: the sidecar's own without launcher variables, the members' Open MPI settings, the app's env, and its PMIx identity. */
  private envOf(nspace: string, rank: number, node: string, appEnv: string[]): Record<string, string> {
    const env: Record<string, string> = {};
    for (const [k, val] of Object.entries(process.env)) {
      if (val !== undefined && !LAUNCHER_VAR.test(k)) env[k] = val;
    }
    Object.assign(env, this.o.ompiEnv);
    for (const kv of appEnv) {
      const i = kv.indexOf('=');
      if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
    }
    Object.assign(env, this.o.server.setupFork({ nspace, rank }));
    env.PMIX_HOSTNAME = node;
    return env;
  }

  private start(
    sp: Spawned,
    rank: number,
    cmd: string,
    argv: string[],
    env: Record<string, string>,
    cwd: string,
    user: { uid: number; gid: number },
  ): Promise<Child> {
    const me = process.getuid?.() ?? 0;
    const child = startProcess(cmd, argv.slice(1), {
      argv0: argv[0] ?? cmd,
      cwd,
      env,
      // Its own process group, so that whatever it starts in turn is terminated with it.
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(user.uid !== me ? { uid: user.uid, gid: user.gid } : {}),
    });
    return new Promise<Child>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`'${cmd}' did not start within ${(this.o.launchTimeoutMs ?? 10_000) / 1000} s`));
      }, this.o.launchTimeoutMs ?? 10_000);
      child.once('error', (err) => {
        clearTimeout(timer);
        reject(new Error(`cannot start '${cmd}': ${err.message}`));
      });
      child.once('spawn', () => {
        clearTimeout(timer);
        const c: Child = {
          rank,
          pid: child.pid!,
          process: child,
          finalized: false,
          logged: 0,
          dropped: 0,
          exited: new Promise<void>((done) => {
            child.once('exit', (code, signal) => {
              c.exit = { code, signal };
              this.exited(sp, c);
              done();
            });
          }),
        };
        this.forward(sp, c, 'stdout');
        this.forward(sp, c, 'stderr');
        resolve(c);
      });
    });
  }

  /** A child's output goes to the sidecar's log, line by line, up to OUTPUT_LOG_BYTES; the rest is counted and said once. */
  private forward(sp: Spawned, c: Child, stream: 'stdout' | 'stderr'): void {
    let partial = '';
    const emit = (line: string) => {
      if (c.logged >= OUTPUT_LOG_BYTES) {
        if (c.dropped === 0)
          this.o.log?.('warn', `spawned process output beyond ${OUTPUT_LOG_BYTES} bytes is not logged`, {
            nspace: sp.nspace,
            rank: c.rank,
          });
        c.dropped += line.length;
        return;
      }
      c.logged += line.length;
      this.o.log?.('info', line, { spawned: sp.nspace, rank: c.rank, pid: c.pid, stream });
    };
    const s = c.process[stream];
    s?.setEncoding('utf8');
    s?.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop() ?? '';
      for (const line of lines) emit(line);
    });
    s?.on('end', () => {
      if (partial) emit(partial);
      partial = '';
    });
  }

  private exited(sp: Spawned, c: Child): void {
    this.alive.set(sp.jobId, Math.max(0, (this.alive.get(sp.jobId) ?? 1) - 1));
    const how = c.exit?.signal ? `signal ${c.exit.signal}` : `exit code ${c.exit?.code}`;
    this.o.log?.(sp.ending || c.exit?.code === 0 ? 'debug' : 'warn', 'spawned process ended', {
      nspace: sp.nspace,
      rank: c.rank,
      pid: c.pid,
      how,
      dropped: c.dropped || undefined,
    });
    if (!sp.ending && c.exit?.code !== 0) {
      this.failJob(sp, `spawned process ${sp.nspace}:${c.rank} (pid ${c.pid}) ended with ${how} while its job ran`);
    }
    // Once all are gone (and none was started since), the namespace goes too.
    if (!sp.launching && sp.children.every((x) => x.exit)) void this.terminate(sp);
  }

  /** Ends the parent's job as a failed process would, unless it has ended already. */
  private failJob(sp: Spawned, message: string): void {
    const { rm } = this.o;
    try {
      if (!isActive(rm.getJob(sp.jobId).state)) return;
      const { nspace, rank } = sp.anchor;
      if (rm.isPoolNamespace(nspace)) rm.poolAbort(nspace, rank, Status.ERR_PROC_ABORTED, message);
      else rm.abort(nspace, rank, Status.ERR_PROC_ABORTED, message);
    } catch (err) {
      this.o.log?.('debug', 'a spawned process ended after its job', { nspace: sp.nspace, err: String(err) });
    }
  }

  /** A spawned process's MPI library reached the server. */
  connected(nspace: string, rank: number): void {
    this.o.log?.('debug', 'spawned process connected', { nspace, rank });
  }

  finalized(nspace: string, rank: number): void {
    const c = this.byNs.get(nspace)?.children.find((x) => x.rank === rank);
    if (c) c.finalized = true;
  }

  /** MPI_Abort in a spawned process: its job is aborted (and its processes with it). */
  abort(proc: Proc, status: number, message: string): void {
    const sp = this.byNs.get(proc.nspace);
    if (!sp) return;
    this.failJob(sp, `spawned process ${proc.nspace}:${proc.rank} called MPI_Abort (${status}): ${message}`);
    void this.terminate(sp);
  }

  /** The job ended (completed, failed, aborted, deleted): its spawned processes go. */
  jobEnded(jobId: string): void {
    for (const sp of this.byNs.values()) if (sp.jobId === jobId) void this.terminate(sp);
  }

  /**
   * SIGTERM to each living child's process group, SIGKILL after killGraceMs, then (once every
   * one has been reaped, or a bound later) the namespace is deregistered.
   */
  private terminate(sp: Spawned): Promise<void> {
    sp.ending = true;
    sp.gone ??= (async () => {
      const grace = this.o.killGraceMs ?? 5000;
      const living = sp.children.filter((c) => !c.exit);
      for (const c of living) signalGroup(c.pid, 'SIGTERM');
      const reaped = Promise.all(living.map((c) => c.exited));
      if (!(await within(reaped, grace))) {
        for (const c of living.filter((x) => !x.exit)) signalGroup(c.pid, 'SIGKILL');
        if (!(await within(reaped, 5000))) {
          this.o.log?.('error', 'spawned processes did not end after SIGKILL', {
            nspace: sp.nspace,
            pids: living.filter((x) => !x.exit).map((x) => x.pid),
          });
        }
      }
      // libpmix must have seen each connection close before its client is deregistered
      // (pmix-clients.ts says why).
      const { clients, server } = this.o;
      if (!(await clients.drained(sp.nspace, this.o.drainTimeoutMs ?? 10_000))) {
        server.disconnectClients(sp.nspace);
        if (!(await clients.drained(sp.nspace, 2000))) clients.forget(sp.nspace);
      }
      const ranks = Array.from({ length: sp.ranks }, (_, r) => r);
      await teardownNamespace(server, sp.nspace, ranks, join(this.o.tmpdir, 'spawned', sp.nspace), (what, err) =>
        this.o.log?.('debug', `spawned namespace teardown: ${what}`, { nspace: sp.nspace, err: String(err) }),
      ).catch((err: unknown) =>
        this.o.log?.('warn', 'spawned namespace teardown failed', { nspace: sp.nspace, err: String(err) }),
      );
      this.byNs.delete(sp.nspace);
    })();
    return sp.gone;
  }

  /** The sidecar stops: every spawned process is terminated and reaped, within a bound. */
  async close(timeoutMs = 12_000): Promise<void> {
    this.closed = true;
    await within(Promise.all([...this.byNs.values()].map((sp) => this.terminate(sp))), timeoutMs);
  }
}

/** Variables that would make a child join something other than its own namespace. */
const LAUNCHER_VAR = /^(PMIX_|PMI_|OMPI_|OPAL_|PRTE_|PRRTE_|DASK_PMIX_|MPIR_CVAR_|I_MPI_)/;

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const done = await Promise.race([
    p.then(() => true),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    }),
  ]);
  clearTimeout(timer);
  return done;
}

/** Whether `host` (a worker's host name or address) is this machine. */
export function isLocalHost(host: string): boolean {
  const h = host.toLowerCase();
  const me = hostname().toLowerCase();
  if (h === 'localhost' || h === me || h === me.split('.')[0] || me === h.split('.')[0]) return true;
  if (h.startsWith('127.') || h === '::1') return true;
  return Object.values(networkInterfaces()).some((addrs) => (addrs ?? []).some((x) => x.address.toLowerCase() === h));
}
