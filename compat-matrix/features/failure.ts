// abort and member-death: one rank goes (MPI_Abort, or SIGKILL mid-collective); every other rank
// must end within 2 s, the job must be marked aborted/failed, the sidecar must keep serving, and
// the next job must succeed. The ranks get 2 s to end by themselves (what the library does alone);
// any left are then killed by their worker (here the runner plays the worker, as dask_pmix's member
// runner does once the sidecar marks the job), and the cell says which of the two it was.
import { sleep } from '../sidecar.js';
import {
  type Ctx,
  createJob,
  type Feature,
  killRanks,
  type Outcome,
  outputOf,
  type RankRun,
  release,
  simpleJob,
  startRanks,
  waitRanks,
} from './common.js';

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
      runs.map((r) =>
        r.agent.waitFor(
          (l) => l.feature === feature && (l.waiting === true || l.looping === true || l.aborting === true),
          30_000,
          r.since,
        ),
      ),
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
    // What the library does alone: the other ranks get until 2 s after the loss to end by
    // themselves. Only then does the runner act as their workers would.
    const others = runs.filter((r) => r !== victim);
    const left = Math.max(0, tGone + LIMIT_S - Date.now() / 1000) * 1000;
    await Promise.all(others.map((r) => r.agent.waitFor((l) => l.exited === job.id, left, r.since)));
    const alone = others.filter((r) => r.agent.lines.slice(r.since).some((l) => l.exited === job.id));
    killRanks(others);
    await waitRanks(runs, job.id, 5_000);
    const seconds = (performance.now() - t0) / 1000;
    const markedAfter = tMarked - tGone;
    const slowestAlone = Math.max(0, ...alone.map((r) => Number(r.exit?.t ?? Infinity) - tGone));
    const note = alone.length === others.length ? 'by itself' : alone.length > 0 ? 'partly by workers' : 'by workers';
    const how =
      alone.length === others.length
        ? `the other ranks ended by themselves within ${slowestAlone.toFixed(2)} s`
        : `${alone.length} of ${others.length} other ranks ended by themselves within ${LIMIT_S} s; the rest were stopped by their workers (the library leaves them running)`;
    if (!expected.includes(marked.state)) {
      return {
        status: 'fail',
        seconds,
        reason: `the sidecar still shows the job ${marked.state} ${markedAfter.toFixed(1)} s later`,
      };
    }
    // The sidecar must keep serving: the next job, on the same workers, succeeds.
    await release(ctx, job);
    const next = await simpleJob(ctx, 'world', 'world', ctx.agents.slice(0, 2));
    if (next.status !== 'pass') return { status: 'fail', seconds, reason: `the next job failed: ${next.reason ?? ''}` };
    const detail = `job ${marked.state} after ${markedAfter.toFixed(2)} s; ${how}; next job OK`;
    if (markedAfter > LIMIT_S) return { status: 'fail', seconds, reason: `too slow: ${detail}` };
    return { status: 'pass', seconds, reason: detail, note };
  } finally {
    killRanks(runs);
    await release(ctx, job);
  }
}

export const abortFeature: Feature = { name: 'abort', run: (ctx) => failure(ctx, 'abort') };
export const memberDeath: Feature = { name: 'member-death', run: (ctx) => failure(ctx, 'member-death') };
