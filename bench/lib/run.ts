// What the benchmarks share: where the checkout is, the machine, the command line of a sweep over
// rank counts, medians, and starting processes that print one JSON line each (ranks, clients),
// with a bound on how long they may take.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cpus, hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

function findRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || existsSync(join(dir, 'CMakeLists.txt'))) dir = dirname(dir);
  return dir;
}

export const ROOT = findRoot();
export const BENCH_BIN = join(ROOT, 'bench', '.work', 'bin');

/** The machine the figures come from (each benchmark records its load where it needs it). */
export const machine = () => ({
  host: hostname(),
  cpus: cpus().length,
  model: cpus()[0]?.model ?? '',
  node: process.version,
});

/** The options of a sweep over rank counts: --sizes 2,4,8,16 --iterations N --repeats N --quick. */
export const SWEEP_OPTIONS = {
  sizes: { type: 'string' },
  iterations: { type: 'string' },
  repeats: { type: 'string' },
  quick: { type: 'boolean', default: false },
} as const;

/**
 * The sweep the command line asks for. The sizes default to 2,4 with --quick and 2,4,8,16
 * without; `defaults` gives the iterations and repeats as [with --quick, without].
 */
export function sweepOf(
  values: { sizes?: string; iterations?: string; repeats?: string; quick?: boolean },
  defaults: { iterations: [number, number]; repeats: [number, number] },
): { quick: boolean; sizes: number[]; iters: number; repeats: number } {
  const quick = values.quick === true;
  const pick = ([q, full]: [number, number]) => (quick ? q : full);
  return {
    quick,
    sizes: (values.sizes ?? (quick ? '2,4' : '2,4,8,16')).split(',').map(Number),
    iters: Number(values.iterations ?? pick(defaults.iterations)),
    repeats: Number(values.repeats ?? pick(defaults.repeats)),
  };
}

export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
};
export const round3 = (x: number): number => Math.round(x * 1000) / 1000;

/** The environment a rank starts with before the sidecar's (or the launcher's) own. */
export const baseEnv = (): Record<string, string> => {
  const env: Record<string, string> = {};
  for (const k of ['PATH', 'HOME', 'LANG', 'TMPDIR']) if (process.env[k]) env[k] = process.env[k]!;
  return env;
};

export type Line = Record<string, unknown>;
export interface Proc {
  cmd: string;
  args: string[];
  env: Record<string, string>;
}

/**
 * Starts the processes and resolves with the JSON lines they print on stdout; rejects (and kills
 * the others) when one exits badly or the whole takes longer than `timeoutMs`.
 */
export function collectLines(procs: Proc[], timeoutMs = 120_000): Promise<Line[]> {
  return new Promise((resolve, reject) => {
    const lines: Line[] = [];
    let left = procs.length;
    let failed = false;
    const fail = (err: Error) => {
      if (failed) return;
      failed = true;
      clearTimeout(timer);
      for (const c of children) c.kill('SIGKILL');
      reject(err);
    };
    const children = procs.map(({ cmd, args, env }) => {
      const c = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      c.stdout.setEncoding('utf8').on('data', (d: string) => {
        out += d;
        let nl: number;
        while ((nl = out.indexOf('\n')) >= 0) {
          const l = out.slice(0, nl).trim();
          out = out.slice(nl + 1);
          if (l.startsWith('{')) {
            try {
              lines.push(JSON.parse(l) as Line);
            } catch {
              /* a launcher's own output */
            }
          }
        }
      });
      c.stderr.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-4000)));
      c.on('error', (e) => fail(e));
      c.on('close', (code, sig) => {
        if (code !== 0 || sig)
          return fail(
            new Error(
              `${cmd} exited ${code ?? sig}: ${err.slice(-1500)} ${JSON.stringify(lines.filter((l) => l.ok === false))}`,
            ),
          );
        if (--left === 0 && !failed) {
          clearTimeout(timer);
          resolve(lines);
        }
      });
      return c;
    });
    const timer = setTimeout(() => fail(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
  });
}

/** Runs `op(i)` for every i < n, with `inFlight` of them at once. */
export async function inFlight(n: number, k: number, op: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: k }, async () => {
      for (let i = next++; i < n; i = next++) await op(i);
    }),
  );
}

/**
 * Runs `main` in a session of its own: re-runs this script (`url`, import.meta.url) detached
 * (setsid), passing its arguments and output through. With autogroup scheduling a session is a
 * CPU share; hydra's proxy calls setsid, and the embedded sidecar starts with
 * start_new_session, so a benchmark's server side runs alike, and one started from a busy
 * session (a test run) does not share that session's one share.
 */
export function inOwnSession(url: string, main: () => Promise<void>): void {
  const run = () =>
    main().catch((e: unknown) => {
      console.error(e);
      process.exit(1);
    });
  if (process.argv.includes('--in-session')) {
    void run();
    return;
  }
  const child = spawn(
    process.execPath,
    [...process.execArgv, fileURLToPath(url), ...process.argv.slice(2), '--in-session'],
    {
      detached: true,
      stdio: 'inherit',
    },
  );
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig));
  child.on('exit', (code, sig) => process.exit(code ?? (sig ? 1 : 0)));
}
