// A JobBackend that records what the core asks of it, for the core's unit tests.
import type { Impl, Job, JobBackend, JobMember, Worker } from '../../src/rm/index.js';

export class RecordingBackend implements JobBackend {
  readonly calls: string[] = [];
  failPrepare: Error | undefined;
  /** Resolves prepare only when released by the test, to exercise concurrency. */
  hold: Promise<void> | undefined;

  constructor(readonly impls: readonly Impl[] = ['openmpi']) {}

  async prepare(job: Readonly<Job>, workers: ReadonlyMap<string, Readonly<Worker>>): Promise<void> {
    this.calls.push(`prepare ${job.id} ${[...workers.keys()].join(',')}`);
    if (this.hold) await this.hold;
    if (this.failPrepare) throw this.failPrepare;
  }
  memberEnv(job: Readonly<Job>, member: Readonly<JobMember>): Record<string, string> {
    return { NS: job.namespace, RANK: String(member.rank) };
  }
  async notifyEnded(job: Readonly<Job>): Promise<void> {
    this.calls.push(`notify ${job.id} ${job.state}`);
  }
  async release(job: Readonly<Job>): Promise<void> {
    this.calls.push(`release ${job.id}`);
  }
  async close(): Promise<void> {
    this.calls.push('close');
  }
}
