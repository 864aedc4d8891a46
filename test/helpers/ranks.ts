// Starts MPI ranks and PMIx clients the way a Dask worker joins: a separate process whose
// environment holds only the basics plus what the sidecar handed out, never a launcher's.
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';

export interface RankProcess {
  child: ChildProcess;
  /** JSON lines printed on stdout so far. */
  lines: Record<string, unknown>[];
  stderr: () => string;
  /** Resolves with the exit code (or the signal name) when the process ends. */
  exited: Promise<number | string>;
  /** Kills the process; the MPI library's /dev/shm segments it had mapped are removed after it. */
  kill(signal?: NodeJS.Signals): void;
  /** Resolves with the first JSON line that satisfies `pred`. */
  waitFor(pred: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
}

const BASE_ENV_KEYS = ['PATH', 'HOME', 'LANG', 'TMPDIR'];

export function cleanEnv(extra: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {};
  for (const k of BASE_ENV_KEYS) if (process.env[k]) env[k] = process.env[k] as string;
  // Ranks busy-poll while they wait; on 2 cores they must yield or they starve each other.
  env.OMPI_MCA_mpi_yield_when_idle = '1';
  return { ...env, ...extra };
}

export function startRank(cmd: string, args: string[], env: Record<string, string>, timeoutMs = 60_000): RankProcess {
  // The rank dies with the test process (setpriv execs it, so the pid is the rank's): a test run
  // that is killed must not leave MPI ranks spinning on the CPU the next tests need.
  const child = spawn('/usr/bin/setpriv', ['--pdeathsig', 'KILL', '--', cmd, ...args], {
    env: cleanEnv(env),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Record<string, unknown>[] = [];
  const waiters: { pred: (l: Record<string, unknown>) => boolean; resolve: (l: Record<string, unknown>) => void }[] =
    [];
  let out = '';
  let err = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    out += chunk;
    let nl: number;
    while ((nl = out.indexOf('\n')) >= 0) {
      const text = out.slice(0, nl).trim();
      out = out.slice(nl + 1);
      if (!text.startsWith('{')) continue;
      try {
        const line = JSON.parse(text) as Record<string, unknown>;
        lines.push(line);
        for (const w of [...waiters]) {
          if (w.pred(line)) {
            waiters.splice(waiters.indexOf(w), 1);
            w.resolve(line);
          }
        }
      } catch {
        /* not ours */
      }
    }
  });
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
    err += chunk;
  });
  // A rank that dies mid-job never unlinks its MPI library's shared-memory segments (MPICH's
  // mpich_shm_* stay in /dev/shm): note the ones it maps while it lives, remove them if it ends
  // abnormally, so that failing tests leave no litter behind.
  const segments = new Set<string>();
  const note = () => {
    if (child.pid) for (const f of shmSegments(child.pid)) segments.add(f);
  };
  const watch = setInterval(note, 200);
  // Resolved once its output has been read too: 'exit' can come before the last lines a rank
  // printed reach us ('close'), which made a test miss a rank's final line under load. A rank
  // whose output stays open after it exited (a child of its own holds it) is not waited for long.
  const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
  const exited = new Promise<number | string>((resolve) => {
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      clearInterval(watch);
      if (code !== 0) for (const f of segments) rmSync(f, { force: true });
      void Promise.race([closed, new Promise((r) => setTimeout(r, 5_000))]).then(() => resolve(code ?? signal ?? -1));
    });
  });
  const kill = (signal: NodeJS.Signals = 'SIGKILL') => {
    note();
    child.kill(signal);
  };
  const timer = setTimeout(() => kill('SIGKILL'), timeoutMs);
  return {
    child,
    lines,
    stderr: () => err,
    exited,
    kill,
    waitFor(pred, ms = 30_000) {
      const seen = lines.find(pred);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const t = setTimeout(
          () =>
            reject(new Error(`timed out waiting for a line; have ${JSON.stringify(lines)} stderr=${err.slice(-2000)}`)),
          ms,
        );
        waiters.push({
          pred,
          resolve: (l) => {
            clearTimeout(t);
            resolve(l);
          },
        });
      });
    },
  };
}

/** The /dev/shm files a process has mapped. */
export function shmSegments(pid: number): string[] {
  try {
    const maps = readFileSync(`/proc/${pid}/maps`, 'utf8');
    return [
      ...new Set(
        maps
          .split('\n')
          .map((l) => l.split(/\s+/)[5] ?? '')
          .filter((f) => f.startsWith('/dev/shm/')),
      ),
    ];
  } catch {
    return [];
  }
}

/** Waits for all to exit and returns their exit codes, with their output on failure. */
export async function allExited(ranks: RankProcess[]): Promise<(number | string)[]> {
  return Promise.all(ranks.map((r) => r.exited));
}

export function describeRanks(ranks: RankProcess[]): string {
  return ranks.map((r, i) => `--- rank ${i}\n${JSON.stringify(r.lines)}\n${r.stderr().slice(-3000)}`).join('\n');
}
