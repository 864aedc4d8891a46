// The sidecar: the composition root that wires the embedded PMIx server's upcalls to the
// resource manager, installs the protocol backends, and serves the REST API.
import type { Socket } from 'node:net';
import { hostname } from 'node:os';
import pino from 'pino';
import { Metrics } from '../api/metrics.js';
import { type Api, buildApi } from '../api/server.js';
import { KEEPALIVE, type KeepAlive, PmixServer, setKeepAlive } from '../pmix/index.js';
import { StatusName } from '../pmix/status.js';
import { defaultPolicy } from '../policy/index.js';
import { type CohortOptions, isActive, type JobBackend, ResourceManager } from '../rm/index.js';
import type { RmLimits } from '../rm/manager.js';
import { trimAfterActivity } from './allocator-trim.js';
import { DEFAULT_MEMBER_ENV } from './default-env.js';
import { type Persisted, persist } from './persistence.js';
import { PmiBackend } from './pmi-backend.js';
import { PmiWorlds } from './pmi-worlds.js';
import { PmixBackend } from './pmix-backend.js';
import { PmixClients } from './pmix-clients.js';
import { pmixHandlers } from './pmix-handlers.js';
import { PmixPool } from './pmix-pool.js';
import { PmixSpawner, type SpawnLimits } from './pmix-spawn.js';

export interface SidecarOptions {
  /** REST bind address (default 127.0.0.1) and port (default 8790; 0 picks one). */
  host?: string;
  port?: number;
  /** Without a token every route is open (`serve` always has one unless --no-auth). */
  token?: string;
  /** Reads of workers, psets, jobs and events without the token. */
  openReads?: boolean;
  /** Where process sets and job history persist; none: memory only. */
  stateDir?: string;
  /** Bounds on workers, psets and name-service entries (RM_LIMITS has the defaults). */
  limits?: Partial<RmLimits>;
  /** libpmix rendezvous and job session files. */
  tmpdir: string;
  logger?: pino.Logger;
  wiringTimeoutSeconds?: number;
  maxActiveJobs?: number;
  /** Ended jobs kept (GET /v1/jobs, the state directory); the oldest released one goes first. */
  jobHistory?: number;
  releaseGraceMs?: number;
  /** Accept PMIx clients on other hosts over TCP, on these interfaces, at this port. */
  remoteConnections?: boolean;
  tcpIfInclude?: string;
  tcpPort?: number;
  /** Which PMIx tools may connect: those of this process's uid (default), or none. */
  pmixTools?: 'same-uid' | 'refuse';
  /** How long a new PMIx connection may take to send its handshake (default 10 s), and its first byte (default 2 s). */
  pmixHandshakeTimeoutMs?: number;
  pmixFirstByteMs?: number;
  /** How long an ended job's namespace waits for its PMIx clients to disconnect before they are (default 5 min). */
  pmixDrainTimeoutMs?: number;
  /** TCP keepalive on PMIx clients' and PMI members' connections (default KEEPALIVE), or false for none. */
  keepAlive?: KeepAlive | false;
  /** Bounds on the processes MPI_Comm_spawn starts (DEFAULT_SPAWN_LIMITS: 64 per spawn, 64 alive per job). */
  spawnLimits?: Partial<SpawnLimits>;
  /** Replaces the OMPI_MCA_* settings every Open MPI member gets. */
  ompiEnv?: Record<string, string>;
  /**
   * Ranks per epoch of the in-process pool for Open MPI (registered in the background at start;
   * default 0: no pool, every job runs in fork mode).
   */
  poolSize?: number;
  /**
   * How the workers that join the pool together on one host become a cohort that shares memory
   * (src/rm/pool.ts; default: none, every rank alone on its own virtual node).
   */
  poolCohort?: CohortOptions;
  /**
   * The PMI-1/PMI-2 listener for MPICH and Intel MPI jobs (default: on, 127.0.0.1, any port);
   * false leaves those implementations out.
   */
  pmi?: false | { host?: string; port?: number; advertisedHost?: string; extraEnv?: Record<string, string> };
  /**
   * More protocol backends (the PMI-1/PMI-2 server for MPICH and Intel MPI), made once the core
   * exists: they call it back as their clients connect.
   */
  backends?: (rm: ResourceManager) => JobBackend[] | Promise<JobBackend[]>;
  version?: string;
}

