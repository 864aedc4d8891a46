// PmixServer: the typed face of the embedded libpmix server.
//
// Each upcall libpmix makes reaches at most one handler, which returns a Promise: its value
// answers the client, and a rejection answers it with the error's PMIx status (PmixError) or
// PMIX_ERROR. A failing handler never takes the server down. Upcalls without a handler are
// answered PMIX_ERR_NOT_SUPPORTED by libpmix itself.
import { mkdirSync } from 'node:fs';
import { loadNative, type NativeBinding } from './native.js';
import { Keys } from './keys.js';
import { PmixError, Status } from './status.js';
import { info, v, type Info, type Proc, type Value } from './values.js';

export interface ClientConnectedArgs { proc: Proc; info: Info[] }
export interface ProcArgs { proc: Proc }
export interface AbortArgs { proc: Proc; status: number; message: string; procs: Proc[] }
export interface FenceArgs { procs: Proc[]; info: Info[]; data: Buffer }
export interface DirectModexArgs { proc: Proc; info: Info[] }
export interface PublishArgs { proc: Proc; info: Info[] }
export interface LookupArgs { proc: Proc; keys: string[]; info: Info[] }
export interface UnpublishArgs { proc: Proc; keys: string[]; info: Info[] }
export interface App { cmd: string; argv: string[]; env: string[]; cwd: string; maxprocs: number; info: Info[] }
export interface SpawnArgs { proc: Proc; jobInfo: Info[]; apps: App[] }
export interface ConnectArgs { procs: Proc[]; info: Info[] }
export interface EventsArgs { codes: number[]; info: Info[] }
export interface NotifyEventArgs { status: number; source: Proc | null; range: number; info: Info[] }
export interface Query { keys: string[]; qualifiers: Info[] }
export interface QueryArgs { proc: Proc | null; queries: Query[] }
export interface ToolConnectedArgs { info: Info[] }
export interface LogArgs { proc: Proc; data: Info[]; directives: Info[] }
export interface RequestArgs { proc: Proc; directives: Info[] }
export interface GroupArgs { op: 'construct' | 'destruct' | 'none'; group: string; procs: Proc[]; directives: Info[] }
export interface PublishedDatum { proc: Proc; key: string; value: Value }
/**
 * An event libpmix raises inside the server (not an upcall): PMIX_ERR_LOST_CONNECTION (or
 * UNREACH, PROC_TERM_WO_SYNC) when a client's connection dropped before it finalized. libpmix
 * batches losses within its event window: further lost procs come as PMIX_PROCID infos.
 */
export interface LocalEventArgs { status: number; source: Proc | null; info: Info[] }

/** One optional handler per pmix_server_module_t upcall. */
export interface UpcallHandlers {
  clientConnected?(a: ClientConnectedArgs): Promise<void>;
  clientFinalized?(a: ProcArgs): Promise<void>;
  abort?(a: AbortArgs): Promise<void>;
  fence?(a: FenceArgs): Promise<Buffer>;
  directModex?(a: DirectModexArgs): Promise<Buffer>;
  publish?(a: PublishArgs): Promise<void>;
  lookup?(a: LookupArgs): Promise<PublishedDatum[]>;
  unpublish?(a: UnpublishArgs): Promise<void>;
  spawn?(a: SpawnArgs): Promise<string>;
  connect?(a: ConnectArgs): Promise<void>;
  disconnect?(a: ConnectArgs): Promise<void>;
  registerEvents?(a: EventsArgs): Promise<void>;
  deregisterEvents?(a: EventsArgs): Promise<void>;
  notifyEvent?(a: NotifyEventArgs): Promise<void>;
  query?(a: QueryArgs): Promise<Info[]>;
  toolConnected?(a: ToolConnectedArgs): Promise<Proc>;
  log?(a: LogArgs): Promise<void>;
  allocate?(a: RequestArgs & { directive: number }): Promise<Info[]>;
  jobControl?(a: RequestArgs & { targets: Proc[] }): Promise<Info[]>;
  monitor?(a: RequestArgs & { monitor: Info; error: number }): Promise<Info[]>;
  getCredential?(a: RequestArgs): Promise<{ credential: Buffer; info?: Info[] }>;
  validateCredential?(a: RequestArgs & { credential: Buffer }): Promise<Info[]>;
  iofPull?(a: ConnectArgs & { channels: number }): Promise<void>;
  pushStdin?(a: { source: Proc; targets: Proc[]; directives: Info[]; data: Buffer }): Promise<void>;
  group?(a: GroupArgs): Promise<Info[]>;
  fabric?(a: RequestArgs & { op: number }): Promise<Info[]>;
  sessionControl?(a: RequestArgs & { sessionId: number }): Promise<Info[]>;
  /** Events libpmix raises in the server about its clients; the answer is ignored. */
  localEvent?(a: LocalEventArgs): Promise<void>;
}

