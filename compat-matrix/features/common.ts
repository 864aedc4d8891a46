// What every feature needs: creating a job over REST, handing each member its environment, and
// running a program on the members as children of their long-lived agents.
import { readFileSync, rmSync } from 'node:fs';
import type { Agent, Line } from '../agents.js';
import type { Row } from '../rows.js';
import { type JobJson, type Sidecar, sleep } from '../sidecar.js';

export type Status = 'pass' | 'fail' | 'unsupported';

export interface Outcome {
  status: Status;
  reason?: string;
  seconds?: number;
  /** The MPI call a rank reported failing, when the failure came from the library itself. */
  mpiError?: string;
  /** A word or two shown in the matrix cell next to the status. */
  note?: string;
}

export interface Ctx {
  row: Row;
  sidecar: Sidecar;
  agents: Agent[];
  /** Path of a compiled program for this row, or undefined when it does not build here. */
  program(name: string): string | undefined;
  /** Why `program(name)` did not build. */
  buildError(name: string): string;
  log(msg: string): void;
}

export interface Feature {
  name: string;
  run(ctx: Ctx): Promise<Outcome>;
}

/** Why this row cannot run a custom-pset feature, or undefined when it can. */
export function psetsUnsupported(ctx: Ctx): Outcome | undefined {
  if (!ctx.row.sessions)
    return { status: 'unsupported', reason: `${ctx.row.label} implements MPI 3.1: no MPI Sessions` };
  if (ctx.row.impl !== 'openmpi') {
    return {
      status: 'unsupported',
      reason: 'MPICH over PMI-1/PMI-2 knows only mpi://WORLD and mpi://SELF (custom psets need its PMIx build)',
    };
  }
  return undefined;
}

export async function createJob(ctx: Ctx, members: Agent[], extra: Record<string, unknown> = {}): Promise<JobJson> {
  return ctx.sidecar.request<JobJson>('POST', '/v1/jobs', {
    impl: ctx.row.impl,
    ...(extra.pset ? {} : { members: members.map((a) => a.id) }),
    wiringTimeoutSeconds: 30,
    ...extra,
  });
}

export async function memberEnvs(ctx: Ctx, job: JobJson): Promise<Map<string, Record<string, string>>> {
  const out = new Map<string, Record<string, string>>();
  for (const m of job.members) {
    const res = await ctx.sidecar.request<{ env: Record<string, string> }>(
      'GET',
      `/v1/jobs/${encodeURIComponent(job.id)}/env/${encodeURIComponent(m.workerId)}`,
    );
    out.set(m.workerId, { ...res.env, ...ctx.row.extraEnv });
  }
  return out;
}

