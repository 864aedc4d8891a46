// The in-process join mode: the long-lived agents join the sidecar's pool once (POST
// /v1/workers/{id}/pool, then MPI_Session_init in the agent itself) and every job is a
// communicator over their pool ranks, built in the agent process, as dask_pmix's worker plugin
// and in-process members do. The runner plays the members' side of the REST protocol: each
// member joins the job (the sidecar answers when all have), then the agents build the
// communicator with the job's tag, then each member leaves (ok, or failed).
//
// Columns: world (one job over all four), repeat (N jobs of sizes 2-4 over changing subsets,
// each checked), abort (MPI_Abort from one member), member-death (SIGKILL of one agent
// mid-collective). The others do not apply: the pool's mpi://WORLD is the pool, not the job
// (session-world); custom psets are per namespace in Open MPI 5.0.x (pset-names, pset-group);
// spawn is refused; publish-lookup and connect-accept have no agent command in this mode.
//
// MPICH / Intel MPI rows: each agent is an MPI world of its own (size 1, MPI_Init once), and a
// job's communicator is the merge tree of accept/connect + Intercomm_merge that dask_pmix's
// members build (python/dask_pmix/merge_tree.py): each member opens the ports of its accepting
// steps, joins the job with them, and gets everyone's from the sidecar. MPICH reports no failed
// process to the survivors of a failure: the sidecar's record of the job is what tells them.
import type { Agent } from '../agents.js';
import { type JobJson, sleep } from '../sidecar.js';
import { brief, type Ctx, envFields, type Outcome } from './common.js';
import { subsets } from './repeat.js';

const F = 'repeat';

/** Whether the row's agents are worlds of their own (MPICH / Intel MPI), not Open MPI pool ranks. */
const worlds = (ctx: Ctx) => ctx.row.impl !== 'openmpi';

interface PoolJob {
  job: JobJson;
  members: Agent[];
  ranks: string;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
}

/** Every agent joins the pool and initialises its session; returns each one's pool rank. */
export async function joinPool(ctx: Ctx, agents: Agent[]): Promise<Map<string, number> | Outcome> {
  const ranks = new Map<string, number>();
  const since = agents.map((a) => a.lines.length);
  for (const a of agents) {
    const res = await ctx.sidecar.request<{ pool: { rank: number }; env: Record<string, string> }>(
      'POST',
      `/v1/workers/${encodeURIComponent(a.id)}/pool`,
      { pid: a.pid, uid: process.getuid!(), gid: process.getgid!(), ...(worlds(ctx) ? { impl: ctx.row.impl } : {}) },
    );
    ranks.set(a.id, res.pool.rank);
    if (worlds(ctx)) {
      a.send(['winit', ...envFields({ ...res.env, ...ctx.row.extraEnv })]);
      continue;
    }
    // The agents share one host: Open MPI's TCP transport keeps to loopback (other tests on this
    // machine add and remove interfaces under a session that lives across jobs).
    a.send(['pinit', ...envFields({ ...res.env, ...ctx.row.extraEnv, OMPI_MCA_btl_tcp_if_include: 'lo' })]);
  }
  const ready = await Promise.all(agents.map((a, i) => a.waitFor((l) => 'pool' in l, 60_000, since[i])));
  if (ready.some((l) => l?.pool !== 'ready')) {
    return {
      status: 'fail',
      reason: `the agents' sessions did not start: ${JSON.stringify(ready)} ${brief(agents[0]!.stderr)}`,
    };
  }
  return ranks;
}

async function create(ctx: Ctx, members: Agent[], ranks: Map<string, number>): Promise<PoolJob> {
  const job = await ctx.sidecar.request<JobJson & { mode: string; modeReason: string; tag: string }>(
    'POST',
    '/v1/jobs',
    {
      impl: ctx.row.impl,
      mode: 'inprocess',
      members: members.map((a) => a.id),
      wiringTimeoutSeconds: 30,
    },
  );
  if (job.mode !== 'inprocess') throw new Error(`the job runs in ${job.mode} mode: ${job.modeReason}`);
  return { job, members, ranks: members.map((a) => ranks.get(a.id)!).join(',') };
}

const tagOf = (j: PoolJob) => (j.job as unknown as { tag: string }).tag;
const memberPath = (j: PoolJob, a: Agent, what: string) =>
  `/v1/jobs/${encodeURIComponent(j.job.id)}/members/${encodeURIComponent(a.id)}/${what}`;

/** Every member joins (the sidecar answers when all have), then the agents build the communicator. */
async function start(
  ctx: Ctx,
  j: PoolJob,
  what: (a: Agent) => string | undefined = () => undefined,
): Promise<number[]> {
  if (worlds(ctx)) return startWorlds(ctx, j, what);
  const joined = await Promise.all(
    j.members.map((a) =>
      ctx.sidecar.request<{ ready: boolean }>('POST', memberPath(j, a, 'join'), { waitSeconds: 30 }),
    ),
  );
  if (joined.some((r) => !r.ready)) throw new Error('the members did not all join');
  const since = j.members.map((a) => a.lines.length);
  for (const a of j.members) {
    const w = what(a);
    a.send(['pjob', tagOf(j), j.ranks, ...(w ? [w] : [])]);
  }
  return since;
}

