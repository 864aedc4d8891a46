// What happened in the core, in order. Subscribers (the REST event stream, metrics, the
// protocol servers) see every event synchronously as it is emitted; a bounded history lets a
// client that reconnects replay what it missed.
import type { DrainRequest, Job, JobState, MemberState, PoolSeat, ProcessSet, Worker, WorkerState } from './types.js';

export type RmEvent =
  | { kind: 'workerJoined'; worker: Worker }
  | { kind: 'workerLeft'; workerId: string; reason: string }
  // jobId: the job that froze the worker, or that gave it back.
  | { kind: 'workerStateChanged'; workerId: string; from: WorkerState; to: WorkerState; jobId?: string }
  | { kind: 'workerPoolChanged'; workerId: string; pool: PoolSeat }
  | { kind: 'psetDefined'; pset: ProcessSet }
  | { kind: 'psetDeleted'; name: string }
  | { kind: 'jobStateChanged'; jobId: string; from?: JobState; to: JobState; reason?: string; job: Job }
  | {
      kind: 'memberStateChanged';
      jobId: string;
      workerId: string;
      rank: number;
      from: MemberState;
      to: MemberState;
      reason?: string;
    }
  | { kind: 'healthChanged'; status: 'ok' | 'pmix-stalled'; pmixStalledSeconds: number }
  | { kind: 'drainChanged'; elasticId: string; drain: DrainRequest };

export interface SequencedEvent {
  seq: number;
  /** Milliseconds since the epoch. */
  time: number;
  event: RmEvent;
}

export type EventListener = (e: SequencedEvent) => void;

export class EventLog {
  private seq = 0;
  private first = 1;
  private readonly history: SequencedEvent[] = [];
  private readonly listeners = new Set<EventListener>();

  constructor(
    private readonly now: () => number,
    private readonly capacity = 1000,
  ) {}

  emit(event: RmEvent): SequencedEvent {
    const e: SequencedEvent = { seq: ++this.seq, time: this.now(), event };
    this.history.push(e);
    if (this.history.length > this.capacity) this.history.shift();
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch {
        // A listener's failure is its own; the core and the other listeners go on.
      }
    }
    return e;
  }

  subscribe(listener: EventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Numbers the next event `seq + 1`. A sidecar that restarts starts above every number its
   * previous run can have used, so a reader's Last-Event-ID never names an unrelated event.
   */
  startAfter(seq: number): void {
    if (this.history.length) throw new Error('the event log has already begun');
    this.seq = seq;
    this.first = seq + 1;
  }

  /** The number of this log's first event. */
  get firstSeq(): number {
    return this.first;
  }

  /** The oldest sequence number still held (lastSeq + 1 when none is). */
  get oldestSeq(): number {
    return this.history[0]?.seq ?? this.seq + 1;
  }

  /** Events after `seq` that are still in the history, oldest first. */
  since(seq: number): SequencedEvent[] {
    return this.history.filter((e) => e.seq > seq);
  }

  get lastSeq(): number {
    return this.seq;
  }
}