export function envFields(env: Record<string, string>): string[] {
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

export interface RankRun {
  agent: Agent;
  rank: number;
  /** Index in agent.lines where this run's output starts. */
  since: number;
  pid?: number;
  exit?: Line;
}

/** Output lines of a run, between its start and exit. */
export function outputOf(run: RankRun, feature: string): Line[] {
  return run.agent.lines.slice(run.since).filter((l) => l.feature === feature);
}

/**
 * Runs `program` as each member of `job` (a child of that member's agent, with the member's
 * environment). `args(rank)` gives its arguments; `delayMs(rank)` delays a rank's start.
 */
export async function startRanks(
  ctx: Ctx,
  job: JobJson,
  program: string,
  args: (rank: number) => string[] = () => [],
  delayMs: (rank: number) => number = () => 0,
  extraEnv: Record<string, string> = {},
): Promise<RankRun[]> {
  const envs = await memberEnvs(ctx, job);
  for (const env of envs.values()) Object.assign(env, extraEnv);
  const runs: RankRun[] = [];
  const byId = new Map(ctx.agents.map((a) => [a.id, a]));
  await Promise.all(
    job.members.map(async (m) => {
      const agent = byId.get(m.workerId)!;
      const run: RankRun = { agent, rank: m.rank, since: agent.lines.length };
      runs.push(run);
      const delay = delayMs(m.rank);
      if (delay > 0) await sleep(delay);
      const a = args(m.rank);
      agent.send(['exec', job.id, program, a.length ? a.join(',') : '-', ...envFields(envs.get(m.workerId)!)]);
      const started = await agent.waitFor((l) => l.started === job.id, 10_000, run.since);
      run.pid = typeof started?.pid === 'number' ? started.pid : undefined;
    }),
  );
  return runs.sort((a, b) => a.rank - b.rank);
}

/** Waits until every rank's process ended or `timeoutMs` passed; kills what is left. */
export async function waitRanks(runs: RankRun[], job: string, timeoutMs: number): Promise<boolean> {
  const results = await Promise.all(
    runs.map(async (r) => {
      r.exit = await r.agent.waitFor((l) => l.exited === job, timeoutMs, r.since);
      return r.exit !== undefined;
    }),
  );
  const all = results.every(Boolean);
  if (!all) killRanks(runs);
  for (const r of runs) if (!r.exit) r.exit = await r.agent.waitFor((l) => l.exited === job, 5_000, r.since);
  return all;
}

/**
 * Kills the ranks still running, as their workers would. A rank killed mid-job never unlinks its
 * MPI library's /dev/shm segments (MPICH's mpich_shm_*): they are noted first and removed after.
 */
export function killRanks(runs: RankRun[]): void {
  const segments = new Set<string>();
  for (const r of runs) {
    if (!r.pid || r.exit) continue;
    try {
      readFileSync(`/proc/${r.pid}/maps`, 'utf8')
        .split('\n')
        .forEach((l) => {
          const f = l.split(/\s+/)[5] ?? '';
          if (f.startsWith('/dev/shm/')) segments.add(f);
        });
      process.kill(r.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  if (segments.size)
    setTimeout(() => {
      for (const f of segments) rmSync(f, { force: true });
    }, 500);
}

export async function release(ctx: Ctx, job: JobJson): Promise<JobJson | undefined> {
  return ctx.sidecar.request<JobJson>('DELETE', `/v1/jobs/${encodeURIComponent(job.id)}`).catch(() => undefined);
}

/** A library message cut to a readable, stable reason: no addresses, at most ~200 characters. */
export function brief(text: string): string {
  const t = text
    .replace(/0x[0-9a-fA-F]+/g, '0x…')
    .replace(/\s+/g, ' ')
    .trim();
  return t.length > 200 ? `${t.slice(0, 197)}...` : t;
}

/**
 * Every rank ended on its own, exited 0 without a signal, and printed an ok line that passes
 * `check` (the program's own verdict is not enough: a rank may print ok and then crash).
 */
export function allPassed(
  runs: RankRun[],
  feature: string,
  ended: boolean,
  check: (line: Line, run: RankRun) => boolean = () => true,
): boolean {
  return (
    ended &&
    runs.every((r) => {
      const line = outputOf(r, feature).find((l) => 'ok' in l);
      return line?.ok === true && check(line, r) && r.exit?.status === 0 && r.exit?.signal === 0;
    })
  );
}

/**
 * The rank saw the job's whole communicator: its size is the member count and its rank is the
 * one the job gave it. Without this, ranks that each ran as a singleton (size 1, rank 0) would
 * pass an Allreduce check, since 1 == 1*2/2.
 */
export function sawWholeJob(members: number): (line: Line, run: RankRun) => boolean {
  return (line, run) => line.size === members && line.rank === run.rank;
}

/** The MPI call the first failing rank named, if the library itself answered an error. */
export function mpiErrorOf(runs: RankRun[], feature: string): string | undefined {
  for (const r of runs) {
    const e = outputOf(r, feature).find(
      (l) => l.ok === false && typeof l.error === 'string' && l.error.startsWith('MPI_'),
    );
    if (e) return String(e.error);
  }
  return undefined;
}

/** A failed outcome with the first rank's error as its reason. */
export function failed(runs: RankRun[], feature: string, ended: boolean, seconds: number, fallback: string): Outcome {
  const mpiError = mpiErrorOf(runs, feature);
  return {
    status: 'fail',
    seconds,
    reason: (ended ? '' : 'timed out; ') + (firstError(runs, feature) ?? fallback),
    ...(mpiError ? { mpiError } : {}),
  };
}

/** The first error a rank printed, for a reason line. */
export function firstError(runs: RankRun[], feature: string): string | undefined {
  for (const r of runs) {
    const e = outputOf(r, feature).find((l) => l.ok === false);
    if (e) return `rank ${r.rank}: ${String(e.error ?? 'failed')}${e.message ? ` (${brief(String(e.message))})` : ''}`;
    if (r.exit && (r.exit.status !== 0 || r.exit.signal !== 0)) {
      const stderr = r.agent.stderr
        .trim()
        .split('\n')
        .filter((l) => l.trim())
        .slice(-3)
        .join(' | ');
      return `rank ${r.rank} exited with status ${String(r.exit.status)} signal ${String(r.exit.signal)}${stderr ? `: ${brief(stderr)}` : ''}`;
    }
  }
  return undefined;
}

export async function timed<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t0 = performance.now();
  const v = await f();
  return [v, (performance.now() - t0) / 1000];
}

/** Runs a program once on `members` and checks every rank printed ok from a communicator of them all. */
export async function simpleJob(
  ctx: Ctx,
  feature: string,
  programName: string,
  members: Agent[],
  opts: {
    args?: (rank: number) => string[];
    delayMs?: (rank: number) => number;
    timeoutMs?: number;
    jobExtra?: Record<string, unknown>;
  } = {},
): Promise<Outcome> {
  const program = ctx.program(programName);
  if (!program) return { status: 'unsupported', reason: ctx.buildError(programName) };
  const t0 = performance.now();
  const job = await createJob(ctx, members, opts.jobExtra);
  try {
    const runs = await startRanks(ctx, job, program, opts.args, opts.delayMs);
    const ended = await waitRanks(runs, job.id, opts.timeoutMs ?? 60_000);
    const seconds = (performance.now() - t0) / 1000;
    const whole = sawWholeJob(members.length);
    if (allPassed(runs, feature, ended, whole)) return { status: 'pass', seconds };
    if (allPassed(runs, feature, ended)) {
      const r = runs.find((run) => !whole(outputOf(run, feature).find((l) => 'ok' in l)!, run))!;
      const line = outputOf(r, feature).find((l) => 'ok' in l)!;
      return {
        status: 'fail',
        seconds,
        reason: `rank ${r.rank} saw rank ${String(line.rank)} of size ${String(line.size)}, not rank ${r.rank} of ${members.length}`,
      };
    }
    const state = await ctx.sidecar.job(job.id).catch(() => undefined);
    return failed(runs, feature, ended, seconds, `job ${state?.state ?? '?'}${state?.error ? `: ${state.error}` : ''}`);
  } finally {
    await release(ctx, job);
  }
}

/**
 * Runs a custom-pset feature where the row has custom psets and `programName` built: defines
 * `psets` over REST, runs the program on a job of `members` (created with `jobExtra`, each rank
 * given `args(rank)`), and lets `judge` read the ranks. The job is released and the psets are
 * deleted afterwards.
 */
export async function psetJob(
  ctx: Ctx,
  programName: string,
  opts: {
    psets: { name: string; members: Agent[] }[];
    members: Agent[];
    jobExtra?: Record<string, unknown>;
    args?: (rank: number) => string[];
    judge: (runs: RankRun[], ended: boolean, seconds: number) => Outcome;
  },
): Promise<Outcome> {
  const unsupported = psetsUnsupported(ctx);
  if (unsupported) return unsupported;
  const program = ctx.program(programName);
  if (!program) return { status: 'unsupported', reason: ctx.buildError(programName) };
  const t0 = performance.now();
  for (const p of opts.psets) {
    await ctx.sidecar.request('POST', '/v1/psets', { name: p.name, members: p.members.map((a) => a.id) });
  }
  const job = await createJob(ctx, opts.members, opts.jobExtra);
  try {
    const runs = await startRanks(ctx, job, program, opts.args);
    const ended = await waitRanks(runs, job.id, 60_000);
    return opts.judge(runs, ended, (performance.now() - t0) / 1000);
  } finally {
    await release(ctx, job);
    for (const p of opts.psets) await ctx.sidecar.request('DELETE', `/v1/psets/${p.name}`).catch(() => undefined);
  }
}
