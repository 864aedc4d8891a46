// One client connection: bytes in, frames, the protocol handlers, replies out.
//
// PMI-1 commands are answered strictly in order (the client reads replies in order and has at
// most one command outstanding); PMI-2 commands run concurrently and are matched by thrid.
// Whatever a client sends, the worst outcome is an error reply or this connection closing;
// closing before finalize tells the core the member is lost, so no job waits on a dead peer.
// The server itself closes a connection only when it cannot be framed any more or an unbound
// client's initack is refused: MPICH 5's client crashes on EOF while it awaits a reply.
import type { Socket } from 'node:net';
import { ConnectionState } from './connection-state.js';
import { PmiError, errorMessage } from './errors.js';
import type { PmiJobCore } from './job-core.js';
import { formatPmi1Error, parsePmi1Line } from './pmi1-codec.js';
import { PMI1_RESPONSE, PMI1_UNKNOWN_RESPONSE, Pmi1Session, type Reply } from './pmi1-session.js';
import { formatPmi2Error, parsePmi2Body } from './pmi2-codec.js';
import { Pmi2Session } from './pmi2-session.js';
import { WireFramer, type Frame } from './wire-framer.js';

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

  constructor(
    readonly id: number,
    private readonly socket: Socket,
    core: PmiJobCore,
    private readonly trace?: Trace,
    private readonly onError?: (what: string, err: unknown) => void,
    bindTimeoutMs = 30_000,
  ) {
    const peer = socket.remoteAddress ? `${socket.remoteAddress}:${socket.remotePort ?? '?'}` : 'local socket';
    this.state = new ConnectionState(core, { peer }, onError);
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
      socket.on('close', () => {
        clearTimeout(bindTimer);
        this.onClose();
        resolve();
      });
    });
  }

  /** Resolves once the socket has closed and the core has been told. */
  get done(): Promise<void> {
    return this.closedPromise;
  }

  /** Hangs up (listener shutdown). The member, if not finalized, is reported lost. */
  destroy(): void {
    this.socket.destroy();
  }

  private onData(chunk: Buffer): void {
    for (const frame of this.framer.push(chunk)) this.dispatch(frame);
  }

  private dispatch(frame: Frame): void {
    // A refused PMI_ID: whatever else the client sent along is not looked at (no second guess).
    if (this.state.phase === 'refused') return;
    switch (frame.kind) {
      case 'line': {
        this.traceIn(frame.text);
        let cmd;
        try {
          cmd = parsePmi1Line(frame.text);
        } catch (e) {
          const name = /^cmd=([A-Za-z0-9_-]{1,40})/.exec(frame.text)?.[1];
          const response = (name && PMI1_RESPONSE[name]) ?? PMI1_UNKNOWN_RESPONSE;
          this.inOrder(() => formatPmi1Error(response, asPmiError(e)));
          return;
        }
        // Lines queued behind a refused initack were dispatched before it ran.
        this.inOrder(() => (this.state.phase === 'refused' ? null : this.pmi1.handleLine(cmd)));
        return;
      }
      case 'block':
        this.traceIn(frame.lines.join('\\n'));
        this.inOrder(() => this.pmi1.handleSpawnBlock(frame.lines));
        return;
      case 'pmi2': {
        this.traceIn(frame.body);
        let cmd;
        try {
          cmd = parsePmi2Body(frame.body);
        } catch (e) {
          const name = /^cmd=([A-Za-z0-9_-]{1,40})/.exec(frame.body)?.[1] ?? 'error';
          this.send({ text: formatPmi2Error(`${name}-response`, asPmiError(e)) });
          return;
        }
        this.track(this.pmi2.handle(cmd).then((r) => this.send(r), (e) => this.fail(e)));
        return;
      }
      case 'error': {
        this.traceIn(`<framing error: ${frame.message}>`);
        const err = new PmiError(frame.message);
        const text = frame.wire === 2 ? formatPmi2Error('error-response', err) : formatPmi1Error(PMI1_UNKNOWN_RESPONSE, err);
        if (frame.fatal) {
          // Nothing after this can be framed: answer, then hang up.
          this.inOrder(() => ({ text, close: true }));
        } else if (frame.wire === 2) {
          this.send(text);
        } else {
          this.inOrder(() => text);
        }
        return;
      }
    }
  }

  /**
   * Answers PMI-1 frames in order. With nothing pending, a synchronous handler's reply goes out
   * at once (most commands: no promise, no queue); once one waits (a barrier), later frames
   * queue behind it.
   */
  private inOrder(work: () => Out | Promise<Out>): void {
    if (this.pmi1Pending === 0) {
      let r: Out | Promise<Out>;
      try {
        r = work();
      } catch (e) {
        this.fail(e);
        return;
      }
      if (!(r instanceof Promise)) {
        this.send(r);
        return;
      }
      this.queued(r);
      return;
    }
    this.queued(this.serial.then(work));
  }

  /** A PMI-1 reply still to come: later frames wait for it, and it counts as in flight. */
  private queued(r: Promise<Out>): void {
    this.pmi1Pending++;
    this.started();
    this.serial = r.then(
      (x) => {
        this.pmi1Pending--;
        this.settled();
        this.send(x);
      },
      (e: unknown) => {
        this.pmi1Pending--;
        this.settled();
        this.fail(e);
      },
    );
  }

  /**
   * Counts commands not yet answered. A client that keeps sending without reading its replies
   * is stopped being read from, so its queue (and our memory) stays bounded.
   */
  private track(p: Promise<void>): void {
    this.started();
    void p.finally(() => this.settled());
  }

  private started(): void {
    if (++this.inFlight === MAX_IN_FLIGHT) this.socket.pause();
  }

  private settled(): void {
    if (--this.inFlight === RESUME_BELOW && !this.closed) this.socket.resume();
  }

  private send(r: Out): void {
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
    }
    else this.socket.write(r.text, 'latin1');
  }

  /** A handler threw outside its own error handling: a bug, but it only costs this connection. */
  private fail(e: unknown): void {
    this.trace?.({ conn: this.id, dir: 'close', text: `internal error: ${errorMessage(e)}` });
    this.onError?.('PMI command handler', e);
    this.socket.destroy();
  }

  private traceIn(text: string): void {
    this.trace?.({ conn: this.id, dir: 'in', text });
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    const { member, phase } = this.state;
    this.trace?.({ conn: this.id, dir: 'close', text: phase });
    if (!member) return;
    try {
      member.disconnected(phase === 'bound' ? 'its PMI connection closed before PMI finalize' : `connection closed after ${phase}`);
    } catch (e) {
      // The core's trouble, not this connection's.
      this.onError?.('member disconnect', e);
    }
  }
}

function asPmiError(e: unknown): PmiError {
  return e instanceof PmiError ? e : new PmiError(errorMessage(e));
}
