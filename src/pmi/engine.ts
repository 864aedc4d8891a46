// The native PMI engine (native/src/pmi): a thread of the addon that serves bound connections of
// MPICH / Intel MPI jobs, so that MPI_Init's PMI traffic (put, get, barrier / kvs-fence, ...)
// never waits on the JavaScript event loop. Node's floor is about 8 µs per message that wakes a
// rank, one message at a time (README.md); the engine's is a read and a write.
//
// Who does what:
//   - JavaScript accepts a connection and binds it with its credential (connection.ts, policy);
//     a member whose core runs its job in the engine (`PmiMember.engine`) then has its socket
//     handed over (`adopt`).
//   - The engine answers the hot commands against the job's native state (its key-value space,
//     budget and fence) and passes every other frame here whole (a `frame` event); the
//     connection answers it with the TypeScript handlers and `reply`.
//   - src/rm keeps the collective model: the core says which ranks are gone and when the job
//     ends (`EngineJob.rankGone` / `close`); the engine applies it and reports each finished
//     fence (`onFence`). A closed connection comes back as a `closed` event, so a member's loss
//     reaches the job lifecycle as before.
import { loadNative } from '../pmix/native.js';

export interface EngineJobSpec {
  readonly jobId: string;
  readonly kvsname: string;
  readonly size: number;
  readonly appnum: number;
  readonly universeSize: number;
  /** Each rank's node, as an index: node attributes are shared per node. */
  readonly node: readonly number[];
  /** Attributes the server derives (PMI_process_mapping, universeSize), answered even after the job ended. */
  readonly derived: readonly (readonly [string, string])[];
  /** Attributes of ranks on this host (PMI_hwloc_xmlfile), and which ranks those are. */
  readonly localAttrs: readonly (readonly [string, string])[];
  readonly local: readonly boolean[];
  readonly limits: { readonly kvEntries: number; readonly kvBytes: number; readonly puts: number };
  /** Deadline of a fence from its first join (ms); 0: none. */
  readonly timeoutMs: number;
}

/** A frame the engine does not answer itself, with the connection's state when it was read. */
export interface EngineFrame {
  readonly type: 'frame';
  readonly conn: number;
  readonly seq: number;
  readonly kind: 'line' | 'block' | 'pmi2' | 'error';
  readonly text: string;
  readonly wire: 0 | 1 | 2;
  readonly fatal: boolean;
  readonly phase: 'bound' | 'finalized' | 'aborted';
  readonly escapes: boolean;
  /** Bound by the starter's initack; the PMI-2 client's own fullinit is still to come. */
  readonly fullinitDue: boolean;
}

export type EngineConnEvent =
  | EngineFrame
  | {
      readonly type: 'closed';
      readonly conn: number;
      readonly phase: 'bound' | 'finalized' | 'aborted';
      readonly reason: string;
    }
  | { readonly type: 'trace'; readonly conn: number; readonly dir: 'in' | 'out' | 'close'; readonly text: string };

type EngineEvent =
  | EngineConnEvent
  | {
      readonly type: 'fence';
      readonly job: number;
      readonly seconds: number;
      readonly outcome: 'ok' | 'failed' | 'timeout';
    };

interface NativeEngine {
  createJob(spec: EngineJobSpec): number;
  rankGone(job: number, rank: number, message: string): void;
  closeJob(job: number, message: string): void;
  releaseJob(job: number, message: string): void;
  adopt(fd: number, conn: number, job: number, rank: number, state: AdoptState, leftover: string): void;
  reply(conn: number, seq: number, text: string | null, close: boolean): void;
  closeConn(conn: number): void;
  stop(): void;
  ref(on: boolean): void;
}

interface EngineBinding {
  PmiEngine: new (onEvents: (events: EngineEvent[]) => void, options: { trace: boolean }) => NativeEngine;
}

