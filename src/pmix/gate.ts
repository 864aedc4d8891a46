// The gate: the TCP listener PMIx clients and tools are told to connect to, in front of
// libpmix's own listener, which only listens on loopback.
//
// Why it exists (libpmix 5.0.11, src/mca/ptl/base/ptl_base_connection_hdlr.c):
// - libpmix reads a new connection's handshake on its progress thread with a blocking recv and
//   no deadline, so one connection that sends nothing stops every PMIx operation of every job
//   (namespace registration included) for as long as it stays open.
// - Several refusals after libpmix has started building the peer corrupt its lists: a client
//   whose uid or gid is not the registered one releases the rank's record while it is still
//   listed (fixed upstream only in openpmix 80dd4e37c, 2026), and the next client of that
//   namespace wedges the progress thread for good; refusing a tool crashes the server.
// So the gate reads the whole handshake itself, with a deadline and a size bound, refuses what
// libpmix would refuse (and what would hurt it) with a status the peer reads (libpmix 5.0.11's
// PMIx_Init reports it as PMIX_ERR_UNREACH), and hands libpmix only complete handshakes it will
// accept. Then the bytes are relayed off the JavaScript thread (handOver), or by the gate.
import { connect, createServer, type Server, type Socket } from 'node:net';
import { HEADER_BYTES, HandshakeError, handshakeLength, parseHandshake, type Handshake } from './handshake.js';

export type Admission = { ok: true } | { ok: false; status: number; reason: string };

export interface GateOptions {
  /** Where peers connect: the address and port advertised in PMIX_SERVER_URI*. */
  host: string;
  port?: number;
  /** libpmix's own listener. */
  target: { host: string; port: number };
  /** Decides on a parsed handshake. */
  admit(h: Handshake): Admission;
  /** How long a peer may take to send its handshake (default 10 s). */
  handshakeTimeoutMs?: number;
  /** Connections still sending their handshake; more are closed at once (default 256). */
  maxPending?: number;
  onRefused?(reason: string, peer: string): void;
  /**
   * Takes over an admitted peer's socket (by its fd, which the gate closes right after) and
   * relays it to libpmix, `first` being the handshake; the local port of its connection to
   * libpmix. Without it, or when it throws, the gate relays through its own sockets.
   */
  handOver?(fd: number, first: Buffer): number;
}

/** The status a refused peer reads when its handshake could not be read or understood. */
const BAD_HANDSHAKE = -27; // PMIX_ERR_BAD_PARAM

export class PmixGate {
  private pending = 0;
  private readonly relays = new Set<Socket>();
  private readonly peers = new Set<Socket>();
  readonly stats = { admitted: 0, refused: 0, timedOut: 0 };

  private constructor(
    private readonly server: Server,
    private readonly opts: GateOptions,
    readonly host: string,
    readonly port: number,
  ) {}

  static async listen(opts: GateOptions): Promise<PmixGate> {
    let gate: PmixGate | undefined;
    const server = createServer({ noDelay: true }, (sock) => {
      if (gate) gate.accept(sock);
      else sock.destroy();
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host: opts.host, port: opts.port ?? 0, exclusive: true }, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const addr = server.address();
    if (!addr || typeof addr === 'string') throw new Error('the PMIx gate has no TCP address');
    gate = new PmixGate(server, opts, addr.address, addr.port);
    return gate;
  }

  /** Local ports of the gate's own connections to libpmix (any other connection there is a stranger). */
  relayPorts(): number[] {
    return [...this.relays].map((s) => s.localPort).filter((p): p is number => typeof p === 'number');
  }

  get connections(): number {
    return this.peers.size;
  }

  private accept(sock: Socket): void {
    const who = `${sock.remoteAddress}:${sock.remotePort}`;
    this.peers.add(sock);
    sock.on('close', () => this.peers.delete(sock));
    sock.on('error', () => sock.destroy());
    if (this.pending >= (this.opts.maxPending ?? 256)) {
      this.refuse(sock, undefined, `too many connections still sending their handshake`, who);
      return;
    }
    this.pending++;
    let settled = false;
    const settle = () => {
      if (settled) return false;
      settled = true;
      this.pending--;
      clearTimeout(timer);
      sock.off('data', onData);
      return true;
    };
    const timer = setTimeout(() => {
      if (!settle()) return;
      this.stats.timedOut++;
      this.refuse(sock, undefined, 'no complete handshake within the deadline', who);
    }, this.opts.handshakeTimeoutMs ?? 10_000);
    sock.on('close', () => settle());
    const chunks: Buffer[] = [];
    let have = 0;
    let need = HEADER_BYTES;
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      have += chunk.length;
      try {
        if (need === HEADER_BYTES && have >= HEADER_BYTES) need = handshakeLength(Buffer.concat(chunks).subarray(0, HEADER_BYTES));
      } catch (err) {
        if (settle()) this.refuse(sock, BAD_HANDSHAKE, (err as Error).message, who);
        return;
      }
      if (have < need) return;
      if (!settle()) return;
      sock.pause();
      const all = Buffer.concat(chunks);
      this.decide(sock, all.subarray(0, need), all.subarray(need), who);
    };
    sock.on('data', onData);
  }

  private decide(sock: Socket, msg: Buffer, rest: Buffer, who: string): void {
    let verdict: Admission;
    try {
      const h = parseHandshake(msg);
      verdict = this.opts.admit(h);
    } catch (err) {
      if (!(err instanceof HandshakeError)) throw err;
      verdict = { ok: false, status: BAD_HANDSHAKE, reason: err.message };
    }
    if (!verdict.ok) return this.refuse(sock, verdict.status, verdict.reason, who);
    this.stats.admitted++;
    this.relay(sock, Buffer.concat([msg, rest]));
  }

  private relay(peer: Socket, first: Buffer): void {
    const fd = (peer as unknown as { _handle?: { fd?: number } })._handle?.fd;
    if (this.opts.handOver && typeof fd === 'number' && fd >= 0) {
      try {
        this.opts.handOver(fd, first);
        peer.destroy();
        return;
      } catch (err) {
        this.opts.onRefused?.(`relayed by the gate itself: ${(err as Error).message}`, `${peer.remoteAddress}:${peer.remotePort}`);
      }
    }
    const inner = connect({ host: this.opts.target.host, port: this.opts.target.port, noDelay: true });
    this.relays.add(inner);
    const end = () => {
      this.relays.delete(inner);
      peer.destroy();
      inner.destroy();
    };
    inner.on('error', end);
    inner.on('close', end);
    peer.on('close', end);
    inner.on('connect', () => {
      inner.write(first);
      peer.pipe(inner);
      inner.pipe(peer);
      peer.resume();
    });
  }

  /** Tells the peer why (a status its PMIx_Init returns) when it can read one, and closes. */
  private refuse(sock: Socket, status: number | undefined, reason: string, who: string): void {
    this.stats.refused++;
    this.opts.onRefused?.(reason, who);
    if (status === undefined || sock.destroyed) {
      sock.destroy();
      return;
    }
    const b = Buffer.alloc(4);
    b.writeInt32BE(status);
    sock.end(b);
    // A peer that never reads must not keep the socket.
    setTimeout(() => sock.destroy(), 1000).unref();
  }

  async close(): Promise<void> {
    for (const s of [...this.peers, ...this.relays]) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