export class Sidecar {
  private stopping: Promise<'stopped' | 'timed-out'> | undefined;

  private constructor(
    readonly rm: ResourceManager,
    readonly pmix: PmixServer,
    /** PMIx clients that still hold a connection, by namespace. */
    readonly pmixClients: PmixClients,
    readonly api: Api,
    readonly url: string,
    readonly log: pino.Logger,
    /** Starts and ends the processes of Open MPI ranks' MPI_Comm_spawn. */
    readonly spawner: PmixSpawner,
    /** Stops what runs beside the jobs: the state store's writes, the allocator's trim. */
    private readonly closeHousekeeping?: () => void,
  ) {}

  static async start(opts: SidecarOptions): Promise<Sidecar> {
    const log = opts.logger ?? pino({ level: 'silent' });
    let metrics: Metrics | undefined;
    const rm = new ResourceManager({
      policy: defaultPolicy({
        ...(opts.maxActiveJobs !== undefined ? { maxActiveJobs: opts.maxActiveJobs } : {}),
        ...(opts.releaseGraceMs !== undefined ? { releaseGraceMs: opts.releaseGraceMs } : {}),
      }),
      ...(opts.wiringTimeoutSeconds !== undefined ? { wiringTimeoutSeconds: opts.wiringTimeoutSeconds } : {}),
      ...(opts.jobHistory !== undefined ? { historySize: opts.jobHistory } : {}),
      onCollective: (name, seconds, outcome) =>
        metrics?.collectiveSeconds.observe({ name: name.replace(/:.*/, ''), outcome }, seconds),
      onError: (what, err) => log.warn({ err, what }, 'the core survived an error'),
      onJobForgotten: (job) => persisted?.store.deleteJob(job.id),
      ...(opts.limits ? { limits: opts.limits } : {}),
    });
    // Psets and job history from the state directory, before anything else can change them.
    let persisted: Persisted | undefined;
    if (opts.stateDir) {
      const p = await persist(rm, opts.stateDir, log);
      if (p instanceof Error) {
        log.error(
          { err: p, stateDir: opts.stateDir },
          'the state store cannot be opened: psets and job history will not survive a restart',
        );
      } else {
        persisted = p;
        const r = p.restored;
        if (r.psets || r.jobs) log.info({ stateDir: opts.stateDir, ...r }, 'restored the state of an earlier run');
      }
    }
    // Event numbers start above any an earlier run of this sidecar can have used (microseconds
    // since the epoch: a run emits far fewer events than that), so a reader that reconnects with
    // the Last-Event-ID of an earlier run is told to resync rather than handed unrelated events.
    rm.events.startAfter(Date.now() * 1000);
    metrics = new Metrics(rm);
    rm.events.subscribe((e) => {
      const ev = e.event;
      if (ev.kind === 'jobStateChanged')
        log.info({ job: ev.jobId, from: ev.from, to: ev.to, reason: ev.reason }, 'job state');
    });

    // libpmix holds a lost-connection event for its caching window (1 s by default) to batch
    // losses, so a job would fail about a second after a member dies. The member that ended a job
    // is marked (endedJob), so nothing needs that second: losses are reported at once unless the
    // operator sets the window.
    process.env.PMIX_MCA_pmix_event_caching_window ??= '0';
    const clients = new PmixClients();
    let spawner: PmixSpawner | undefined;
    const pmix = await PmixServer.start({
      tmpdir: opts.tmpdir,
      handlers: pmixHandlers({
        rm,
        clients,
        spawner: () => spawner,
        log: (level, msg, fields) => log[level](fields ?? {}, msg),
      }),
      // A rank of a job that has ended is refused before libpmix sees it (it would otherwise be
      // accepted and then have to be refused from the connected upcall); so is a pool rank that
      // no worker is joining with (retired, or already connected).
      admitClient: (proc) => {
        if (rm.isPoolNamespace(proc.nspace)) return rm.poolRefusal(proc.nspace, proc.rank);
        const job = rm.jobByNamespace(proc.nspace);
        return job && !isActive(job.state) ? `job ${job.id} is ${job.state}` : undefined;
      },
      onRefused: (reason, peer) => log.warn({ peer, reason }, 'PMIx connection refused'),
      onStrangers: (closed) => log.warn({ closed }, 'shut down connections that reached libpmix without the gate'),
      onStallChange: (stalled, ms) => {
        (stalled ? log.error.bind(log) : log.warn.bind(log))(
          { stalledMs: ms },
          stalled ? 'libpmix has stopped progressing' : 'libpmix progresses again',
        );
        rm.events.emit({
          kind: 'healthChanged',
          status: stalled ? 'pmix-stalled' : 'ok',
          pmixStalledSeconds: ms / 1000,
        });
      },
      ...(opts.remoteConnections ? { remoteConnections: true } : {}),
      ...(opts.tcpIfInclude ? { tcpIfInclude: opts.tcpIfInclude } : {}),
      ...(opts.tcpPort !== undefined ? { tcpPort: opts.tcpPort } : {}),
      ...(opts.pmixTools ? { tools: opts.pmixTools } : {}),
      ...(opts.pmixHandshakeTimeoutMs !== undefined ? { handshakeTimeoutMs: opts.pmixHandshakeTimeoutMs } : {}),
      ...(opts.pmixFirstByteMs !== undefined ? { firstByteMs: opts.pmixFirstByteMs } : {}),
      ...(opts.keepAlive !== undefined ? { keepAlive: opts.keepAlive } : {}),
      observer: (name, status, seconds) => {
        metrics!.upcalls.inc({ upcall: name, status: StatusName[status] ?? String(status) });
        metrics!.upcallSeconds.observe({ upcall: name }, seconds);
      },
      onHandlerError: (name, err) => log.error({ err, upcall: name }, 'PMIx upcall handler failed'),
    });
    try {
      const ompiEnv = opts.ompiEnv ?? { ...DEFAULT_MEMBER_ENV.openmpi };
      const onError = (what: string, err: unknown) => log.warn({ err, what }, 'PMIx backend call failed');
      const backend = new PmixBackend({
        server: pmix,
        clients,
        tmpdir: opts.tmpdir,
        ompiEnv,
        onError,
        ...(opts.pmixDrainTimeoutMs !== undefined ? { drainTimeoutMs: opts.pmixDrainTimeoutMs } : {}),
      });
      rm.addBackend(backend);
      spawner = new PmixSpawner({
        server: pmix,
        rm,
        clients,
        tmpdir: opts.tmpdir,
        ompiEnv,
        ...(opts.spawnLimits ? { limits: opts.spawnLimits } : {}),
        log: (level, msg, fields) => log[level](fields ?? {}, msg),
      });
      metrics.watchGate(
        () => pmix.gateStats,
        () => backend.lingering.length,
      );
      metrics.watchAllocator(() => PmixServer.allocatorStats());
      if (opts.poolSize) {
        rm.installPool(
          opts.poolSize,
          new PmixPool({ server: pmix, clients, tmpdir: opts.tmpdir, ompiEnv, onError }),
          opts.poolCohort,
        );
        const t0 = performance.now();
        rm.pool!.start().then(
          () => log.info({ size: opts.poolSize, seconds: (performance.now() - t0) / 1000 }, 'in-process pool ready'),
          (err: unknown) => log.error({ err }, 'the in-process pool could not be opened'),
        );
      }
      if (opts.pmi !== false) {
        const p = opts.pmi ?? {};
        const pmi = await PmiBackend.start({
          rm,
          ...(p.host ? { host: p.host } : {}),
          ...(p.port !== undefined ? { port: p.port } : {}),
          ...(p.advertisedHost ? { advertisedHost: p.advertisedHost } : {}),
          ...(p.extraEnv ? { extraEnv: p.extraEnv } : {}),
          ...(opts.keepAlive !== false
            ? { onTcpConnection: (socket: Socket) => setKeepAlive(socket, opts.keepAlive || KEEPALIVE) }
            : {}),
          onError: (what, err) => log.warn({ err, what }, 'PMI backend call failed'),
        });
        rm.addBackend(pmi);
        // MPICH / Intel MPI worker processes join in-process jobs as worlds of their own.
        if (opts.poolSize) rm.installWorlds(new PmiWorlds(rm, pmi));
        log.info({ pmiPort: pmi.pmiPort }, 'PMI-1/PMI-2 listener ready');
      }
      for (const b of (await opts.backends?.(rm)) ?? []) rm.addBackend(b);
      const api = await buildApi({
        rm,
        metrics,
        ...(opts.token ? { token: opts.token } : {}),
        ...(opts.openReads ? { openReads: true } : {}),
        version: opts.version ?? '0.0.0',
        pmixVersion: PmixServer.libraryVersion(),
        pmixProgress: () => pmix.progress(),
        logger: log,
      });
      const host = opts.host ?? '127.0.0.1';
      await api.app.listen({ host, port: opts.port ?? 8790 });
      const addr = api.app.server.address();
      const port = typeof addr === 'object' && addr ? addr.port : (opts.port ?? 8790);
      const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
      log.info(
        {
          url,
          tmpdir: opts.tmpdir,
          host: hostname(),
          impls: rm.impls,
          pmix: pmix.uri,
          libpmixSocket: pmix.libpmixSocket,
        },
        'dask-pmix sidecar listening',
      );
      const stopTrim = trimAfterActivity(
        () => rm.jobsCreated,
        () => PmixServer.allocatorTrim(),
      );
      return new Sidecar(rm, pmix, clients, api, url, log, spawner, () => {
        stopTrim();
        persisted?.stop();
      });
    } catch (err) {
      // e.g. the REST port is taken: close what was opened, so the process can exit.
      await rm.shutdown('the sidecar failed to start').catch(() => undefined);
      await spawner?.close();
      persisted?.stop();
      await pmix.stop();
      throw err;
    }
  }

