// The PMI listener: one TCP port serves PMI-1 and PMI-2 clients of every MPICH / Intel MPI job
// the core knows. Members find it through PMI_PORT=<host>:<port> and say who they are with
// PMI_ID; see credential.ts for what PMI_ID must be. Ranks on this host may come through a UNIX
// socket instead (the starter picks it, MPI only sees the connection as PMI_FD): the same
// commands at about half the round-trip cost of TCP loopback, as hydra's socketpairs. Either way,
// a peer on this host binds only as its member's worker's uid (peer-uid.ts).
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PmiConnection, type Trace } from './connection.js';
import { PmiEngine } from './engine.js';
import type { PmiJobCore } from './job-core.js';

export interface PmiListenerOptions {
  core: PmiJobCore;
  /** Address to bind; 127.0.0.1 unless workers on other hosts must reach it (then 0.0.0.0). */
  host?: string;
  /** 0 picks a free port. */
  port?: number;
  /** Sees every command, reply, open and close (tests, debugging). */
  trace?: Trace;
  /** Trouble a connection survived by closing (a bug in a handler or in the core). */
  onError?: (what: string, err: unknown) => void;
  /**
   * A connection must bind to a member (initack / fullinit) within this time (default 30 s);
   * whoever starts a rank binds at once (credential.ts), so only strangers wait.
   */
  bindTimeoutMs?: number;
  /** At most this many connections wait to bind at a time (default 1024); the oldest goes first. */
  maxUnbound?: number;
  /** Also listen on a UNIX socket in a private directory (default true). */
  localSocket?: boolean;
  /** Told of every TCP connection accepted (not the UNIX socket's), e.g. to set TCP keepalive on it. */
  onTcpConnection?: (socket: Socket) => void;
}

const BIND_TIMEOUT_MS = 30_000;
const MAX_UNBOUND = 1024;

export class PmiListener {
  private readonly connections = new Set<PmiConnection>();
  private nextId = 1;

  private constructor(
    private readonly server: Server,
    readonly host: string,
    readonly port: number,
    private readonly local: { server: Server; dir: string; path: string } | undefined,
    /** Serves the bound connections of jobs the core runs in it (engine.ts). */
    readonly engine: PmiEngine,
  ) {}

  /** The UNIX socket for ranks on this host, if any. */
  get socketPath(): string | undefined {
    return this.local?.path;
  }

  static async start(opts: PmiListenerOptions): Promise<PmiListener> {
    const host = opts.host ?? '127.0.0.1';
    let self: PmiListener | undefined;
    const early: [Socket, 'tcp' | 'unix'][] = [];
    const onSocket = (via: 'tcp' | 'unix') => (socket: Socket) => {
      if (!self) {
        early.push([socket, via]);
        return;
      }
      self.accept(socket, via, opts);
    };
    const listen = (server: Server, ...args: unknown[]) =>
      new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        (server.listen as (...a: unknown[]) => void)(...args, () => {
          server.off('error', reject);
          resolve();
        });
      });
    const server = createServer(onSocket('tcp'));
    await listen(server, opts.port ?? 0, host);
    const addr = server.address();
    if (!addr || typeof addr === 'string') throw new Error('PMI listener has no TCP address');
    let local: { server: Server; dir: string; path: string } | undefined;
    if (opts.localSocket ?? true) {
      // mkdtemp makes the directory 0700: only this user reaches the socket at all.
      const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-pmi-'));
      local = { server: createServer(onSocket('unix')), dir, path: join(dir, 'pmi.sock') };
      try {
        await listen(local.server, local.path);
      } catch (e) {
        rmSync(dir, { recursive: true, force: true });
        server.close();
        throw e;
      }
    }
    self = new PmiListener(server, host, addr.port, local, new PmiEngine(opts.trace !== undefined, opts.onError));
    for (const [s, via] of early) self.accept(s, via, opts);
    return self;
  }

  /** PMI_PORT for members: `<host>:<port>`, where host is how members reach this machine. */
  pmiPort(advertisedHost?: string): string {
    const h = advertisedHost ?? (this.host === '0.0.0.0' || this.host === '::' ? '127.0.0.1' : this.host);
    return `${h}:${this.port}`;
  }

  get connectionCount(): number {
    return this.connections.size;
  }

  /** Stops accepting, hangs up every connection (unfinalized members are reported lost). */
  async close(): Promise<void> {
    const closed = [this.server, this.local?.server].map(
      (s) => s && new Promise<void>((resolve) => s.close(() => resolve())),
    );
    const conns = [...this.connections];
    for (const c of conns) c.destroy();
    await Promise.all(conns.map((c) => c.done));
    this.engine.stop();
    await Promise.all(closed);
    if (this.local) rmSync(this.local.dir, { recursive: true, force: true });
  }

  private accept(socket: Socket, via: 'tcp' | 'unix', opts: PmiListenerOptions): void {
    if (socket.remoteAddress && opts.onTcpConnection) {
      try {
        opts.onTcpConnection(socket);
      } catch (err) {
        opts.onError?.('onTcpConnection', err);
      }
    }
    const conn = new PmiConnection(
      this.nextId++,
      socket,
      opts.core,
      this.engine,
      opts.trace,
      opts.onError,
      opts.bindTimeoutMs ?? BIND_TIMEOUT_MS,
      via,
    );
    this.connections.add(conn);
    void conn.done.then(() => this.connections.delete(conn));
    const max = opts.maxUnbound ?? MAX_UNBOUND;
    if (this.connections.size > max) {
      // Connections are kept in the order they came: the first unbound ones are the oldest.
      const unbound = [...this.connections].filter((c) => c.state.phase === 'new');
      for (const c of unbound.slice(0, Math.max(0, unbound.length - max))) c.destroy();
    }
  }
}