/** World rows: each member opens its ports, joins with them, and runs the merge tree over everyone's. */
async function startWorlds(ctx: Ctx, j: PoolJob, what: (a: Agent) => string | undefined): Promise<number[]> {
  const tag = tagOf(j);
  const size = j.members.length;
  const rankOf = new Map(j.job.members.map((m) => [m.workerId, m.rank]));
  const opening = j.members.map((a) => a.lines.length);
  for (const a of j.members) a.send(['wports', tag, String(rankOf.get(a.id)), String(size)]);
  const opened = await Promise.all(
    j.members.map((a, i) => a.waitFor((l) => l.job === tag && 'ports' in l, 30_000, opening[i])),
  );
  if (opened.some((l) => !l)) throw new Error('a member did not open its ports');
  const joined = await Promise.all(
    j.members.map((a, i) =>
      ctx.sidecar.request<{ ready: boolean; ports?: { ports?: Record<string, string> }[] }>(
        'POST',
        memberPath(j, a, 'join'),
        { waitSeconds: 30, ports: opened[i]!.ports },
      ),
    ),
  );
  if (joined.some((r) => !r.ready)) throw new Error('the members did not all join');
  const ports = (joined[0]!.ports ?? []).flatMap((p, r) =>
    Object.entries(p.ports ?? {}).map(([step, port]) => `${r}.${step}=${port}`),
  );
  const since = j.members.map((a) => a.lines.length);
  for (const a of j.members) a.send(['wjob', tag, String(rankOf.get(a.id)), String(size), what(a) ?? '-', ...ports]);
  return since;
}

async function leave(ctx: Ctx, j: PoolJob, a: Agent, ok: boolean, reason = ''): Promise<void> {
  await ctx.sidecar.request('POST', memberPath(j, a, 'leave'), { ok, reason }).catch(() => undefined);
}

/** Runs one job to its end: every member's result checked, then each leaves. */
async function runJob(ctx: Ctx, j: PoolJob): Promise<string | undefined> {
  const since = await start(ctx, j);
  const tag = tagOf(j);
  const size = j.members.length;
  const done = await Promise.all(j.members.map((a, i) => a.waitFor((l) => l.done === tag, 60_000, since[i])));
  let err: string | undefined;
  for (const [i, a] of j.members.entries()) {
    const res = a.lines.slice(since[i]).find((l) => l.feature === F && l.job === tag && 'ok' in l);
    const ok = !!done[i] && res?.ok === true && res.size === size && res.sum === (size * (size + 1)) / 2;
    if (!ok)
      err ??= `job ${j.job.id} on ${a.id}: ${res ? JSON.stringify(res) : 'no result'}${a.alive ? '' : ` (died: ${brief(a.stderr.trim().split('\n').slice(-2).join(' | '))})`}`;
    await leave(ctx, j, a, ok, ok ? '' : 'wrong result');
  }
  const final = await ctx.sidecar.waitForJob(j.job.id, ['completed', 'failed', 'aborted'], 10_000);
  if (!err && final.state !== 'completed') err = `job ${j.job.id} is ${final.state}: ${final.error ?? ''}`;
  return err;
}

export async function inprocessWorld(ctx: Ctx, ranks: Map<string, number>): Promise<Outcome> {
  const t0 = performance.now();
  const err = await runJob(ctx, await create(ctx, ctx.agents.slice(0, 4), ranks));
  const seconds = (performance.now() - t0) / 1000;
  return err ? { status: 'fail', seconds, reason: err } : { status: 'pass', seconds };
}

export async function inprocessRepeat(ctx: Ctx, ranks: Map<string, number>, jobs: number): Promise<Outcome> {
  const agents = ctx.agents.slice(0, 4);
  const times: number[] = [];
  const t0 = performance.now();
  for (const [i, set] of subsets(jobs, agents.length).entries()) {
    const tj = performance.now();
    const err = await runJob(
      ctx,
      await create(
        ctx,
        set.map((k) => agents[k]!),
        ranks,
      ),
    );
    if (err)
      return { status: 'fail', seconds: (performance.now() - t0) / 1000, reason: `${err} (job ${i + 1} of ${jobs})` };
    times.push((performance.now() - tj) / 1000);
  }
  return {
    status: 'pass',
    seconds: (performance.now() - t0) / 1000,
    reason: `${jobs}/${jobs} jobs of sizes 2-4 over changing subsets of 4 long-lived processes, median ${(median(times) * 1000).toFixed(1)} ms per job (create, join, communicator, Allreduce, leave)`,
  };
}

