// PmixServer: the typed face of the embedded libpmix server.
//
// Clients and tools are told to connect to the gate (gate.ts), which admits them (admission.ts)
// before libpmix reads a byte and then hands their sockets to libpmix; libpmix's own listener is
// a UNIX socket in a directory of this uid's (native/src/handoff.cc), so nobody else reaches it.
// A probe through libpmix's progress thread tells whether it still progresses; calls that wait on
// it are bounded.
//
// Each upcall libpmix makes reaches at most one handler, which returns a Promise: its value
// answers the client, and a rejection answers it with the error's PMIx status (PmixError) or
// PMIX_ERROR. A failing handler never takes the server down. Upcalls without a handler are
// answered PMIX_ERR_NOT_SUPPORTED by libpmix itself.
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { BlockList, isIPv4, type Socket } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { admit, ClientRegistry, type ToolPolicy } from './admission.js';
import { type Peer, PmixGate, RETRY_ENV } from './gate.js';
import { PeerFlag } from './handshake.js';
import { KEEPALIVE, type KeepAlive, setKeepAlive } from './keepalive.js';
import { Keys } from './keys.js';
import { loadNative, type NativeBinding } from './native.js';
import { PmixError, Status } from './status.js';
import { findString, findValue, type Info, info, type Proc, type Value, v } from './values.js';

export interface ClientConnectedArgs {
  proc: Proc;
  info: Info[];
}
export interface ProcArgs {
  proc: Proc;
}
export interface AbortArgs {
  proc: Proc;
  status: number;
  message: string;
  procs: Proc[];
}
export interface FenceArgs {
  procs: Proc[];
  info: Info[];
  data: Buffer;
}
export interface DirectModexArgs {
  proc: Proc;
  info: Info[];
}
export interface PublishArgs {
  proc: Proc;
  info: Info[];
}
export interface LookupArgs {
  proc: Proc;
  keys: string[];
  info: Info[];
}
export interface UnpublishArgs {
  proc: Proc;
  keys: string[];
  info: Info[];
}
export interface App {
  cmd: string;
  argv: string[];
  env: string[];
  cwd: string;
  maxprocs: number;
  info: Info[];
}
export interface SpawnArgs {
  proc: Proc;
  jobInfo: Info[];
  apps: App[];
}
export interface ConnectArgs {
  procs: Proc[];
  info: Info[];
}
export interface EventsArgs {
  codes: number[];
  info: Info[];
}
export interface NotifyEventArgs {
  status: number;
  source: Proc | null;
  range: number;
  info: Info[];
}
export interface Query {
  keys: string[];
  qualifiers: Info[];
}
export interface QueryArgs {
  proc: Proc | null;
  queries: Query[];
}
export interface ToolConnectedArgs {
  info: Info[];
}
export interface LogArgs {
  proc: Proc;
  data: Info[];
  directives: Info[];
}
export interface RequestArgs {
  proc: Proc;
  directives: Info[];
}
export interface GroupArgs {
  op: 'construct' | 'destruct' | 'none';
  group: string;
  procs: Proc[];
  directives: Info[];
}
export interface PublishedDatum {
  proc: Proc;
  key: string;
  value: Value;
}
/**
 * An event libpmix raises inside the server (not an upcall): PMIX_ERR_LOST_CONNECTION (or
 * UNREACH, PROC_TERM_WO_SYNC) when a client's connection dropped before it finalized. libpmix
 * batches losses within its event window: further lost procs come as PMIX_PROCID infos.
 */
export interface LocalEventArgs {
  status: number;
  source: Proc | null;
  info: Info[];
}

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
  /** What is known; WithStatus(PMIX_ERR_PARTIAL_SUCCESS, ...) when some keys had no answer. */
  query?(a: QueryArgs): Promise<Info[] | WithStatus<Info[]>>;
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

/** A handler's answer under a status other than success, e.g. PMIX_ERR_PARTIAL_SUCCESS with what was found. */
export class WithStatus<T> {
  constructor(
    readonly status: number,
    readonly result: T,
  ) {}
}

/** Observes every upcall, e.g. for metrics; `status` is what the client was answered. */
export type UpcallObserver = (name: UpcallName, status: number, seconds: number, error?: unknown) => void;

