// Decisions, kept apart from the mechanics in src/rm: which workers form a job, whether a job
// may start, and what a member's loss does. The core asks; a deployment may swap any part.
import { RmError } from '../rm/errors.js';
import type { Policy } from '../rm/policy.js';
import { selectWorkers } from './selection.js';

export type { LossDecision, Policy } from '../rm/policy.js';
export { matches, selectWorkers } from './selection.js';

export interface DefaultPolicyOptions {
  /** At most this many jobs pending, wiring or running at once (default 64). */
  maxActiveJobs?: number;
  /** At most this many members in one job (default 4096). */
  maxJobSize?: number;
  releaseGraceMs?: number;
}

/**
 * The defaults: a worker is in at most one active job (enforced by the core, which only offers
 * available workers); a cap on concurrent jobs; any member lost fails its job (MPI jobs cannot
 * lose a rank); the sidecar never kills a worker.
 */
export function defaultPolicy(opts: DefaultPolicyOptions = {}): Policy {
  const maxActive = opts.maxActiveJobs ?? 64;
  const maxSize = opts.maxJobSize ?? 4096;
  return {
    select: selectWorkers,
    admit({ activeJobs, size }) {
      if (size > maxSize)
        throw new RmError('unprocessable', `a job may have at most ${maxSize} members (asked for ${size})`);
      if (activeJobs >= maxActive) throw new RmError('conflict', `at most ${maxActive} jobs may be active at once`);
    },
    onMemberLost: () => 'fail',
    releaseGraceMs: opts.releaseGraceMs ?? 10_000,
  };
}
