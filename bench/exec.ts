// Plain MPICH programs started as a job's members, against hydra, side by side in one run.
//
//   node dist/bench/exec.js [--ranks 8] [--repeats 11] [--quick]
//
// A sidecar (`dask-pmix serve`, its own process) holds registered workers. Each repeat creates an
// MPICH job over REST, takes each member's environment from REST (GET /v1/jobs/:id/env/:worker),
// then one shell forks N ranks of a plain program (MPI_Init + Allreduce + Finalize,
// test/clients/mpi_job.c, built with the MPICH 5 wheel's mpicc), each through a starter:
//   - `dask-pmix-exec` (the documented command, as a user's environment has it on PATH: the
//     wheel installs the native binder into bin/, scripts/setup.sh links it into the checkout's
//     venvs; here .venv-mpich/bin/dask-pmix-exec);
//   - the native binder by its path in the build (native/build/Release/dask-pmix-exec);
//   - `dask-pmix exec` (bin/dask-pmix exec, the checkout's POSIX sh launcher, then the binder);
//   - `dask-pmix exec` through the environment's console script (.venv-mpich/bin/dask-pmix, as
//     pip installs it: a Python start, then the binder), for reference;
//   - `dask-pmix exec --setsid`: each rank in a session of its own, as hydra's proxy starts them
//     (with autogroup scheduling a session is one share of the CPU; labelled, not the default);
//   - `python -m dask_pmix.pmi_connect` (the Python module, for reference);
// against `mpiexec -n N` of the same wheel (hydra) with the same MPI settings. Timed: from the
// shell's (or mpiexec's) start to the last rank's exit; every rank must print a correct
// Allreduce over N, and our job must complete. REST time (job + N environments) apart.
//
// --quick (the perf guard's run): N = 8, 3 repeats, `dask-pmix-exec`, `dask-pmix exec --setsid`
// and hydra.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { cpus, hostname, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { DEFAULT_MEMBER_ENV } from '../src/service/default-env.js';
import { guardSection } from './lib/guard.js';
import { BENCH_BIN, baseEnv, collectLines, inOwnSession, type Line, median, ROOT, round3 } from './lib/run.js';
import { SidecarProcess } from './lib/sidecar.js';

const run = promisify(execFile);
const WHEEL = join(ROOT, '.venv-mpich', 'bin');
const PROGRAM = join(BENCH_BIN, 'mpi_job_mpich5');
const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const STARTERS = {
  'dask-pmix-exec': [join(WHEEL, 'dask-pmix-exec')],
  'native binder': [join(ROOT, 'native', 'build', 'Release', 'dask-pmix-exec')],
  'dask-pmix exec': [join(ROOT, 'bin', 'dask-pmix'), 'exec'],
  'dask-pmix exec (console script)': [join(WHEEL, 'dask-pmix'), 'exec'],
  'dask-pmix exec --setsid': [join(ROOT, 'bin', 'dask-pmix'), 'exec', '--setsid'],
  'python -m dask_pmix.pmi_connect': [join(WHEEL, 'python'), '-m', 'dask_pmix.pmi_connect'],
} as const;
type Starter = keyof typeof STARTERS;

async function build(): Promise<void> {
  mkdirSync(BENCH_BIN, { recursive: true });
  const src = join(ROOT, 'test', 'clients', 'mpi_job.c');
  if (existsSync(PROGRAM) && statSync(PROGRAM).mtimeMs > statSync(src).mtimeMs) return;
  await run(join(WHEEL, 'mpicc'), ['-O', '-o', PROGRAM, src]);
}

function checkRanks(lines: Line[], n: number): void {
  const ok = lines.filter((l) => l.ok === true && l.size === n);
  if (ok.length !== n) throw new Error(`expected ${n} ranks with a correct Allreduce: ${JSON.stringify(lines)}`);
}

/** Seconds from starting `cmd` to the exit of every process it started. */
async function timed(cmd: string, args: string[], env: Record<string, string>, n: number): Promise<number> {
  const t0 = process.hrtime.bigint();
  const lines = await collectLines([{ cmd, args, env }], 120_000);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  checkRanks(lines, n);
  return s;
}

class Ours {
  private constructor(
    readonly sidecar: SidecarProcess,
    readonly workers: string[],
  ) {}

  static async start(n: number): Promise<Ours> {
    const sidecar = await SidecarProcess.start();
    const workers = Array.from({ length: n }, (_, i) => `exec-w${i}`);
    await sidecar.registerWorkers(workers);
    return new Ours(sidecar, workers);
  }

  /** A new job's member environments, as REST hands them out, and how long REST took. */
  async job(): Promise<{ id: string; envs: Record<string, string>[]; restS: number }> {
    const t0 = process.hrtime.bigint();
    const job = await this.sidecar.job('mpich', this.workers);
    return { id: job.id, envs: job.envs, restS: Number(process.hrtime.bigint() - t0) / 1e9 };
  }