export interface PmixServerOptions {
  /** Directory for libpmix's rendezvous files; created if missing. */
  tmpdir: string;
  handlers: UpcallHandlers;
  /** Accept clients on other hosts over TCP (the gate listens on a routable address). */
  remoteConnections?: boolean;
  /** Interfaces or subnets to listen on, e.g. "eth0" or "10.0.0.0/24" (comma-separated). */
  tcpIfInclude?: string;
  /** Fixed IPv4 port for the listener clients connect to; one is picked when omitted. */
  tcpPort?: number;
  /** Which tools may connect (default 'same-uid': those of this process's uid and gid). */
  tools?: ToolPolicy;
  /** A further say on a registered client that connects, e.g. that its job has ended: a reason to refuse. */
  admitClient?(proc: Proc): string | undefined;
  /** How long a new connection may take to send its handshake (default 10 s), and its first byte (default 2 s). */
  handshakeTimeoutMs?: number;
  firstByteMs?: number;
  /** Connections still sending their handshake, per peer (a uid on this host, else an address; default 64) and in all (default 512). */
  maxPendingPerPeer?: number;
  maxPending?: number;
  /** TCP keepalive on clients' connections (default: see KEEPALIVE), or false for none. */
  keepAlive?: KeepAlive | false;
  /** Told of every connection the gate refuses. */
  onRefused?(reason: string, peer: string): void;
  /** How often libpmix's progress thread is probed (default 1000 ms; 0: never). */
  probeIntervalMs?: number;
  /** Called when libpmix's progress thread turns stalled (stallAfterMs without answering), and when it answers again. */
  onStallChange?(stalled: boolean, stalledMs: number): void;
  /** After how long without progress libpmix counts as stalled (default 5000 ms). */
  stallAfterMs?: number;
  /** Bound on every call that waits for libpmix (default 30 s). */
  callTimeoutMs?: number;
  /** Told when connections that bypassed the gate were shut down to unblock libpmix. */
  onStrangers?(closed: number): void;
  serverNspace?: string;
  serverRank?: number;
  observer?: UpcallObserver;
  /** Called when a handler fails, with the upcall name and the error. */
  onHandlerError?: (name: UpcallName, err: unknown) => void;
}

let active: PmixServer | undefined;

export interface PmixProgress {
  /** How long libpmix's progress thread has left the latest probe unanswered (0: it answered). */
  stalledMs: number;
  stalled: boolean;
  lastRoundTripMs: number;
}

export class PmixServer {
  private readonly native: NativeBinding;
  private stopped = false;
  private readonly registry = new ClientRegistry();
  private gate!: PmixGate;
  /** libpmix's own URI and the gate's, as they appear in PMIX_SERVER_URI* values. */
  private innerUri = '';
  private outerUri = '';
  /** The private directory of libpmix's UNIX listener. */
  private listenerDir = '';
  private probe: NodeJS.Timeout | undefined;
  private waitingMs = 0;
  private lastRoundTripMs = 0;
  private nextTool = 0;

  private constructor(
    native: NativeBinding,
    private readonly opts: PmixServerOptions,
  ) {
    this.native = native;
  }

  /** Initializes libpmix as a server and opens the gate. Only one can run per process (a libpmix limit). */
  static async start(opts: PmixServerOptions): Promise<PmixServer> {
    if (active) throw new Error('a PMIx server is already running in this process');
    const native = loadNative();
    mkdirSync(opts.tmpdir, { recursive: true });
    // Clients may sit on other hosts, where the shared-memory datastore cannot reach: use hash.
    process.env.PMIX_MCA_gds ??= 'hash';
    // libpmix listens on loopback until its listener is replaced (openGate).
    const serverInfo: Info[] = [
      info(Keys.SERVER_TMPDIR, v.string(opts.tmpdir)),
      info(Keys.SYSTEM_TMPDIR, v.string(opts.tmpdir)),
    ];
    if (opts.serverNspace) serverInfo.push(info(Keys.SERVER_NSPACE, v.string(opts.serverNspace)));
    if (opts.serverRank !== undefined) serverInfo.push(info(Keys.SERVER_RANK, v.rank(opts.serverRank)));

    const handlers = { ...opts.handlers } as Record<string, ((a: unknown) => Promise<unknown>) | undefined>;
    const server = new PmixServer(native, opts);
    // libpmix 5.0.11 crashes when a tool is refused after the gate let it in, or when no host
    // upcall names it: the gate refuses, this only names.
    handlers.toolConnected ??= async (a) => server.toolIdentity((a as ToolConnectedArgs).info);
    const names = native.upcallNames().filter((n) => typeof handlers[n] === 'function');
    active = server;
    try {
      native.init({
        info: serverInfo,
        upcalls: names,
        // libpmix 5.0.11 hands a local group destruct to the host twice with one tracker, and
        // answering both corrupts it; answered at once, libpmix completes the destruct itself.
        immediate: ['group.destruct'],
        handler: (name, args, done) => server.dispatch(opts, name as UpcallName, handlers[name], args, done),
      });
      await server.openGate();
    } catch (err) {
      active = undefined;
      await native.finalize().catch(() => undefined);
      throw err;
    }
    server.startProbe();
    return server;
  }

