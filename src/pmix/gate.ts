// The gate: the TCP listener PMIx clients and tools are told to connect to. libpmix itself
// accepts only what the gate hands it (its own listener is a UNIX socket in a directory of this
// uid's; native/src/handoff.cc).
//
// Why it exists (libpmix 5.0.11, src/mca/ptl/base/ptl_base_connection_hdlr.c):
// - libpmix reads a new connection's handshake on its progress thread with a blocking recv and
//   no deadline, so one connection that sends nothing stops every PMIx operation of every job
//   (namespace registration included) for as long as it stays open.
// - Several refusals after libpmix has started building the peer corrupt its lists: a client
//   whose uid or gid is not the registered one releases the rank's record while it is still
//   listed (fixed upstream only in openpmix 80dd4e37c, 2026), and the next client of that
//   namespace wedges the progress thread for good; refusing a tool crashes the server.
// So the gate reads the whole handshake itself, with deadlines and a size bound, refuses what
// libpmix would refuse (and what would hurt it) with a status the peer reads (libpmix 5.0.11's
// PMIx_Init reports it as PMIX_ERR_UNREACH), and hands libpmix only complete handshakes it will
// accept, with the peer's socket itself (handOver): after that, no byte of the peer's passes
// through the gate.
//
// Nobody exhausts it: a connection must send its first byte soon and its whole handshake within
// a deadline; connections still sending their handshake are bounded per peer (a peer being a uid
// on this host, an address elsewhere: see peerKey) and in all, and at a bound the oldest of that
// peer's (or of the peer with the most) makes room for the newcomer. A client that sends its
// handshake at once, as every PMIx client does, is never turned away for others' connections.
//
// Nor for a moment when libpmix cannot take it (busy: it has stopped progressing; or the hand-over
// failed): the gate answers PMIX_ERR_TEMP_UNAVAILABLE after a pause, the one status on which
// libpmix 5.0.11's client connects again and resends its handshake (ptl_base_fns.c,
// pmix_ptl_base_make_connection), up to PMIX_MCA_ptl_base_handshake_max_retries attempts (the
// members' environment sets it: see RETRY_ENV). A process whose PMIx_Init failed cannot try again:
// Open MPI makes it a singleton, and a second MPI_Session_init in it is one again.
import { createServer, type Server, type Socket } from 'node:net';
import { type Handshake, HandshakeError, HEADER_BYTES, handshakeLength, parseHandshake } from './handshake.js';

export type Admission = { ok: true } | { ok: false; status: number; reason: string };

/** Who a connection comes from: `key` for the per-peer bound, and the uid owning its socket when known. */
export interface Peer {
  key: string;
  uid?: number;
}

export interface GateOptions {
  /** Where peers connect: the address and port advertised in PMIX_SERVER_URI*. */
  host: string;
  port?: number;
  /** Decides on a parsed handshake, from a peer as peerOf identified it. */
  admit(h: Handshake, peer: Peer): Admission;
  /**
   * Takes an admitted peer's socket over, by its fd (which the gate closes right after), `first`
   * being its handshake and `h` what it says. Throws when it cannot: the peer is then refused.
   */
  handOver(fd: number, first: Buffer, h: Handshake): void;
  /** Who a connection comes from (default: its address). */
  peerOf?(sock: Socket): Peer;
  /** How long a peer may take to send its first byte (default 2 s). */
  firstByteMs?: number;
  /** How long a peer may take to send its whole handshake (default 10 s). */
  handshakeTimeoutMs?: number;
  /** Connections still sending their handshake, per peer (default 64) and in all (default 512). */
  maxPendingPerPeer?: number;
  maxPending?: number;
  /** Why the server cannot take an admitted peer now, if it cannot: the peer is asked to retry. */
  busy?(): string | undefined;
  /** How long an admitted peer waits before it is asked to retry (default 1 s). */
  retryPauseMs?: number;
  onRefused?(reason: string, peer: string): void;
}

/** How many times a member's PMIx_Init connects when asked to retry (attempts in all), about a second apart. */
export const HANDSHAKE_RETRIES = 60;
/** What a member's environment sets so that its PMIx_Init retries when the gate asks it to. */
export const RETRY_ENV: Readonly<Record<string, string>> = {
  PMIX_MCA_ptl_base_handshake_max_retries: String(HANDSHAKE_RETRIES),
};

/** The status a refused peer reads when its handshake could not be read or understood. */
const BAD_HANDSHAKE = -27; // PMIX_ERR_BAD_PARAM
/** The status on which a peer connects again (libpmix's internal PMIX_ERR_TEMP_UNAVAILABLE). */
const TEMP_UNAVAILABLE = -1367;

interface Pending {
  sock: Socket;
  key: string;
  peer: Peer;
  who: string;
  /** Ends the wait for its handshake (false if it had ended already). */
  settle(): boolean;
}

export class PmixGate {
  /** Connections still sending their handshake, by peer, oldest first. */
  private readonly pending = new Map<string, Set<Pending>>();
  private pendingCount = 0;
  /** Admitted peers waiting to be asked to retry. */
  private waiting = 0;
  private readonly sockets = new Set<Socket>();
  readonly stats = { admitted: 0, refused: 0, timedOut: 0, evicted: 0, retried: 0 };

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

  /** Connections the gate holds: those still sending their handshake, and refused ones closing. */
  get connections(): number {
    return this.sockets.size;
  }

  /** Connections still sending their handshake. */
  get pendingHandshakes(): number {
    return this.pendingCount;
  }