  async completed(id: string): Promise<void> {
    for (let i = 0; i < 200; i++) {
      const job = await this.sidecar.must('GET', `/v1/jobs/${id}`, undefined, 200);
      if (job.state === 'completed') return;
      if (['failed', 'aborted'].includes(job.state)) throw new Error(`job ${id} ${job.state}: ${job.error}`);
      await sleep(25);
    }
    throw new Error(`job ${id} did not complete`);
  }

  /** One shell forks every rank through `starter`, each with exactly its environment. */
  async launch(starter: Starter, n: number): Promise<{ seconds: number; restS: number }> {
    const job = await this.job();
    const script = job.envs
      .map(
        (env) =>
          `${Object.entries(env)
            .map(([k, v]) => `${k}=${shq(v)}`)
            .join(' ')} ${[...STARTERS[starter], PROGRAM, 'world'].map(shq).join(' ')} &`,
      )
      .join('\n');
    const seconds = await timed('/bin/sh', ['-c', `${script}\nwait`], baseEnv(), n);
    await this.completed(job.id);
    return { seconds, restS: job.restS };
  }
}

async function hydra(n: number): Promise<number> {
  return timed(
    join(WHEEL, 'mpiexec'),
    ['-n', String(n), PROGRAM, 'world'],
    { ...baseEnv(), ...DEFAULT_MEMBER_ENV.mpich },
    n,
  );
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      ranks: { type: 'string' },
      repeats: { type: 'string' },
      quick: { type: 'boolean', default: false },
      'in-session': { type: 'boolean', default: false },
    },
  });
  const quick = values.quick!;
  const n = Number(values.ranks ?? 8);
  const repeats = Number(values.repeats ?? (quick ? 3 : 11));
  const starters: Starter[] = quick
    ? ['dask-pmix-exec', 'dask-pmix exec --setsid']
    : (Object.keys(STARTERS) as Starter[]);
  await build();
  if (!existsSync(STARTERS['dask-pmix-exec'][0])) {
    throw new Error(`${STARTERS['dask-pmix-exec'][0]} is missing: scripts/setup.sh links the binder there`);
  }
  const ours = await Ours.start(n);
  const times: Record<string, number[]> = { hydra: [] };
  const rest: number[] = [];
  const load: number[] = [];
  try {
    // One warm-up of each side (page cache, the sidecar's first job), not counted.
    await hydra(n);
    await ours.launch('dask-pmix-exec', n);
    for (let r = 0; r < repeats; r++) {
      load.push(loadavg()[0]!);
      // Alternate the sides so that drift on the machine hits all alike.
      times.hydra!.push(await hydra(n));
      for (const s of starters) {
        const { seconds, restS } = await ours.launch(s, n);
        (times[s] ??= []).push(seconds);
        rest.push(restS);
      }
    }
  } finally {
    await ours.sidecar.stop();
  }
  const hydraS = median(times.hydra!);
  const results = Object.fromEntries(
    starters.map((s) => [
      s,
      {
        seconds: round3(median(times[s]!)),
        runs: times[s]!.map(round3),
        ratio_to_hydra: round3(median(times[s]!) / hydraS),
      },
    ]),
  );
  // The command the docs give first.
  const headline = results['dask-pmix-exec']!.ratio_to_hydra;
  console.log(
    JSON.stringify(
      {
        benchmark: 'exec',
        host: hostname(),
        cpus: cpus().length,
        load_avg_1m: { min: round3(Math.min(...load)), max: round3(Math.max(...load)) },
        node: process.version,
        ranks: n,
        repeats,
        program: 'test/clients/mpi_job.c world (MPI_Init + Allreduce + Finalize), MPICH 5.0.2 wheel',
        hydra: { seconds: round3(hydraS), runs: times.hydra!.map(round3) },
        ours: results,
        rest_s: round3(median(rest)),
        env: DEFAULT_MEMBER_ENV.mpich,
        notes: [
          'seconds: median over repeats, from starting the launch (one shell forking every rank, or mpiexec) to the exit of the last rank',
          'ours: a job created over REST, each member started with its REST environment through the starter named; rest_s (job + environments) is not in seconds',
          'hydra: mpiexec -n N of the same wheel, the same MPI settings (DEFAULT_MEMBER_ENV.mpich)',
          '--setsid: each rank in a session of its own as hydra does; not the default of dask-pmix exec',
          "dask-pmix-exec: the documented command (the native binder on the environment's PATH); dask-pmix exec (console script): what pip installs as dask-pmix, a Python start before the binder",
        ],
        target: { max_ratio_to_hydra: 1.0, met: headline <= 1.0 },
        guard: guardSection({
          [`n${n}.exec`]: 1 / headline,
          [`n${n}.exec_setsid`]: 1 / results['dask-pmix exec --setsid']!.ratio_to_hydra,
        }),
      },
      null,
      2,
    ),
  );
}

inOwnSession(import.meta.url, main);
