// One reader's view of the core's events: what the history still holds after its Last-Event-ID,
// then every new event, queued while the reader is slow. The queue is bounded: a reader that
// falls that far behind is dropped (it reconnects and replays), so no reader grows the
// sidecar's memory, and none slows the core (the core's emit only appends).
import type { EventLog, SequencedEvent } from '../rm/events.js';

export class EventFeed {
  private queue: SequencedEvent[];
  private wake: (() => void) | undefined;
  private closed = false;
  private readonly unsubscribe: () => void;
  /** The reader fell `max` events behind; the queue was dropped. */
  overflowed = false;
  /** The last event handed to the reader. */
  lastSeq: number;

  constructor(
    log: EventLog,
    since: number | undefined,
    private readonly max: number,
    private readonly onOverflow?: () => void,
  ) {
    this.queue = since === undefined ? [] : log.since(since).slice(-max);
    this.lastSeq = since ?? log.lastSeq;
    this.unsubscribe = log.subscribe((e) => {
      if (this.queue.length >= this.max) {
        this.overflowed = true;
        this.queue = [];
        this.close();
        this.onOverflow?.();
        return;
      }
      this.queue.push(e);
      this.wake?.();
    });
  }

  /** The next event; undefined once the feed is closed (and, unless it overflowed, drained). */
  async next(): Promise<SequencedEvent | undefined> {
    for (;;) {
      const e = this.queue.shift();
      if (e) {
        this.lastSeq = e.seq;
        return e;
      }
      if (this.closed) return undefined;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.unsubscribe();
    this.wake?.();
  }
}