  private accept(sock: Socket): void {
    const who = `${sock.remoteAddress}:${sock.remotePort}`;
    this.sockets.add(sock);
    sock.on('close', () => this.sockets.delete(sock));
    sock.on('error', () => sock.destroy());
    let peer: Peer;
    try {
      peer = this.opts.peerOf?.(sock) ?? { key: `host ${sock.remoteAddress}` };
    } catch {
      peer = { key: `host ${sock.remoteAddress}` };
    }
    const key = peer.key;
    this.makeRoom(key);
    const chunks: Buffer[] = [];
    let have = 0;
    let need = HEADER_BYTES;
    let settled = false;
    const entry: Pending = {
      sock,
      key,
      peer,
      who,
      settle: () => {
        if (settled) return false;
        settled = true;
        clearTimeout(timer);
        sock.off('data', onData);
        const set = this.pending.get(key);
        if (set?.delete(entry)) this.pendingCount--;
        if (set?.size === 0) this.pending.delete(key);
        return true;
      },
    };
    let set = this.pending.get(key);
    if (!set) this.pending.set(key, (set = new Set()));
    set.add(entry);
    this.pendingCount++;
    const start = Date.now();
    const total = this.opts.handshakeTimeoutMs ?? 10_000;
    const expire = (what: string) => {
      if (!entry.settle()) return;
      this.stats.timedOut++;
      this.refuse(sock, undefined, what, who);
    };
    let timer = setTimeout(
      () => expire('no byte of a handshake within the deadline'),
      Math.min(total, this.opts.firstByteMs ?? 2000),
    );
    sock.on('close', () => entry.settle());
    const onData = (chunk: Buffer) => {
      if (have === 0) {
        clearTimeout(timer);
        timer = setTimeout(
          () => expire('no complete handshake within the deadline'),
          Math.max(0, start + total - Date.now()),
        );
      }
      chunks.push(chunk);
      have += chunk.length;
      try {
        if (need === HEADER_BYTES && have >= HEADER_BYTES)
          need = handshakeLength(Buffer.concat(chunks).subarray(0, HEADER_BYTES));
      } catch (err) {
        if (entry.settle()) this.refuse(sock, BAD_HANDSHAKE, (err as Error).message, who);
        return;
      }
      if (have < need) return;
      if (!entry.settle()) return;
      sock.pause();
      const all = Buffer.concat(chunks);
      if (all.length > need) {
        // Every PMIx peer waits for the answer to its handshake before it says anything more.
        this.refuse(sock, BAD_HANDSHAKE, 'sent more than its handshake before it was answered', who);
        return;
      }
      this.decide(sock, all, peer, who);
    };
    sock.on('data', onData);
  }

  /** At a bound, closes the oldest pending connection of `key`'s peer, or of the peer with the most. */
  private makeRoom(key: string): void {
    const perPeer = this.opts.maxPendingPerPeer ?? 64;
    const all = this.opts.maxPending ?? 512;
    let victim: string | undefined;
    if ((this.pending.get(key)?.size ?? 0) >= perPeer) victim = key;
    else if (this.pendingCount >= all) {
      let most = 0;
      for (const [k, s] of this.pending) if (s.size > most) [victim, most] = [k, s.size];
    }
    if (victim === undefined) return;
    const oldest = this.pending.get(victim)?.values().next().value;
    if (!oldest?.settle()) return;
    this.stats.evicted++;
    this.refuse(
      oldest.sock,
      undefined,
      `closed for a newer connection: too many connections from ${victim} still sending their handshake`,
      oldest.who,
    );
  }

  private decide(sock: Socket, msg: Buffer, peer: Peer, who: string): void {
    let h: Handshake;
    let verdict: Admission;
    try {
      h = parseHandshake(msg);
      verdict = this.opts.admit(h, peer);
    } catch (err) {
      if (!(err instanceof HandshakeError)) throw err;
      this.refuse(sock, BAD_HANDSHAKE, err.message, who);
      return;
    }
    if (!verdict.ok) {
      this.refuse(sock, verdict.status, verdict.reason, who);
      return;
    }
    const busy = this.opts.busy?.();
    if (busy) {
      this.askToRetry(sock, busy, who);
      return;
    }
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    try {
      if (typeof fd !== 'number' || fd < 0) throw new Error('the socket has no file descriptor');
      this.opts.handOver(fd, msg, h);
    } catch (err) {
      this.askToRetry(sock, `it could not be handed to libpmix: ${(err as Error).message}`, who);
      return;
    }
    this.stats.admitted++;
    sock.destroy();
  }

  /** Answers PMIX_ERR_TEMP_UNAVAILABLE after a pause (at once when too many wait already). */
  private askToRetry(sock: Socket, why: string, who: string): void {
    this.stats.retried++;
    this.opts.onRefused?.(`asked to retry: ${why}`, who);
    const answer = () => {
      const b = Buffer.alloc(4);
      b.writeInt32BE(TEMP_UNAVAILABLE);
      sock.end(b);
      setTimeout(() => sock.destroy(), 1000).unref();
    };
    if (this.waiting >= (this.opts.maxPending ?? 512)) {
      answer();
      return;
    }
    this.waiting++;
    const t = setTimeout(() => {
      this.waiting--;
      sock.off('close', gone);
      if (!sock.destroyed) answer();
    }, this.opts.retryPauseMs ?? 1000);
    const gone = () => {
      clearTimeout(t);
      this.waiting--;
    };
    sock.once('close', gone);
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
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