export type UpcallName = keyof UpcallHandlers;

/** Observes every upcall, e.g. for metrics; `status` is what the client was answered. */
export type UpcallObserver = (name: UpcallName, status: number, seconds: number, error?: unknown) => void;

export interface PmixServerOptions {
  /** Directory for libpmix's rendezvous files; created if missing. */
  tmpdir: string;
  handlers: UpcallHandlers;
  /** Accept clients on other hosts over TCP (PMIX_SERVER_REMOTE_CONNECTIONS). */
  remoteConnections?: boolean;
  /** Interfaces or subnets to listen on, e.g. "eth0" or "10.0.0.0/24". */
  tcpIfInclude?: string;
  /** Fixed IPv4 port for the listener; libpmix picks one when omitted. */
  tcpPort?: number;
  serverNspace?: string;
  serverRank?: number;
  observer?: UpcallObserver;
  /** Called when a handler fails, with the upcall name and the error. */
  onHandlerError?: (name: UpcallName, err: unknown) => void;
}

let active: PmixServer | undefined;

export class PmixServer {
  private readonly native: NativeBinding;
  private stopped = false;

  private constructor(native: NativeBinding) {
    this.native = native;
  }

  /** Initializes libpmix as a server. Only one can run per process (a libpmix limit). */
  static start(opts: PmixServerOptions): PmixServer {
    if (active) throw new Error('a PMIx server is already running in this process');
    const native = loadNative();
    mkdirSync(opts.tmpdir, { recursive: true });
    // Clients may sit on other hosts, where the shared-memory datastore cannot reach: use hash.
    process.env.PMIX_MCA_gds ??= 'hash';
    const serverInfo: Info[] = [
      info(Keys.SERVER_TMPDIR, v.string(opts.tmpdir)),
      info(Keys.SYSTEM_TMPDIR, v.string(opts.tmpdir)),
    ];
    if (opts.serverNspace) serverInfo.push(info(Keys.SERVER_NSPACE, v.string(opts.serverNspace)));
    if (opts.serverRank !== undefined) serverInfo.push(info(Keys.SERVER_RANK, v.rank(opts.serverRank)));
    if (opts.remoteConnections) serverInfo.push(info(Keys.SERVER_REMOTE_CONNECTIONS, v.bool(true)));
    if (opts.tcpIfInclude) serverInfo.push(info(Keys.TCP_IF_INCLUDE, v.string(opts.tcpIfInclude)));
    if (opts.tcpPort !== undefined) serverInfo.push(info(Keys.TCP_IPV4_PORT, v.int(opts.tcpPort)));

    const handlers = opts.handlers as Record<string, ((a: unknown) => Promise<unknown>) | undefined>;
    const names = native.upcallNames().filter((n) => typeof handlers[n] === 'function');
    const server = new PmixServer(native);
    native.init({
      info: serverInfo,
      upcalls: names,
      // libpmix 5.0.11 hands a local group destruct to the host twice with one tracker, and
      // answering both corrupts it; answered at once, libpmix completes the destruct itself.
      immediate: ['group.destruct'],
      handler: (name, args, done) => server.dispatch(opts, name as UpcallName, handlers[name], args, done),
    });
    active = server;
    return server;
  }

