// One client connection: bytes in, frames, the protocol handlers, replies out.
//
// PMI-1 commands are answered strictly in order (the client reads replies in order and has at
// most one command outstanding); PMI-2 commands run concurrently and are matched by thrid.
// Whatever a client sends, the worst outcome is an error reply or this connection closing;
// closing before finalize tells the core the member is lost, so no job waits on a dead peer.
// The server itself closes a connection only when it cannot be framed any more or an unbound
// client's initack is refused: MPICH 5's client crashes on EOF while it awaits a reply.
//
// A connection starts on its Node socket. Once bound to a member whose job the native engine
// serves (`member.engine`), nothing more is read here: when the bind's reply has gone out, the
// socket goes to the engine (engine.ts) with whatever was received after the bind, and from then
// on this object answers only the frames the engine passes up, through the engine.
import type { Socket } from 'node:net';
import { ConnectionState } from './connection-state.js';
import type { EngineConnEvent, EngineFrame, PmiEngine } from './engine.js';
import { errorMessage, PmiError } from './errors.js';
import type { PmiJobCore } from './job-core.js';
import { peerUidOf, tcpEnds } from './peer-uid.js';
import { formatPmi1Error, type Pmi1Command, parsePmi1Line } from './pmi1-codec.js';
import { PMI1_RESPONSE, PMI1_UNKNOWN_RESPONSE, Pmi1Session, type Reply } from './pmi1-session.js';
import { formatPmi2Error, type Pmi2Command, parsePmi2Body } from './pmi2-codec.js';
import { Pmi2Session } from './pmi2-session.js';
import { type Frame, WireFramer } from './wire-framer.js';

const PIPELINED_BIND =
  'the credential came with more commands after it: PMI_ID must be exactly the 32 hex digits of a dask-pmix credential, and nothing may follow a bind before its reply';

/** A reply: its text, or text with a close. */
type Out = string | Reply | null;

const MAX_IN_FLIGHT = 64;
const RESUME_BELOW = 8;

export type TraceEvent =
  | { conn: number; dir: 'in' | 'out'; text: string }
  | { conn: number; dir: 'open' | 'close'; text: string };

export type Trace = (ev: TraceEvent) => void;

export class PmiConnection {
  readonly state: ConnectionState;
  private readonly framer = new WireFramer();
  private readonly pmi1: Pmi1Session;
  private readonly pmi2: Pmi2Session;
  /** Tail of the PMI-1 queue: each line's reply waits for the previous one. */
  private serial: Promise<void> = Promise.resolve();
  private closed = false;
  private inFlight = 0;
  /** PMI-1 frames whose reply has not gone out. */
  private pmi1Pending = 0;
  private readonly closedPromise: Promise<void>;
  private resolveClosed!: () => void;
  /** The hand-over to the engine: none, waiting for the bind's reply to go out, done. */
  private handover: 'none' | 'waiting' | 'done' = 'none';
  /** Bytes that arrived while the hand-over waited. */
  private held: Buffer[] = [];

  constructor(
    readonly id: number,
    private readonly socket: Socket,
    core: PmiJobCore,
    private readonly engine?: PmiEngine,
    private readonly trace?: Trace,
    private readonly onError?: (what: string, err: unknown) => void,
    bindTimeoutMs = 30_000,
    /** Accepted on the TCP port or on the UNIX socket (listener.ts). */
    via: 'tcp' | 'unix' = 'tcp',
  ) {
    const peer = socket.remoteAddress ? `${socket.remoteAddress}:${socket.remotePort ?? '?'}` : 'local socket';
    // Whose the peer's socket is (peer-uid.ts). Over TCP it is looked up now, while the peer that
    // just connected holds it: once closed, the kernel no longer says. SO_PEERCRED stays.
    const tcpOwner = via === 'tcp' ? peerUidOf({ via, ends: tcpEnds(socket) }) : undefined;
    const peerUid = () => tcpOwner ?? peerUidOf({ via: 'unix', fd: socketFd(socket) });
    this.state = new ConnectionState(core, { peer, peerUid }, onError);
    this.pmi1 = new Pmi1Session(this.state);
    this.pmi2 = new Pmi2Session(this.state);
    socket.setNoDelay(true);
    trace?.({ conn: id, dir: 'open', text: peer });
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    // Errors (ECONNRESET...) are followed by 'close'; handling them here keeps them from being thrown.
    socket.on('error', () => {});
    // A stranger that never binds is not kept (bound connections stay as long as their client).
    const bindTimer = setTimeout(() => {
      if (this.state.phase === 'new') {
        trace?.({ conn: id, dir: 'close', text: `not bound within ${bindTimeoutMs} ms` });
        socket.destroy();
      }
    }, bindTimeoutMs);
    bindTimer.unref();
    this.closedPromise = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
    socket.on('close', () => {
      clearTimeout(bindTimer);
      // Handed over: the socket closed here is this process's copy; the engine reports the end.
      if (this.handover === 'done') return;
      this.onClose();
    });
  }

