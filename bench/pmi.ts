// PMI benchmark: dask-pmix's PMI server (the real resource manager and PMI backend, in this
// process, as in the sidecar) against MPICH's own launcher, hydra, side by side in one run.
//
//   node dist/bench/pmi.js [--sizes 2,4,8,16] [--iterations 200] [--repeats 5] [--quick]
//
// --quick (the perf guard's run, bench/guard.ts, ~3 s): PMI latency only, N = 2 and 4, 100
// iterations, 3 repeats; `guard.ratios` holds hydra / ours for each latency (and MPI_Init time
// when run). Larger N in a short run is at the mercy of the shared machine's load.
//
// 1. PMI barrier and put/get latency: the same bare PMI-1 client (bench/pmi-client.c) as N
//    ranks, for us started as a worker starts them (dask-pmix exec binds the connection with the
//    PMI_ID credential over the sidecar's UNIX socket and hands it over as PMI_FD), by
//    `mpiexec -n N` (PMI_FD to hydra's proxy over a UNIX socketpair), and by
//    `mpiexec -pmi-port` (TCP). The put+barrier+get round carries a 64-hex-character value,
//    the size of the business card MPICH puts on one host.
// 2. Time to MPI_Init return: N ranks of an MPICH program, from the moment the launch starts
//    until the last rank is back from MPI_Init; for Debian's MPICH 4.0.2 (its mpiexec.hydra)
//    and the 5.0.2 wheel (its mpiexec). With us the ranks are started directly, as Dask
//    workers join; with hydra the time includes mpiexec and its proxy, which is what a user
//    of mpiexec waits for.
//
// Prints one JSON document: medians over repeats (of each run's median over ranks), and the
// ratio ours / hydra (below 1: we are faster).
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { cpus, hostname, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { defaultPolicy } from '../src/policy/index.js';
import { ResourceManager } from '../src/rm/index.js';
import { DEFAULT_MEMBER_ENV } from '../src/service/default-env.js';
import { PmiBackend } from '../src/service/pmi-backend.js';
import { guardSection } from './lib/guard.js';
import {
  BENCH_BIN,
  baseEnv,
  collectLines as collect,
  inOwnSession,
  type Line,
  median,
  ROOT,
  round3 as r3,
  SWEEP_OPTIONS,
  sweepOf,
} from './lib/run.js';

const run = promisify(execFile);

const BIN = BENCH_BIN;
const WHEEL = join(ROOT, '.venv-mpich', 'bin');
const FLAVOURS = {
  mpich4: { cc: 'mpicc.mpich', mpiexec: 'mpiexec.mpich', version: 'MPICH 4.0.2 (Debian)' },
  mpich5: { cc: join(WHEEL, 'mpicc'), mpiexec: join(WHEEL, 'mpiexec'), version: 'MPICH 5.0.2 (PyPI wheel)' },
} as const;
type Flavour = keyof typeof FLAVOURS;

const BENCH_HEADERS = ['pmi-wire.h', 'timing.h'].map((h) => join(ROOT, 'bench', h));

async function build(): Promise<void> {
  mkdirSync(BIN, { recursive: true });
  const jobs: [string, string, string, string[]][] = [
    ['pmi-client', 'gcc', join(ROOT, 'bench', 'pmi-client.c'), ['-O2', '-Wall']],
    ...Object.entries(FLAVOURS).map(([f, v]): [string, string, string, string[]] => [
      `init-probe-${f}`,
      v.cc,
      join(ROOT, 'test', 'clients', 'mpich_probe.c'),
      // The probe binds its PMI connection as dask-pmix exec's binder does, with its header.
      ['-O', `-I${join(ROOT, 'native', 'exec')}`],
    ]),
  ];
  for (const [out, cc, src, flags] of jobs) {
    const o = join(BIN, out);
    // with the headers they include: the probe's pmi_connect.h, the client's own (beside it)
    const inputs = [src, join(ROOT, 'native', 'exec', 'pmi_connect.h'), ...BENCH_HEADERS];
    if (existsSync(o) && inputs.every((i) => statSync(o).mtimeMs > statSync(i).mtimeMs)) continue;
    await run(cc, ['-o', o, src, ...flags]);
  }
}

/** `dask-pmix exec`'s binder: binds a rank's PMI connection with its credential and runs the rank on it (PMI_FD). */
const PMI_EXEC = join(ROOT, 'native', 'build', 'Release', 'dask-pmix-exec');

const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * Our ranks, started the way hydra's proxy starts its own: one process forks them all, each
 * with exactly its environment, each in a session of its own (hydra's proxy calls setsid for
 * every rank). The session matters on a shared machine: with the kernel's autogroup scheduling
 * (on here) every session gets one fair share of the CPU, so N ranks in one session got one
 * share against hydra's N, and MPI_Init of 8 MPICH 4.0.2 ranks took 1.5-2.3 s against hydra's
 * 0.5-0.8 s at load 25, with the same PMI traffic. (Spawning N children from this Node process
 * would charge the event loop that also serves PMI with N fork/execs, which no sidecar pays.)
 */
function viaShell(ranks: { cmd: string; args: string[]; env: Record<string, string> }[]) {
  // One fork and one exec per rank, as hydra's proxy: the shell's assignments give each rank its
  // environment (on top of the base one hydra's ranks get too), the binder's --setsid its session.
  const script = ranks
    .map(
      ({ cmd, args, env }) =>
        `${Object.entries(env)
          .map(([k, v]) => `${k}=${shq(v)}`)
          .join(' ')} ${[PMI_EXEC, '--setsid', cmd, ...args].map(shq).join(' ')} &`,
    )
    .join('\n');
  return [{ cmd: '/bin/sh', args: ['-c', `${script}\nwait`], env: baseEnv() }];
}

class Ours {
  private nextWorker = 0;
  private constructor(
    readonly rm: ResourceManager,
    readonly backend: PmiBackend,
  ) {}

  static async start(): Promise<Ours> {
    const rm = new ResourceManager({ policy: defaultPolicy({ releaseGraceMs: 1000 }) });
    const backend = await PmiBackend.start({ rm });
    rm.addBackend(backend);
    return new Ours(rm, backend);
  }

  /** A job of n members; each member's environment as the REST API would hand it out. */
  async job(n: number): Promise<{ id: string; envs: Record<string, string>[] }> {
    const ids = Array.from({ length: n }, () => `bench-w${++this.nextWorker}`);
    for (const id of ids) this.rm.registerWorker({ id, host: hostname() });
    const job = await this.rm.createJob({ impl: 'mpich', members: ids });
    return { id: job.id, envs: ids.map((w) => this.rm.memberEnv(job.id, w).env) };
  }

  async done(id: string): Promise<void> {
    const state = this.rm.getJob(id).state;
    if (state !== 'completed') throw new Error(`job ${id} ended ${state}: ${this.rm.getJob(id).error}`);
    await this.rm.released(id);
    for (const m of this.rm.getJob(id).members) this.rm.removeWorker(m.workerId);
  }
}

interface Latency {
  barrier_us: number;
  put_us: number;
  get_us: number;
  put_barrier_get_us: number;
}
const LAT_KEYS = ['barrier_us', 'put_us', 'get_us', 'put_barrier_get_us'] as const;

function latencyOf(lines: Line[], n: number): Latency {
  if (lines.length !== n || lines.some((l) => l.ok !== true))
    throw new Error(`bad client output: ${JSON.stringify(lines)}`);
  return Object.fromEntries(LAT_KEYS.map((k) => [k, median(lines.map((l) => Number(l[k])))])) as unknown as Latency;
}

async function pmiLatencyOurs(ours: Ours, n: number, iters: number): Promise<Latency> {
  const job = await ours.job(n);
  const lines = await collect(
    viaShell(job.envs.map((env) => ({ cmd: join(BIN, 'pmi-client'), args: [String(iters)], env }))),
  );
  await ours.done(job.id);
  return latencyOf(lines, n);
}

/** Hydra's default gives each rank one end of a UNIX socketpair (PMI_FD); -pmi-port makes it TCP, like ours. */
async function pmiLatencyHydra(n: number, iters: number, tcp: boolean): Promise<Latency> {
  const args = [...(tcp ? ['-pmi-port'] : []), '-n', String(n), join(BIN, 'pmi-client'), String(iters)];
  const lines = await collect([{ cmd: FLAVOURS.mpich5.mpiexec, args, env: baseEnv() }]);
  return latencyOf(lines, n);
}

interface InitTime {
  launch_to_last_init_s: number;
  init_median_s: number;
}

function initOf(lines: Line[], n: number, t0: number): InitTime {
  if (lines.length !== n || lines.some((l) => l.init_rc !== 0))
    throw new Error(`bad probe output: ${JSON.stringify(lines)}`);
  return {
    launch_to_last_init_s: Math.max(...lines.map((l) => Number(l.t_init))) - t0,
    init_median_s: median(lines.map((l) => Number(l.t_init) - Number(l.t_start))),
  };
}

const mpiEnv = () => ({ ...baseEnv(), ...DEFAULT_MEMBER_ENV.mpich });

async function initOurs(ours: Ours, f: Flavour, n: number): Promise<InitTime> {
  const job = await ours.job(n);
  const t0 = Date.now() / 1000;
  const lines = await collect(
    viaShell(
      job.envs.map((env) => ({
        cmd: join(BIN, `init-probe-${f}`),
        args: ['init'],
        env: { ...DEFAULT_MEMBER_ENV.mpich, ...env },
      })),
    ),
  );
  await ours.done(job.id);
  return initOf(lines, n, t0);
}

async function initHydra(f: Flavour, n: number): Promise<InitTime> {
  const t0 = Date.now() / 1000;
  const lines = await collect([
    { cmd: FLAVOURS[f].mpiexec, args: ['-n', String(n), join(BIN, `init-probe-${f}`), 'init'], env: mpiEnv() },
  ]);
  return initOf(lines, n, t0);
}

const med = <T extends object>(runs: T[]) =>
  Object.fromEntries(
    Object.keys(runs[0]!).map((k) => [k, r3(median(runs.map((r) => (r as Record<string, number>)[k]!)))]),
  );

/** Medians over repeats of each field, and ours / hydra per field. */
function summarize<T extends object>(ours: T[], hydra: T[]) {
  const o = med(ours);
  const h = med(hydra);
  return { ours: o, hydra: h, ratio: Object.fromEntries(Object.keys(o).map((k) => [k, r3(o[k]! / h[k]!)])) };
}

/** hydra / ours per figure (above 1: we are faster), for the perf guard. */
function guardRatios(
  results: {
    ranks: number;
    pmi_latency: { ratio: Record<string, number> };
    mpi_init?: Record<string, { ratio: Record<string, number> }>;
  }[],
) {
  const out: Record<string, number> = {};
  for (const r of results) {
    for (const [k, x] of Object.entries(r.pmi_latency.ratio)) out[`n${r.ranks}.pmi.${k}`] = 1 / x;
    for (const [f, m] of Object.entries(r.mpi_init ?? {}))
      out[`n${r.ranks}.init.${f}`] = 1 / m.ratio.launch_to_last_init_s!;
  }
  return out;
}

/** The targets: at most 1.0x hydra's latency for a barrier, a put+barrier+get and MPI_Init (both MPICHs), at N = 2, 8, 16. */
function targetsMet(
  results: {
    ranks: number;
    pmi_latency: { ratio: Record<string, number> };
    mpi_init?: Record<string, { ratio: Record<string, number> }>;
  }[],
) {
  const met: Record<string, { ratio: number; met: boolean }> = {};
  for (const r of results.filter((x) => [2, 8, 16].includes(x.ranks))) {
    const add = (k: string, ratio: number | undefined) => {
      if (ratio !== undefined) met[`n${r.ranks}.${k}`] = { ratio, met: ratio <= 1.0 };
    };
    add('barrier', r.pmi_latency.ratio.barrier_us);
    add('put_barrier_get', r.pmi_latency.ratio.put_barrier_get_us);
    for (const [f, m] of Object.entries(r.mpi_init ?? {})) add(`mpi_init.${f}`, m.ratio.launch_to_last_init_s);
  }
  return { max_ratio: 1.0, met };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { ...SWEEP_OPTIONS, 'in-session': { type: 'boolean', default: false } },
  });
  const { quick, sizes, iters, repeats } = sweepOf(values, { iterations: [100, 200], repeats: [3, 5] });
  await build();
  const ours = await Ours.start();
  const results = [];
  const load: number[] = [];
  try {
    for (const n of sizes) {
      load.push(loadavg()[0]!);
      const lat = { ours: [] as Latency[], hydra: [] as Latency[], hydraTcp: [] as Latency[] };
      const init = {
        mpich4: { ours: [] as InitTime[], hydra: [] as InitTime[] },
        mpich5: { ours: [] as InitTime[], hydra: [] as InitTime[] },
      };
      // Alternate the two sides so that drift on the machine hits both alike.
      for (let r = 0; r < repeats; r++) {
        lat.ours.push(await pmiLatencyOurs(ours, n, iters));
        lat.hydra.push(await pmiLatencyHydra(n, iters, false));
        lat.hydraTcp.push(await pmiLatencyHydra(n, iters, true));
        for (const f of quick ? [] : (['mpich4', 'mpich5'] as const)) {
          init[f].ours.push(await initOurs(ours, f, n));
          init[f].hydra.push(await initHydra(f, n));
        }
      }
      results.push({
        ranks: n,
        pmi_latency: {
          ...summarize(lat.ours, lat.hydra),
          hydra_pmi_port: med(lat.hydraTcp),
          ratio_to_hydra_pmi_port: summarize(lat.ours, lat.hydraTcp).ratio,
        },
        ...(quick
          ? {}
          : {
              mpi_init: {
                mpich4: summarize(init.mpich4.ours, init.mpich4.hydra),
                mpich5: summarize(init.mpich5.ours, init.mpich5.hydra),
              },
            }),
      });
      process.stderr.write(`[bench] ${n} ranks done\n`);
    }
  } finally {
    await ours.rm.shutdown('benchmark done');
  }
  console.log(
    JSON.stringify(
      {
        benchmark: 'pmi',
        host: hostname(),
        cpus: cpus().length,
        load_avg_1m: { min: r3(Math.min(...load)), max: r3(Math.max(...load)) },
        node: process.version,
        iterations: iters,
        repeats,
        hydra: {
          pmi_latency: FLAVOURS.mpich5.version,
          mpi_init: { mpich4: FLAVOURS.mpich4.version, mpich5: FLAVOURS.mpich5.version },
        },
        env: DEFAULT_MEMBER_ENV.mpich,
        notes: [
          'medians over repeats of per-run medians over ranks; ratio = ours / hydra (below 1: dask-pmix faster)',
          'pmi_latency.hydra: mpiexec default (PMI_FD, a UNIX socketpair to its proxy); hydra_pmi_port: mpiexec -pmi-port (TCP, as ours)',
          'mpi_init.launch_to_last_init_s: from starting the launch (mpiexec, or one shell forking our ranks) to the last MPI_Init return',
          'mpi_init.init_median_s: per rank, from main() to MPI_Init return',
        ],
        results,
        targets: targetsMet(results),
        guard: guardSection(guardRatios(results)),
      },
      null,
      2,
    ),
  );
}

// The server side in a session of its own, as hydra's proxy and the embedded sidecar.
inOwnSession(import.meta.url, main);