  private dispatch(
    opts: PmixServerOptions,
    name: UpcallName,
    handler: ((a: unknown) => Promise<unknown>) | undefined,
    args: unknown,
    done: (status?: number, result?: unknown) => void,
  ): void {
    const t0 = performance.now();
    const answer = (status: number, result?: unknown, error?: unknown) => {
      try {
        done(status, result);
      } catch (err) {
        // The handler's result could not be converted; the client has been answered with an error.
        opts.onHandlerError?.(name, err);
        status = Status.ERR_BAD_PARAM;
        error = err;
      }
      opts.observer?.(name, status, (performance.now() - t0) / 1000, error);
    };
    if (!handler) return answer(Status.ERR_NOT_SUPPORTED);
    let pending: Promise<unknown>;
    try {
      pending = Promise.resolve(handler.call(opts.handlers, args));
    } catch (err) {
      pending = Promise.reject(err);
    }
    pending.then(
      (result) => answer(Status.SUCCESS, result),
      (err: unknown) => {
        if (!(err instanceof PmixError)) opts.onHandlerError?.(name, err);
        answer(PmixError.statusOf(err), undefined, err);
      },
    );
  }

  /** The libpmix library version, e.g. "5.0.11". */
  static libraryVersion(): string {
    const full = loadNative().version();
    return /(\d+\.\d+\.\d+)/.exec(full)?.[1] ?? full;
  }

  get running(): boolean {
    return !this.stopped;
  }

  registerNspace(nspace: string, nlocalprocs: number, jobInfo: Info[]): Promise<void> {
    return wrap(() => this.native.registerNspace(nspace, nlocalprocs, jobInfo));
  }

  deregisterNspace(nspace: string): Promise<void> {
    return wrap(() => this.native.deregisterNspace(nspace));
  }

  registerClient(proc: Proc, uid: number, gid: number): Promise<void> {
    return wrap(() => this.native.registerClient(proc, uid, gid));
  }

  deregisterClient(proc: Proc): Promise<void> {
    return wrap(() => this.native.deregisterClient(proc));
  }

  /** The environment a process must set to connect as `proc`. */
  setupFork(proc: Proc): Record<string, string> {
    return sync(() => this.native.setupFork(proc));
  }

  dmodexRequest(proc: Proc): Promise<Buffer> {
    return wrap(() => this.native.dmodexRequest(proc));
  }

  defineProcessSet(name: string, members: Proc[]): Promise<void> {
    return wrap(() => this.native.defineProcessSet(name, members));
  }

  deleteProcessSet(name: string): Promise<void> {
    return wrap(() => this.native.deleteProcessSet(name));
  }

  notifyEvent(status: number, source: Proc, range: number, eventInfo: Info[]): Promise<void> {
    return wrap(() => this.native.notifyEvent(status, source, range, eventInfo));
  }

  generateRegex(input: string): Buffer {
    return sync(() => this.native.generateRegex(input));
  }

  generatePpn(input: string): Buffer {
    return sync(() => this.native.generatePpn(input));
  }

  /** Finalizes libpmix; upcalls still in flight are dropped. */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (active === this) active = undefined;
    this.native.finalize();
  }
}

function toPmixError(err: unknown): unknown {
  if (err instanceof PmixError) return err;
  if (err instanceof Error && typeof (err as { status?: unknown }).status === 'number') {
    const e = new PmixError((err as unknown as { status: number }).status, err.message.replace(/: PMIX_\w+ \(-?\d+\)$/, ''));
    return e;
  }
  return err;
}

/** Runs an async native call; argument errors it throws become rejections too. */
async function wrap<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    throw toPmixError(err);
  }
}

function sync<T>(f: () => T): T {
  try {
    return f();
  } catch (err) {
    throw toPmixError(err);
  }
}