  /** Resolves once the connection has closed and the core has been told. */
  get done(): Promise<void> {
    return this.closedPromise;
  }

  /** Hangs up (listener shutdown). The member, if not finalized, is reported lost. */
  destroy(): void {
    if (this.handover === 'done') this.engine!.closeConn(this.id);
    else this.socket.destroy();
  }

  private onData(chunk: Buffer): void {
    if (this.handover !== 'none') {
      this.held.push(chunk);
      return;
    }
    this.framer.append(chunk);
    for (let frame = this.framer.take(); frame; frame = this.framer.take()) {
      this.dispatch(frame);
      if (this.handover === 'none' && this.state.phase === 'bound' && this.state.member?.engine && this.engine) {
        // Bound to a member the engine serves: nothing more is read or answered here.
        this.handover = 'waiting';
        this.socket.pause();
        this.handOver();
        return;
      }
    }
  }

  /** Hands the socket to the engine once every reply of this side has been written. */
  private handOver(): void {
    if (this.handover !== 'waiting' || this.closed || this.inFlight > 0) return;
    if (this.socket.writableLength > 0) {
      this.socket.once('drain', () => this.handOver());
      return;
    }
    const seat = this.state.member!.engine!;
    const fd = socketFd(this.socket);
    // Whatever Node has buffered comes through onData (held) when read out.
    this.socket.read();
    const rest = this.framer.rest();
    const leftover = rest.bytes + Buffer.concat(this.held).toString('latin1');
    this.held = [];
    if (typeof fd !== 'number' || fd < 0) {
      // The socket ended before it could be handed over (the client hung up, or its last bytes
      // made Node close it): its 'close' reports the member's end, as for any lost connection.
      this.trace?.({ conn: this.id, dir: 'close', text: 'closed before the hand-over to the engine' });
      this.socket.destroy();
      return;
    }
    try {
      this.engine!.adopt(
        fd,
        this.id,
        (ev) => this.fromEngine(ev),
        seat.job,
        seat.rank,
        {
          escapes: this.state.pmi2Escapes,
          fullinitDue: this.state.boundBy === 'initack',
          skipLine: rest.skipLine,
          skipBytes: rest.skipBytes,
        },
        leftover,
      );
    } catch (e) {
      this.fail(e);
      return;
    }
    this.handover = 'done';
    this.socket.destroy();
  }

  private fromEngine(ev: EngineConnEvent): void {
    switch (ev.type) {
      case 'frame':
        // The engine's view of the connection is the one that counts.
        this.state.phase = ev.phase;
        this.state.pmi2Escapes = ev.escapes;
        if (this.state.boundBy) this.state.boundBy = ev.fullinitDue ? 'initack' : 'fullinit';
        this.dispatch(engineFrame(ev), ev.seq);
        return;
      case 'closed':
        this.state.phase = ev.phase;
        this.onClose();
        return;
      case 'trace':
        this.trace?.({ conn: this.id, dir: ev.dir, text: ev.text });
        return;
    }
  }

