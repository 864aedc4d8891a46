// The perf guard of the test command: runs each benchmark's short mode and fails when its ratio
// has fallen to less than half the one recorded in bench/results/<name>.json (the last full
// run). It compares ratios (reference / ours, both sides measured in the same run, see
// lib/guard.ts), never absolute times, so a slower machine does not trip it; losing half of what
// we had against the reference does.
//
// The ratio guarded per benchmark is the geometric mean of the ratios the quick run shares with
// the record, against the record's geometric mean over the same keys. Single ratios of a run of
// a few seconds swing by up to 10x on the shared 2-core machine (PMI put+barrier+get at N = 8:
// 0.05-0.19 in four runs at load 24, 0.55 recorded idle), their mean by well under 2x; every
// single ratio below half its record is still printed.
//
//   node dist/bench/guard.js [--only pmix,pmi,rest] [--factor 2]
//
// A benchmark joins the guard by printing `guard.ratios` in both its full and its --quick run,
// and by having its full run's JSON recorded in bench/results/.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { GuardSection } from './lib/guard.js';
import { ROOT } from './lib/run.js';

interface Guarded {
  name: string;
  /** The benchmark's command (run with --quick): a script under dist/bench, or a Python one under bench/. */
  script: string;
  /** The recorded full run. */
  recorded: string;
  /** Bound on the quick run. */
  timeoutMs: number;
}

export const GUARDED: Guarded[] = [
  { name: 'pmi', script: 'pmi.js', recorded: 'pmi.json', timeoutMs: 90_000 },
  { name: 'pmix', script: 'pmix.js', recorded: 'pmix.json', timeoutMs: 90_000 },
  { name: 'rest', script: 'rest.js', recorded: 'rest.json', timeoutMs: 90_000 },
  { name: 'exec', script: 'exec.js', recorded: 'exec.json', timeoutMs: 90_000 },
  // A later in-process job against Dask's own floor (Open MPI's environment, a real cluster of 4).
  { name: 'job', script: 'job_breakdown.py', recorded: 'job_breakdown-4.json', timeoutMs: 180_000 },
];

/** The command line of a benchmark's quick run. */
function command(script: string): [string, string[]] {
  if (script.endsWith('.py')) return [join(ROOT, '.venv', 'bin', 'python'), [join(ROOT, 'bench', script), '--quick']];
  return [process.execPath, [join(ROOT, 'dist', 'bench', script), '--quick']];
}

function quickRun(g: Guarded): Promise<{ doc: { guard?: GuardSection }; seconds: number }> {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const [cmd, args] = command(g.script);
    const child = spawn(cmd, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-4000)));
    const timer = setTimeout(() => child.kill('SIGKILL'), g.timeoutMs);
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      if (code !== 0)
        return reject(
          new Error(
            `${g.script} --quick exited ${code ?? sig}${sig === 'SIGKILL' ? ` (over ${g.timeoutMs} ms)` : ''}: ${err.slice(-1500)}`,
          ),
        );
      try {
        resolve({ doc: JSON.parse(out), seconds: (Date.now() - t0) / 1000 });
      } catch (e) {
        reject(new Error(`${g.script} --quick printed no JSON document: ${String(e)} ${out.slice(0, 500)}`));
      }
    });
  });
}

export interface Verdict {
  key: string;
  recorded: number;
  now: number;
  ok: boolean;
}

/** Per key both runs have: whether it stays above recorded / factor. */
export function compare(recorded: Record<string, number>, now: Record<string, number>, factor: number): Verdict[] {
  return Object.keys(now)
    .filter((k) => k in recorded)
    .map((key) => ({ key, recorded: recorded[key]!, now: now[key]!, ok: now[key]! >= recorded[key]! / factor }));
}

export const geomean = (xs: number[]): number => Math.exp(xs.reduce((a, x) => a + Math.log(x), 0) / xs.length);

export interface Judgement {
  ok: boolean;
  recorded: number;
  now: number;
  verdicts: Verdict[];
}

/** The benchmark's verdict: its geometric mean over the shared keys against the record's. */
export function judge(recorded: Record<string, number>, now: Record<string, number>, factor: number): Judgement {
  const verdicts = compare(recorded, now, factor);
  if (verdicts.length === 0) return { ok: false, recorded: NaN, now: NaN, verdicts };
  const was = geomean(verdicts.map((v) => v.recorded));
  const is = geomean(verdicts.map((v) => v.now));
  return { ok: is >= was / factor, recorded: was, now: is, verdicts };
}

/** The ratios a results file records, or why there are none (a file with none guards nothing, so it fails). */
export function recordedRatios(file: string): Record<string, number> | string {
  if (!existsSync(file)) return `${file} does not exist`;
  const ratios = (JSON.parse(readFileSync(file, 'utf8')) as { guard?: GuardSection }).guard?.ratios;
  if (!ratios || Object.keys(ratios).length === 0) return `${file} has no guard.ratios`;
  return ratios;
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { only: { type: 'string' }, factor: { type: 'string', default: '2' } } });
  const factor = Number(values.factor);
  const only = values.only?.split(',');
  let failed = false;
  for (const g of GUARDED.filter((x) => !only || only.includes(x.name))) {
    const recorded = recordedRatios(join(ROOT, 'bench', 'results', g.recorded));
    if (typeof recorded === 'string') {
      console.log(
        `[perf-guard] ${g.name}: FAIL, ${recorded}: record a full run (${command(g.script).flat().join(' ')})`,
      );
      failed = true;
      continue;
    }
    const { doc, seconds } = await quickRun(g);
    const now = doc.guard?.ratios;
    if (!now) throw new Error(`${g.script} --quick printed no guard.ratios`);
    const j = judge(recorded, now, factor);
    failed ||= !j.ok;
    if (j.verdicts.length === 0) {
      console.log(
        `[perf-guard] ${g.name}: FAIL, the quick run shares no ratio with the recorded one (${Object.keys(now).join(', ')})`,
      );
      continue;
    }
    console.log(
      `[perf-guard] ${g.name}: ${j.ok ? 'ok' : 'FAIL'}, geometric mean of ${j.verdicts.length} ratios ${j.now.toFixed(3)} ` +
        `(recorded ${j.recorded.toFixed(3)}, floor ${(j.recorded / factor).toFixed(3)}), quick run ${seconds.toFixed(1)} s`,
    );
    for (const v of j.verdicts.filter((x) => !x.ok))
      console.log(
        `[perf-guard]   ${g.name} ${v.key}: ${v.now} < ${v.recorded} / ${factor} (single ratio, not guarded)`,
      );
  }
  if (failed) {
    console.log(
      `[perf-guard] a benchmark's ratio fell to less than 1/${factor} of its record: run it in full (node dist/bench/<name>.js) to see whether the loss is real`,
    );
    process.exitCode = 1;
  }
}

if (process.argv[1]?.endsWith('guard.js')) {
  main().catch((e: unknown) => {
    console.error(`[perf-guard] ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  });
}
