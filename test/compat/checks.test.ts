// The compatibility matrix's pass criteria: a rank's own "ok" is not enough.
import { describe, expect, it } from 'vitest';
import type { Agent } from '../../compat-matrix/agents.js';
import { allPassed, type RankRun, sawWholeJob } from '../../compat-matrix/features/common.js';

function run(rank: number, line: Record<string, unknown>): RankRun {
  const agent = { lines: [{ feature: 'world', ...line }] } as unknown as Agent;
  return { agent, rank, since: 0, exit: { status: 0, signal: 0 } };
}

describe('compat matrix checks', () => {
  it('passes ranks that each saw the whole job', () => {
    const runs = [0, 1, 2].map((r) => run(r, { ok: true, rank: r, size: 3, sum: 6 }));
    expect(allPassed(runs, 'world', true, sawWholeJob(3))).toBe(true);
  });

  it('fails ranks that each ran as a singleton, although their Allreduce check held', () => {
    const runs = [0, 1, 2].map((r) => run(r, { ok: true, rank: 0, size: 1, sum: 1 }));
    expect(allPassed(runs, 'world', true)).toBe(true);
    expect(allPassed(runs, 'world', true, sawWholeJob(3))).toBe(false);
  });

  it('fails a rank numbered other than the job numbered it', () => {
    const runs = [run(0, { ok: true, rank: 1, size: 2 }), run(1, { ok: true, rank: 0, size: 2 })];
    expect(allPassed(runs, 'world', true, sawWholeJob(2))).toBe(false);
  });
});
