// repeat: the same 4 long-lived processes run 20 consecutive jobs with changing membership
// (sizes 2, 3, 4; different subsets), each result checked, in one join mode:
//   fork   each job in a child forked from the long-lived process (MPI Sessions)
//   forkw  the same with MPI_Init / MPI_Finalize (libraries without Sessions)
//   reinit the long-lived process itself: Session_init ... Session_finalize, again and again
//   (the in-process join mode, the agents' own sessions in the sidecar's pool, is inprocess.ts)
import type { Agent } from '../agents.js';
import type { RepeatMode } from '../rows.js';
import { brief, type Ctx, createJob, envFields, memberEnvs, type Outcome, release } from './common.js';

export function subsets(jobs: number, agents: number): number[][] {
  return Array.from({ length: jobs }, (_, i) => {
    const size = 2 + (i % 3);
    return Array.from({ length: size }, (_, k) => (i + k) % agents).sort((a, b) => a - b);
  });
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
}

async function oneJob(
  _ctx: Ctx,
  agents: Agent[],
  mode: RepeatMode,
  tag: string,
  send: (a: Agent, i: number) => void,
  size: number,
): Promise<string | undefined> {
  const since = agents.map((a) => a.lines.length);
  for (const [i, a] of agents.entries()) send(a, i);
  const done = await Promise.all(agents.map((a, i) => a.waitFor((l) => l.done === tag, 60_000, since[i])));
  for (const [i, a] of agents.entries()) {
    if (!done[i])
      return `${mode}: job ${tag} hung on ${a.id}${a.alive ? '' : ' (its process died)'}: ${brief(a.stderr.trim().split('\n').slice(-2).join(' | '))}`;
    const res = a.lines.slice(since[i]).find((l) => l.feature === 'repeat' && l.job === tag);
    const expect = (size * (size + 1)) / 2;
    if (res?.ok !== true || res.size !== size || res.sum !== expect) {
      return `${mode}: job ${tag} on ${a.id}: ${res ? JSON.stringify(res) : 'no result'}${a.alive ? '' : ` (process died: ${brief(a.stderr.trim().split('\n').slice(-2).join(' | '))})`}`;
    }
  }
  return undefined;
}

export async function repeat(ctx: Ctx, mode: RepeatMode, jobs = 20): Promise<Outcome> {
  const agents = ctx.agents.slice(0, 4);
  const plan = subsets(jobs, agents.length);
  const times: number[] = [];
  const t0 = performance.now();
  for (const [i, set] of plan.entries()) {
    const members = set.map((k) => agents[k]!);
    const tj = performance.now();
    const job = await createJob(ctx, members);
    try {
      const envs = await memberEnvs(ctx, job);
      const err = await oneJob(
        ctx,
        members,
        mode,
        job.id,
        (a) => a.send([mode, job.id, ...envFields(envs.get(a.id)!)]),
        members.length,
      );
      if (err)
        return { status: 'fail', seconds: (performance.now() - t0) / 1000, reason: `${err} (job ${i + 1} of ${jobs})` };
    } finally {
      await release(ctx, job);
    }
    times.push((performance.now() - tj) / 1000);
  }
  return {
    status: 'pass',
    seconds: (performance.now() - t0) / 1000,
    reason: `${jobs}/${jobs} jobs of sizes 2-4, median ${(median(times) * 1000).toFixed(0)} ms per job (create, run, release)`,
  };
}