  /** Handles one frame; `seq` is the engine's number for it once the engine reads the socket. */
  private dispatch(frame: Frame, seq?: number): void {
    // A refused PMI_ID: whatever else the client sent along is not looked at (no second guess).
    if (this.state.phase === 'refused') return;
    if (seq === undefined && this.pipelinedBind(frame)) return;
    switch (frame.kind) {
      case 'line': {
        if (seq === undefined) this.traceIn(frame.text);
        let cmd: Pmi1Command;
        try {
          cmd = parsePmi1Line(frame.text);
        } catch (e) {
          const name = /^cmd=([A-Za-z0-9_-]{1,40})/.exec(frame.text)?.[1];
          const response = (name && PMI1_RESPONSE[name]) ?? PMI1_UNKNOWN_RESPONSE;
          this.inOrder(() => formatPmi1Error(response, asPmiError(e)), seq);
          return;
        }
        // Lines queued behind a refused initack were dispatched before it ran.
        this.inOrder(() => (this.state.phase === 'refused' ? null : this.pmi1.handleLine(cmd)), seq);
        return;
      }
      case 'block':
        if (seq === undefined) this.traceIn(frame.lines.join('\\n'));
        this.inOrder(() => this.pmi1.handleSpawnBlock(frame.lines), seq);
        return;
      case 'pmi2': {
        if (seq === undefined) this.traceIn(frame.body);
        let cmd: Pmi2Command;
        try {
          cmd = parsePmi2Body(frame.body);
        } catch (e) {
          const name = /^cmd=([A-Za-z0-9_-]{1,40})/.exec(frame.body)?.[1] ?? 'error';
          this.send({ text: formatPmi2Error(`${name}-response`, asPmiError(e)) }, seq);
          return;
        }
        this.track(
          this.pmi2.handle(cmd).then(
            (r) => this.send(r, seq),
            (e) => this.fail(e),
          ),
        );
        return;
      }
      case 'error': {
        if (seq === undefined) this.traceIn(`<framing error: ${frame.message}>`);
        const err = new PmiError(frame.message);
        const text =
          frame.wire === 2 ? formatPmi2Error('error-response', err) : formatPmi1Error(PMI1_UNKNOWN_RESPONSE, err);
        if (frame.fatal) {
          // Nothing after this can be framed: answer, then hang up.
          this.inOrder(() => ({ text, close: true }), seq);
        } else if (frame.wire === 2) {
          this.send(text, seq);
        } else {
          this.inOrder(() => text, seq);
        }
        return;
      }
    }
  }

  /**
   * A bind (initack, or a PMI-2 fullinit) with more bytes behind it in what arrived: refused
   * before anything is parsed. A starter sends the credential alone and reads the reply before
   * MPI speaks, so bytes after it are a PMI_ID that carried commands of its own (a newline and
   * `cmd=finalize` in the variable): they must not act as the member.
   */
  private pipelinedBind(frame: Frame): boolean {
    if (this.state.phase !== 'new') return false;
    const rest = this.framer.rest();
    if (rest.bytes.length === 0 && !rest.skipLine && rest.skipBytes === 0) return false;
    let text: string;
    if (frame.kind === 'line' && /^cmd=initack[ \t]/.test(frame.text)) {
      text = formatPmi1Error('initack', new PmiError(PIPELINED_BIND));
    } else if (frame.kind === 'pmi2' && /^cmd=fullinit;/.test(frame.body)) {
      text = formatPmi2Error('fullinit-response', new PmiError(PIPELINED_BIND));
    } else return false;
    this.traceIn(frame.kind === 'line' ? frame.text : frame.body);
    this.state.phase = 'refused';
    if (frame.kind === 'line') this.inOrder(() => ({ text, close: true }), undefined);
    else this.send({ text, close: true }, undefined);
    return true;
  }