/**
 * abort / member-death: one member goes (MPI_Abort, or SIGKILL mid-Barrier); the sidecar must
 * mark the job within 2 s naming it, the survivors' Barrier must return an error (fault tolerance
 * is on in the pool) within 2 s, and the survivors must serve the next job.
 */
export async function inprocessFailure(
  ctx: Ctx,
  ranks: Map<string, number>,
  feature: 'abort' | 'member-death',
): Promise<Outcome> {
  const LIMIT_S = 2;
  const t0 = performance.now();
  const j = await create(ctx, ctx.agents.slice(0, 3), ranks);
  const victim = j.members[1]!;
  const others = j.members.filter((a) => a !== victim);
  const tag = tagOf(j);
  const since = await start(ctx, j, (a) => (feature === 'abort' && a === victim ? 'abort' : 'loop=500'));
  const at = (a: Agent) => since[j.members.indexOf(a)];
  const going = await Promise.all(
    j.members.map((a) => a.waitFor((l) => l.job === tag && (l.looping === true || l.aborting === true), 30_000, at(a))),
  );
  if (going.some((l) => !l)) return { status: 'fail', reason: 'the members never reached their collective' };
  let tGone: number;
  if (feature === 'member-death') {
    await sleep(200);
    tGone = Date.now() / 1000;
    process.kill(victim.pid, 'SIGKILL');
  } else {
    tGone = Number(going[1]?.t ?? Date.now() / 1000);
  }
  const marked = await ctx.sidecar.waitForJob(j.job.id, ['failed', 'aborted'], LIMIT_S * 1000 + 3000);
  const markedAfter = Date.now() / 1000 - tGone;
  const culprit = marked.members.find((m) => (m as unknown as { endedJob?: boolean }).endedJob)?.workerId;
  // The survivors' Barrier must return (an error) by itself: nobody stops them here.
  const ended = await Promise.all(others.map((a) => a.waitFor((l) => l.done === tag, LIMIT_S * 1000 + 3000, at(a))));
  const returnedAfter = Date.now() / 1000 - tGone;
  for (const a of others) await leave(ctx, j, a, false, 'a peer failed');
  const seconds = (performance.now() - t0) / 1000;
  if (!['failed', 'aborted'].includes(marked.state))
    return { status: 'fail', seconds, reason: `the sidecar still shows the job ${marked.state}` };
  if (culprit !== victim.id)
    return {
      status: 'fail',
      seconds,
      reason: `the job blames ${culprit ?? 'nobody'}, not ${victim.id}: ${marked.error ?? ''}`,
    };
  if (ended.some((l) => !l) && worlds(ctx) && ['failed', 'aborted'].includes(marked.state) && culprit === victim.id) {
    // MPICH has no fault tolerance here: the survivors' Barrier neither fails nor returns. The
    // sidecar's record is what dask_pmix's members poll; a member still inside MPI after the
    // grace has its worker restarted through its nanny (python/dask_pmix/inprocess.py).
    const detail = `job ${marked.state} after ${markedAfter.toFixed(2)} s naming the member; the survivors stayed inside their Barrier (MPICH reports no failed process: dask_pmix's members learn it from the sidecar and a member stuck in MPI is restarted)`;
    return markedAfter > LIMIT_S
      ? { status: 'fail', seconds, reason: `too slow: ${detail}` }
      : { status: 'pass', seconds, reason: detail, note: 'sidecar tells' };
  }
  if (ended.some((l) => !l)) {
    return {
      status: 'fail',
      seconds,
      reason: `job ${marked.state} after ${markedAfter.toFixed(2)} s, but a survivor was still inside MPI ${returnedAfter.toFixed(1)} s after the loss (dask_pmix restarts such a worker through its nanny)`,
    };
  }
  // compat_error lines carry the MPI error's message (they name no job: the first after its start).
  const errors = others
    .map(
      (a) =>
        a.lines.slice(at(a)).find((l) => l.feature === F && l.ok === false && typeof l.message === 'string')?.message,
    )
    .filter(Boolean);
  // The survivors serve the next job.
  await sleep(300);
  const nextErr = await runJob(ctx, await create(ctx, others, ranks)).catch((e: unknown) => String(e));
  const detail = `job ${marked.state} after ${markedAfter.toFixed(2)} s naming the member; the survivors' Barrier returned ${errors.length ? `(${[...new Set(errors)].join(', ')})` : ''} within ${returnedAfter.toFixed(2)} s`;
  if (nextErr)
    return { status: 'fail', seconds, reason: `${detail}; the next job on the survivors failed: ${nextErr}` };
  if (markedAfter > LIMIT_S) return { status: 'fail', seconds, reason: `too slow: ${detail}` };
  return { status: 'pass', seconds, reason: `${detail}; next job OK`, note: 'by itself' };
}