  private async openGate(): Promise<void> {
    const uri =
      this.native.setupFork({ nspace: this.opts.serverNspace ?? 'dask-pmix-uri', rank: 0 }).PMIX_SERVER_URI41 ?? '';
    const m = /tcp4:\/\/127\.0\.0\.1:(\d+)/.exec(uri);
    if (!m) throw new Error(`libpmix does not listen on IPv4 loopback (its URI is '${uri}')`);
    this.innerUri = m[0];
    // mkdtemp makes the directory 0700: only this uid can connect to the socket in it. A UNIX
    // socket's path has at most 107 bytes: a longer TMPDIR gives way to /tmp.
    this.listenerDir = mkdtempSync(join(tmpdir().length <= 80 ? tmpdir() : '/tmp', 'dask-pmix-pmix-'));
    try {
      this.native.secureListener(Number(m[1]), join(this.listenerDir, 'l'));
    } catch (err) {
      rmSync(this.listenerDir, { recursive: true, force: true });
      throw err;
    }
    const self = { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
    const keepAlive = this.opts.keepAlive === false ? undefined : (this.opts.keepAlive ?? KEEPALIVE);
    const o = this.opts;
    this.gate = await PmixGate.listen({
      host: gateHost(o),
      ...(o.tcpPort !== undefined ? { port: o.tcpPort } : {}),
      ...(o.handshakeTimeoutMs !== undefined ? { handshakeTimeoutMs: o.handshakeTimeoutMs } : {}),
      ...(o.firstByteMs !== undefined ? { firstByteMs: o.firstByteMs } : {}),
      ...(o.maxPendingPerPeer !== undefined ? { maxPendingPerPeer: o.maxPendingPerPeer } : {}),
      ...(o.maxPending !== undefined ? { maxPending: o.maxPending } : {}),
      admit: (h, peer) =>
        admit(h, this.registry, {
          tools: o.tools ?? 'same-uid',
          self,
          ...(o.admitClient ? { client: o.admitClient } : {}),
          ...(peer.uid !== undefined ? { peerUid: peer.uid } : {}),
        }),
      peerOf: (sock) => this.peerOf(sock),
      // libpmix that has not answered two probes would only queue the peer: it is asked to retry.
      busy: () =>
        this.waitingMs >= Math.max(2000, 2 * (o.probeIntervalMs ?? 1000))
          ? `libpmix has not progressed for ${this.waitingMs} ms`
          : undefined,
      ...(o.onRefused ? { onRefused: o.onRefused } : {}),
      handOver: (fd, first, h) => {
        if (keepAlive) setKeepAlive(fd, keepAlive);
        // A client's connection is known by its namespace, for disconnectClients.
        this.native.handOff(fd, first, h.flag === PeerFlag.SIMPLE_CLIENT && h.proc ? h.proc.nspace : '');
      },
    });
    this.outerUri = `tcp4://${this.gate.host}:${this.gate.port}`;
  }

  /** A peer on this host is the uid owning its socket (whatever address it comes from); one elsewhere, its address. */
  private peerOf(sock: Socket): Peer {
    const { localAddress, localPort, remoteAddress, remotePort } = sock;
    if (localAddress && localPort && remoteAddress && remotePort) {
      const uid = this.native.peerUid(localAddress, localPort, remoteAddress, remotePort);
      if (uid >= 0) return { key: `uid ${uid}`, uid };
    }
    return { key: `host ${remoteAddress}` };
  }

  private startProbe(): void {
    const every = this.opts.probeIntervalMs ?? 1000;
    if (every <= 0) return;
    this.probe = setInterval(() => {
      const p = this.native.progressProbe();
      const wasStalled = this.progress().stalled;
      this.waitingMs = p.waitingMs;
      this.lastRoundTripMs = p.lastRoundTripMs;
      const stalled = this.progress().stalled;
      if (stalled !== wasStalled) this.opts.onStallChange?.(stalled, p.waitingMs);
      // A connection of this uid's that reached libpmix's listener without the gate can hold its
      // progress thread in a blocking read: shut those down once it has stopped answering.
      if (p.waitingMs >= Math.min(every, 1000)) {
        const closed = this.native.closeStrangers();
        if (closed > 0) this.opts.onStrangers?.(closed);
      }
    }, every);
    this.probe.unref();
  }

  /** Whether libpmix's progress thread still answers. */
  progress(): PmixProgress {
    const stalled = this.waitingMs >= (this.opts.stallAfterMs ?? 5000);
    return { stalledMs: this.waitingMs, stalled, lastRoundTripMs: this.lastRoundTripMs };
  }

  /** Where clients and tools connect (the gate), as "tcp4://host:port". */
  get uri(): string {
    return this.outerUri;
  }

  /** libpmix's own listener (a UNIX socket only this uid can reach), behind the gate: for diagnostics. */
  get libpmixSocket(): string {
    return join(this.listenerDir, 'l');
  }

  /**
   * Gate counters: connections admitted, refused (evicted and timed out included), closed for
   * newer ones at a bound, timed out before their handshake, asked to retry; and what became of the admitted ones:
   * handed to libpmix, relayed (they could not be handed over), refused by libpmix, dropped.
   */
  get gateStats(): Readonly<{
    admitted: number;
    refused: number;
    timedOut: number;
    evicted: number;
    retried: number;
    pending: number;
    handedOff: number;
    relayed: number;
    libpmixRefused: number;
    dropped: number;
  }> {
    const h = this.native.handoffStats();
    return {
      ...this.gate.stats,
      pending: this.gate.pendingHandshakes,
      handedOff: h.handedOff,
      relayed: h.relayed,
      libpmixRefused: h.refused,
      dropped: h.dropped,
    };
  }

  private toolIdentity(items: Info[]): Proc {
    const nspace = findString(items, Keys.NSPACE);
    const rank = findValue(items, Keys.RANK);
    if (nspace) return { nspace, rank: rank && typeof rank.value === 'number' ? rank.value : 0 };
    return { nspace: `${this.opts.serverNspace ?? 'dask-pmix'}-tool-${++this.nextTool}`, rank: 0 };
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
    if (!handler) {
      answer(Status.ERR_NOT_SUPPORTED);
      return;
    }
    let pending: Promise<unknown>;
    try {
      pending = Promise.resolve(handler.call(opts.handlers, args));
    } catch (err) {
      pending = Promise.reject(err);
    }
    pending.then(
      (result) =>
        result instanceof WithStatus ? answer(result.status, result.result) : answer(Status.SUCCESS, result),
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

  /** Runs a call that completes on libpmix's progress thread: refused while it is stalled, and bounded. */
  private waitOn<T>(what: string, call: () => Promise<T>): Promise<T> {
    const p = this.progress();
    if (p.stalled) {
      return Promise.reject(
        new PmixError(
          Status.ERR_TIMEOUT,
          `${what}: libpmix has not progressed for ${Math.round(p.stalledMs / 1000)} s`,
        ),
      );
    }
    const ms = this.opts.callTimeoutMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new PmixError(Status.ERR_TIMEOUT, `${what}: libpmix did not answer within ${ms / 1000} s`)),
        ms,
      );
    });
    return Promise.race([wrap(call), late]).finally(() => clearTimeout(timer));
  }

  registerNspace(nspace: string, nlocalprocs: number, jobInfo: Info[]): Promise<void> {
    return this.waitOn('register namespace', () => this.native.registerNspace(nspace, nlocalprocs, jobInfo));
  }

  deregisterNspace(nspace: string): Promise<void> {
    this.registry.removeNspace(nspace);
    this.native.closePeers(nspace, false);
    return this.waitOn('deregister namespace', () => this.native.deregisterNspace(nspace));
  }

  /** Registers a client; the gate admits it only with this uid and gid. */
  registerClient(proc: Proc, uid: number, gid: number): Promise<void> {
    this.registry.add(proc, uid, gid);
    return this.waitOn('register client', () => this.native.registerClient(proc, uid, gid));
  }

  deregisterClient(proc: Proc): Promise<void> {
    this.registry.remove(proc);
    return this.waitOn('deregister client', () => this.native.deregisterClient(proc));
  }

  /**
   * Shuts down the connections of the namespace's clients that are still open: libpmix then finds
   * them gone as it would clients that went away (and the `localEvent` handler hears of it).
   * Returns how many were open.
   */
  disconnectClients(nspace: string): number {
    return this.native.closePeers(nspace);
  }

  /** The environment a process must set to connect as `proc` (through the gate, retrying when it asks). */
  setupFork(proc: Proc): Record<string, string> {
    const env = sync(() => this.native.setupFork(proc));
    for (const [k, val] of Object.entries(env)) {
      if (val.includes(this.innerUri)) env[k] = val.split(this.innerUri).join(this.outerUri);
    }
    return { ...RETRY_ENV, ...env };
  }

  dmodexRequest(proc: Proc): Promise<Buffer> {
    return this.waitOn('direct modex', () => this.native.dmodexRequest(proc));
  }

  defineProcessSet(name: string, members: Proc[]): Promise<void> {
    return this.waitOn('define process set', () => this.native.defineProcessSet(name, members));
  }

  deleteProcessSet(name: string): Promise<void> {
    return this.waitOn('delete process set', () => this.native.deleteProcessSet(name));
  }

  notifyEvent(status: number, source: Proc, range: number, eventInfo: Info[]): Promise<void> {
    return this.waitOn('notify event', () => this.native.notifyEvent(status, source, range, eventInfo));
  }

  generateRegex(input: string): Buffer {
    return sync(() => this.native.generateRegex(input));
  }

  generatePpn(input: string): Buffer {
    return sync(() => this.native.generatePpn(input));
  }

  /**
   * Closes the gate and finalizes libpmix; upcalls still in flight are dropped. Resolves
   * 'timed-out' if libpmix's finalize has not returned within `timeoutMs` (its progress thread is
   * wedged): the process can then only end with exitNow.
   */
  async stop(timeoutMs = 10_000): Promise<'finalized' | 'timed-out'> {
    if (this.stopped) return 'finalized';
    this.stopped = true;
    if (this.probe) clearInterval(this.probe);
    await this.gate?.close();
    this.native.handoffCloseAll();
    if (this.listenerDir) rmSync(this.listenerDir, { recursive: true, force: true });
    // A progress thread that already stopped answering will not stop for finalize either.
    const wait = this.progress().stalled ? Math.min(timeoutMs, 2000) : timeoutMs;
    let timer: NodeJS.Timeout | undefined;
    const finalized = this.native.finalize().then(
      () => 'finalized' as const,
      () => 'finalized' as const,
    );
    const outcome = await Promise.race([
      finalized,
      new Promise<'timed-out'>((resolve) => {
        timer = setTimeout(() => resolve('timed-out'), wait);
      }),
    ]);
    clearTimeout(timer);
    if (outcome === 'finalized' && active === this) active = undefined;
    return outcome;
  }

  /** What the C allocator holds in this process (libpmix, the addon, Node's C++): src/api/metrics.ts. */
  static allocatorStats(): { inUseBytes: number; freeBytes: number; arenaBytes: number; mmappedBytes: number } {
    return loadNative().allocatorStats();
  }

  /** Gives the C allocator's free pages back to the kernel (malloc_trim). */
  static allocatorTrim(): boolean {
    return loadNative().allocatorTrim();
  }

  /** Ends the process at once (_exit), for when libpmix's finalize does not return. */
  static exitNow(code: number): never {
    return loadNative().exitNow(code);
  }
}