  /**
   * Answers PMI-1 frames in order. With nothing pending, a synchronous handler's reply goes out
   * at once (most commands: no promise, no queue); once one waits (a barrier), later frames
   * queue behind it.
   */
  private inOrder(work: () => Out | Promise<Out>, seq: number | undefined): void {
    if (this.pmi1Pending === 0) {
      let r: Out | Promise<Out>;
      try {
        r = work();
      } catch (e) {
        this.fail(e);
        return;
      }
      if (!(r instanceof Promise)) {
        this.send(r, seq);
        return;
      }
      this.queued(r, seq);
      return;
    }
    this.queued(this.serial.then(work), seq);
  }

  /** A PMI-1 reply still to come: later frames wait for it, and it counts as in flight. */
  private queued(r: Promise<Out>, seq: number | undefined): void {
    this.pmi1Pending++;
    this.started();
    this.serial = r.then(
      (x) => {
        this.pmi1Pending--;
        this.send(x, seq);
        this.settled();
      },
      (e: unknown) => {
        this.pmi1Pending--;
        this.fail(e);
        this.settled();
      },
    );
  }

  /**
   * Counts commands not yet answered. A client that keeps sending without reading its replies
   * is stopped being read from, so its queue (and our memory) stays bounded. (Once handed over,
   * the engine counts them.)
   */
  private track(p: Promise<void>): void {
    this.started();
    void p.finally(() => this.settled());
  }

  private started(): void {
    if (++this.inFlight === MAX_IN_FLIGHT && this.handover === 'none') this.socket.pause();
  }

  private settled(): void {
    --this.inFlight;
    if (this.handover === 'waiting') this.handOver();
    else if (this.inFlight === RESUME_BELOW && !this.closed && this.handover === 'none') this.socket.resume();
  }

  /** The reply to a frame: through the engine once it reads the socket (`seq`), else on the socket. */
  private send(r: Out, seq: number | undefined): void {
    if (seq !== undefined) {
      if (this.closed) return;
      const text = r === null ? null : typeof r === 'string' ? r : r.text;
      this.engine!.reply(this.id, seq, text, typeof r === 'object' && r !== null && r.close === true);
      return;
    }
    if (!r || this.closed) return;
    if (typeof r === 'string') {
      this.trace?.({ conn: this.id, dir: 'out', text: r });
      this.socket.write(r, 'latin1');
      return;
    }
    this.trace?.({ conn: this.id, dir: 'out', text: r.text });
    if (r.close) {
      this.socket.pause();
      this.socket.end(r.text, 'latin1', () => this.socket.destroy());
    } else this.socket.write(r.text, 'latin1');
  }

  /** A handler threw outside its own error handling: a bug, but it only costs this connection. */
  private fail(e: unknown): void {
    this.trace?.({ conn: this.id, dir: 'close', text: `internal error: ${errorMessage(e)}` });
    this.onError?.('PMI command handler', e);
    if (this.handover === 'done') this.engine!.closeConn(this.id);
    else this.socket.destroy();
  }

  private traceIn(text: string): void {
    this.trace?.({ conn: this.id, dir: 'in', text });
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    const { member, phase } = this.state;
    if (this.handover !== 'done') this.trace?.({ conn: this.id, dir: 'close', text: phase });
    try {
      if (member)
        member.disconnected(
          phase === 'bound' ? 'its PMI connection closed before PMI finalize' : `connection closed after ${phase}`,
        );
    } catch (e) {
      // The core's trouble, not this connection's.
      this.onError?.('member disconnect', e);
    } finally {
      this.resolveClosed();
    }
  }
}

function engineFrame(ev: EngineFrame): Frame {
  switch (ev.kind) {
    case 'line':
      return { kind: 'line', text: ev.text };
    case 'block':
      return { kind: 'block', lines: ev.text.split('\n') };
    case 'pmi2':
      return { kind: 'pmi2', body: ev.text };
    case 'error':
      return { kind: 'error', wire: ev.wire, message: ev.text, fatal: ev.fatal };
  }
}

/** The file descriptor under a Node socket, while it is open. */
function socketFd(socket: Socket): number | undefined {
  return (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
}

function asPmiError(e: unknown): PmiError {
  return e instanceof PmiError ? e : new PmiError(errorMessage(e));
}