/** A connection's state at the hand-over. */
export interface AdoptState {
  readonly escapes: boolean;
  readonly fullinitDue: boolean;
  /** Where the JavaScript framer left the stream (WireFramer.rest). */
  readonly skipLine: boolean;
  readonly skipBytes: number;
}

/** A job in the engine. */
export class EngineJob {
  /** Told of every fence that ended (seconds from its first join). */
  onFence: ((seconds: number, outcome: 'ok' | 'failed' | 'timeout') => void) | undefined;

  constructor(
    private readonly native: NativeEngine,
    readonly id: number,
  ) {}

  /** The core's word: `rank` will never join again; fences it owes fail with `message`. */
  rankGone(rank: number, message: string): void {
    this.native.rankGone(this.id, rank, message);
  }

  /** The core's word: the job ended; pending and later commands fail with `message`. */
  close(message: string): void {
    this.native.closeJob(this.id, message);
  }

  /** The backend let the job go; its connections stay open and hear `message`. */
  release(message: string): void {
    this.native.releaseJob(this.id, message);
  }
}

/** Where the engine's events for one connection go. */
export type EngineConnHandler = (ev: EngineConnEvent) => void;

export class PmiEngine {
  private readonly native: NativeEngine;
  private readonly conns = new Map<number, EngineConnHandler>();
  private readonly jobs = new Map<number, EngineJob>();

  constructor(
    trace: boolean,
    private readonly onError?: (what: string, err: unknown) => void,
  ) {
    const binding = loadNative() as unknown as EngineBinding;
    this.native = new binding.PmiEngine((events) => this.deliver(events), { trace });
  }

  createJob(spec: EngineJobSpec): EngineJob {
    const job = new EngineJob(this.native, this.native.createJob(spec));
    this.jobs.set(job.id, job);
    return job;
  }

  /** Forgets a released job's fence reports. */
  forget(job: EngineJob): void {
    this.jobs.delete(job.id);
  }

  /**
   * Takes over a bound connection: a duplicate of `fd` (the caller then closes its own) is read
   * from now on, `leftover` (bytes already received) first.
   */
  adopt(
    fd: number,
    conn: number,
    handler: EngineConnHandler,
    job: EngineJob,
    rank: number,
    state: AdoptState,
    leftover: string,
  ): void {
    this.native.adopt(fd, conn, job.id, rank, state, leftover);
    // While it holds connections the engine keeps the process alive, as their sockets would.
    if (this.conns.size === 0) this.native.ref(true);
    this.conns.set(conn, handler);
  }

  /** The answer to frame `seq` of `conn` (null: none); `close` hangs up after writing it. */
  reply(conn: number, seq: number, text: string | null, close = false): void {
    this.native.reply(conn, seq, text, close);
  }

  /** Hangs up; the connection comes back as a `closed` event. */
  closeConn(conn: number): void {
    this.native.closeConn(conn);
  }

  /** Ends the engine's thread; connections still open are closed unreported. */
  stop(): void {
    this.native.stop();
    this.conns.clear();
    this.jobs.clear();
  }

  private deliver(events: EngineEvent[]): void {
    for (const ev of events) {
      try {
        if (ev.type === 'fence') {
          this.jobs.get(ev.job)?.onFence?.(ev.seconds, ev.outcome);
          continue;
        }
        const handler = this.conns.get(ev.conn);
        if (ev.type === 'closed' && this.conns.delete(ev.conn) && this.conns.size === 0) this.native.ref(false);
        handler?.(ev);
      } catch (e) {
        // One connection's trouble never stops the others' events.
        this.onError?.('PMI engine event', e);
      }
    }
  }
}

/** The codec's functions (tests compare them with the TypeScript codec). */
export interface NativeCodec {
  pmiCodecFrames(chunks: string[]): { frames: unknown[]; pending: number };
  pmiCodecParse(wire: 1 | 2, text: string): { cmd: string; args: [string, string][] } | null;
  pmiCodecFormat(what: string, ...args: unknown[]): string;
}

export function nativeCodec(): NativeCodec {
  return loadNative() as unknown as NativeCodec;
}
