// The policy port: the decisions the core asks for and does not make itself. Implementations
// live in src/policy; the composition root (src/service) injects one.
import type { Job, JobMember, Selector, Worker } from './types.js';

export type LossDecision = 'fail' | 'continue';

export interface Policy {
  /** Chooses `sel.count` workers from the available ones, in rank order; throws RmError. */
  select(sel: Selector, available: readonly Worker[]): Worker[];
  /** Whether a new job of `size` may start now; throws RmError('conflict' | 'unprocessable'). */
  admit(ctx: { activeJobs: number; size: number }): void;
  /** A member was lost before it finalized (killed, worker retired, connection dropped). */
  onMemberLost(job: Readonly<Job>, member: Readonly<JobMember>): LossDecision;
  /**
   * How long the members of a job that failed or was aborted have to leave (finalize, exit)
   * before the job is released anyway: its namespace torn down and its workers unfrozen.
   */
  readonly releaseGraceMs: number;
}