  /**
   * Stops: new jobs are refused, active ones aborted with notice to their members and
   * released, the REST server closed, libpmix finalized. Bounded: resolves 'timed-out' when
   * that did not finish within `timeoutMs` (a wedged libpmix), and the process must then end
   * with PmixServer.exitNow.
   */
  stop(reason = 'the sidecar is stopping', timeoutMs = 15_000): Promise<'stopped' | 'timed-out'> {
    this.stopping ??= (async () => {
      this.log.info({ reason }, 'stopping');
      const deadline = Date.now() + timeoutMs;
      const within = <T>(p: Promise<T>) => bounded(p, Math.max(0, deadline - Date.now()));
      const drained = await within(this.rm.shutdown(reason));
      this.log.debug({ drained: drained !== TIMED_OUT }, 'jobs released');
      // Spawned processes end before libpmix does (their jobs' end has already signalled them).
      await within(this.spawner.close(Math.max(1000, deadline - Date.now() - 2000)));
      this.closeHousekeeping?.();
      this.api.closeStreams();
      await within(this.api.app.close());
      this.log.debug('REST closed');
      const pmix = await this.pmix.stop(Math.max(1000, deadline - Date.now()));
      this.log.debug({ pmix }, 'PMIx server stopped');
      return drained === TIMED_OUT || pmix === 'timed-out' ? 'timed-out' : 'stopped';
    })();
    return this.stopping;
  }

  /** Ends the process at once, for a stop that timed out (libpmix's threads would keep it alive). */
  exitNow(code: number): never {
    return PmixServer.exitNow(code);
  }
}

const TIMED_OUT = Symbol('timed out');

function bounded<T>(p: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.catch(() => undefined as T),
    new Promise<typeof TIMED_OUT>((resolve) => {
      timer = setTimeout(() => resolve(TIMED_OUT), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
