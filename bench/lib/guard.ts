// The contract between a benchmark and the perf guard (bench/guard.ts). A benchmark's JSON
// carries `guard.ratios`: for each measured pair, the reference's time over ours (or, where
// there is no other program to compare with, the cost of a baseline operation of the same run
// over ours), so above 1 means we are faster and a bigger number is always better. Ratios, not
// times: both sides of each pair are measured in the same run on the same machine, so machine
// speed and load cancel out. A benchmark's `--quick` run prints the same keys (or a subset).
import { round3 } from './run.js';

export interface GuardSection {
  ratios: Record<string, number>;
  meaning: string;
}

export const GUARD_MEANING =
  "reference time / ours (above 1: dask-pmix faster); the perf guard fails when the geometric mean of a benchmark's ratios falls below half its record";

export function guardSection(ratios: Record<string, number>): GuardSection {
  const clean: Record<string, number> = {};
  for (const [k, v] of Object.entries(ratios)) if (Number.isFinite(v) && v > 0) clean[k] = round3(v);
  return { ratios: clean, meaning: GUARD_MEANING };
}