/**
 * The address the gate listens on: loopback, or for remote connections the IPv4 address of the
 * first interface or subnet in `tcpIfInclude` (any non-loopback one when none is named).
 */
export function gateHost(opts: Pick<PmixServerOptions, 'remoteConnections' | 'tcpIfInclude'>): string {
  if (!opts.remoteConnections && !opts.tcpIfInclude) return '127.0.0.1';
  const ifs = Object.entries(networkInterfaces()).flatMap(([name, addrs]) =>
    (addrs ?? []).filter((a) => a.family === 'IPv4').map((a) => ({ name, address: a.address, internal: a.internal })),
  );
  const wanted = (opts.tcpIfInclude ?? '')
    .split(',')
    .map((w) => w.trim())
    .filter(Boolean);
  for (const w of wanted) {
    if (w.includes('/')) {
      const [net, bits] = w.split('/') as [string, string];
      if (!isIPv4(net)) continue;
      const list = new BlockList();
      list.addSubnet(net, Number(bits), 'ipv4');
      const hit = ifs.find((i) => list.check(i.address, 'ipv4'));
      if (hit) return hit.address;
    } else {
      const hit = ifs.find((i) => i.name === w || i.address === w);
      if (hit) return hit.address;
    }
  }
  if (wanted.length > 0) throw new Error(`no IPv4 address on this host matches '${opts.tcpIfInclude}'`);
  const routable = ifs.find((i) => !i.internal);
  if (!routable) throw new Error('remote PMIx connections asked for, but this host has no routable IPv4 address');
  return routable.address;
}

function toPmixError(err: unknown): unknown {
  if (err instanceof PmixError) return err;
  if (err instanceof Error && typeof (err as { status?: unknown }).status === 'number') {
    const e = new PmixError(
      (err as unknown as { status: number }).status,
      err.message.replace(/: PMIX_\w+ \(-?\d+\)$/, ''),
    );
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
