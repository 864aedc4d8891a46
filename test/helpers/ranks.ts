// Starts MPI ranks and PMIx clients the way a Dask worker joins: a separate process whose
// environment holds only the basics plus what the sidecar handed out, never a launcher's.
import { spawn, type ChildProcess } from 'node:child_process';

export interface RankProcess {
  child: ChildProcess;
  /** JSON lines printed on stdout so far. */
  lines: Record<string, unknown>[];
  stderr: () => string;
  /** Resolves with the exit code (or the signal name) when the process ends. */
  exited: Promise<number | string>;
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
  const child = spawn(cmd, args, { env: cleanEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: Record<string, unknown>[] = [];
  const waiters: { pred: (l: Record<string, unknown>) => boolean; resolve: (l: Record<string, unknown>) => void }[] = [];
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
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const exited = new Promise<number | string>((resolve) => {
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve(code ?? signal ?? -1);
    });
  });
  return {
    child,
    lines,
    stderr: () => err,
    exited,
    waitFor(pred, ms = 30_000) {
      const seen = lines.find(pred);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`timed out waiting for a line; have ${JSON.stringify(lines)} stderr=${err.slice(-2000)}`)), ms);
        waiters.push({ pred, resolve: (l) => { clearTimeout(t); resolve(l); } });
      });
    },
  };
}

/** Waits for all to exit and returns their exit codes, with their output on failure. */
export async function allExited(ranks: RankProcess[]): Promise<(number | string)[]> {
  return Promise.all(ranks.map((r) => r.exited));
}

export function describeRanks(ranks: RankProcess[]): string {
  return ranks.map((r, i) => `--- rank ${i}\n${JSON.stringify(r.lines)}\n${r.stderr().slice(-3000)}`).join('\n');
}
