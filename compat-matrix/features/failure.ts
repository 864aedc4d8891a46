// abort and member-death: one rank goes (MPI_Abort, or SIGKILL mid-collective); every other rank
// must end within 2 s, the job must be marked aborted/failed, the sidecar must keep serving, and
// the next job must succeed. A rank that does not end by itself is killed by its worker (here the
// runner plays the worker, as dask_pmix's member runner does) once the sidecar marks the job.
import { sleep } from '../sidecar.js';
import { createJob, killRanks, outputOf, release, simpleJob, startRanks, waitRanks, type Ctx, type Feature, type Outcome, type RankRun } from './common.js';

const LIMIT_S = 2;

async function failure(ctx: Ctx, feature: 'abort' | 'member-death'): Promise<Outcome> {
  const programName = feature === 'abort' ? 'abort' : 'member_death';
  const program = ctx.program(programName);
  if (!program) return { status: 'unsupported', reason: ctx.buildError(programName) };
  const members = ctx.agents.slice(0, 3);
  const t0 = performance.now();
  const job = await createJob(ctx, members);
  let runs: RankRun[] = [];
  try {
    runs = await startRanks(ctx, job, program);
    const victim = runs[1]!;
    // Wait until every rank is inside the MPI program, then make rank 1 go.
    const ready = await Promise.all(
      runs.map((r) => r.agent.waitFor((l) => l.feature === feature && (l.waiting === true || l.looping === true || l.aborting === true), 30_000, r.since)),
    );
    if (ready.some((l) => !l)) {
      killRanks(runs);
      return { status: 'fail', reason: 'the ranks never started their MPI program' };
    }
    let tGone: number;
    if (feature === 'member-death') {
      await sleep(200);
      tGone = Date.now() / 1000;
      process.kill(victim.pid!, 'SIGKILL');
    } else {
      tGone = Number(outputOf(victim, feature).find((l) => l.aborting === true)?.t ?? Date.now() / 1000);
    }
    const expected = feature === 'abort' ? ['aborted', 'failed'] : ['failed', 'aborted'];
    const marked = await ctx.sidecar.waitForJob(job.id, expected, LIMIT_S * 1000 + 3000);
    const tMarked = Date.now() / 1000;
    // Give the library a moment to end the others by itself, then act as their workers would.
    const others = runs.filter((r) => r !== victim);
    await Promise.all(others.map((r) => r.agent.waitFor((l) => l.exited === job.id, 300, r.since)));
    const selfEnded = others.filter((r) => r.agent.lines.slice(r.since).some((l) => l.exited === job.id)).length;
    killRanks(others);
    await waitRanks(runs, job.id, 5_000);
    const seconds = (performance.now() - t0) / 1000;
    const ends = others.map((r) => Number(r.exit?.t ?? Infinity) - tGone);
    const slowest = Math.max(...ends);
    const markedAfter = tMarked - tGone;
    const how =
      selfEnded === others.length
        ? 'the other ranks ended by themselves'
        : selfEnded > 0
          ? `${selfEnded} of ${others.length} other ranks ended by themselves, the rest were stopped by their workers`
          : 'the other ranks were stopped by their workers once the sidecar marked the job';
    if (!expected.includes(marked.state)) {
      return { status: 'fail', seconds, reason: `the sidecar still shows the job ${marked.state} ${markedAfter.toFixed(1)} s later` };
    }
    // The sidecar must keep serving: the next job, on the same workers, succeeds.
    await release(ctx, job);
    const next = await simpleJob(ctx, 'world', 'world', ctx.agents.slice(0, 2));
    if (next.status !== 'pass') return { status: 'fail', seconds, reason: `the next job failed: ${next.reason ?? ''}` };
    const detail = `job ${marked.state} after ${markedAfter.toFixed(2)} s, all ranks ended after ${slowest.toFixed(2)} s (${how}); next job OK`;
    if (slowest > LIMIT_S) return { status: 'fail', seconds, reason: `too slow: ${detail}` };
    return { status: 'pass', seconds, reason: detail };
  } finally {
    killRanks(runs);
    await release(ctx, job);
  }
}

export const abortFeature: Feature = { name: 'abort', run: (ctx) => failure(ctx, 'abort') };
export const memberDeath: Feature = { name: 'member-death', run: (ctx) => failure(ctx, 'member-death') };
