// A `dask-pmix serve` child process for the benchmarks, driven over REST as Dask's plugin drives
// it: its own process, so that nothing the benchmark does runs on the sidecar's event loop.
// startServe is also how the tests start `serve` as an operator would (bench/lib is below test/).
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { median, ROOT } from './run.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface Reply {
  status: number;
  body: any;
}

export interface ServeOptions {
  /** Flags after `serve --port 0 --log-level <logLevel>`. */
  args?: string[];
  /** Default warn. */
  logLevel?: string;
  /** DASK_PMIX_TOKEN; a random one by default. */
  token?: string;
  /** Over the environment of this process and DASK_PMIX_TOKEN. */
  env?: Record<string, string>;
  /** Start it as an operator does, through bin/dask-pmix, rather than node dist/src/cli/main.js. */
  viaBin?: boolean;
  /** Flags for Node.js itself (not with viaBin). */
  nodeArgs?: string[];
  /** 'pipe' keeps what it writes to stderr in `err`; by default stderr is this process's. */
  stderr?: 'inherit' | 'pipe';
  /** How long it may take to print its listening line (default 60 s). */
  startMs?: number;
}

export interface ServeChild {
  readonly child: ChildProcess;
  readonly url: string;
  readonly token: string;
  /** All it has written to stdout so far. */
  readonly out: string;
  /** All it has written to stderr so far (with stderr: 'pipe'). */
  readonly err: string;
}

/**
 * Starts `dask-pmix serve --port 0` as a child and resolves once it prints its listening line.
 * Rejects if it exits first or takes longer than `startMs`, and then leaves no child behind.
 */
export async function startServe(opts: ServeOptions = {}): Promise<ServeChild> {
  const token = opts.token ?? randomBytes(24).toString('base64url');
  const serveArgs = ['serve', '--port', '0', '--log-level', opts.logLevel ?? 'warn', ...(opts.args ?? [])];
  const [cmd, argv] = opts.viaBin
    ? [join(ROOT, 'bin', 'dask-pmix'), serveArgs]
    : [process.execPath, [...(opts.nodeArgs ?? []), join(ROOT, 'dist', 'src', 'cli', 'main.js'), ...serveArgs]];
  const child = spawn(cmd, argv, {
    env: { ...process.env, DASK_PMIX_TOKEN: token, ...opts.env },
    stdio: ['ignore', 'pipe', opts.stderr ?? 'inherit'],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const startMs = opts.startMs ?? 60_000;
  const said = () => `stdout: ${out.slice(-1000)}${err ? `\nstderr: ${err.slice(-1000)}` : ''}`;
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const t = setTimeout(
        () => reject(new Error(`the sidecar did not print its listening line within ${startMs / 1000} s: ${said()}`)),
        startMs,
      );
      const exited = (code: number | null, signal: NodeJS.Signals | null) => {
        clearTimeout(t);
        reject(new Error(`the sidecar exited with ${code ?? signal}: ${said()}`));
      };
      const listening = () => {
        const m = /listening on (http:\/\/\S+)/.exec(out);
        if (!m) return;
        clearTimeout(t);
        child.stdout!.off('data', listening);
        child.off('exit', exited);
        resolve(m[1]!);
      };
      child.stdout!.on('data', listening);
      child.once('exit', exited);
    });
    return {
      child,
      url,
      token,
      get out() {
        return out;
      },
      get err() {
        return err;
      },
    };
  } catch (e) {
    child.kill('SIGKILL');
    throw e;
  }
}

export class SidecarProcess {
  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
    readonly token: string,
  ) {}

  /**
   * Starts `dask-pmix serve --port 0` with `args`; resolves once it listens. `nodeArgs` go to
   * Node.js itself (e.g. --cpu-prof, to see where the sidecar's time goes).
   */
  static async start(
    args: string[] = [],
    env: Record<string, string> = {},
    nodeArgs: string[] = [],
  ): Promise<SidecarProcess> {
    const s = await startServe({ args, env, nodeArgs });
    return new SidecarProcess(s.child, s.url, s.token);
  }

  get pid(): number {
    return this.child.pid!;
  }

  async call(method: string, path: string, body?: unknown): Promise<Reply> {
    const res = await fetch(this.url + path, {
      method,
      headers: {
        authorization: `Bearer ${this.token}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(60_000),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : undefined };
  }

  /** Calls and checks the status; returns the body. */
  async must(method: string, path: string, body: unknown, want: number): Promise<any> {
    const r = await this.call(method, path, body);
    if (r.status !== want) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  }

  /** Resident set size of the sidecar process, in kB (VmRSS). */
  rssKb(): number {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${this.pid}/status`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  }

  /** VmRSS after a second of rest: the median of 5 samples over the next second, in kB. */
  async settledRssKb(): Promise<number> {
    await sleep(1000);
    const xs: number[] = [];
    for (let i = 0; i < 5; i++) {
      xs.push(this.rssKb());
      await sleep(200);
    }
    return median(xs);
  }

  /** CPU time the sidecar has used so far (all its threads, user + system), in seconds. */
  cpuSeconds(): number {
    const stat = readFileSync(`/proc/${this.pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields 14 and 15 of proc(5), utime and stime, in clock ticks (USER_HZ, 100 on Linux).
    return (Number(f[11]) + Number(f[12])) / 100;
  }

  /** Registers workers of these ids on this host, as the scheduler plugin would. */
  async registerWorkers(ids: string[]): Promise<void> {
    for (const id of ids) {
      await this.must(
        'POST',
        '/v1/workers',
        { id, host: hostname(), pid: process.pid, uid: process.getuid!(), gid: process.getgid!() },
        201,
      );
    }
  }

  /** A job of `members` (registered workers); each member's environment as a worker would fetch it. */
  async job(
    impl: 'openmpi' | 'mpich' | 'intelmpi',
    members: string[],
    extra: Record<string, unknown> = {},
  ): Promise<{ id: string; envs: Record<string, string>[] }> {
    const job = await this.must('POST', '/v1/jobs', { impl, members, ...extra }, 201);
    const envs: Record<string, string>[] = [];
    for (const m of job.members as { workerId: string }[]) {
      envs.push(
        (await this.must('GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(m.workerId)}`, undefined, 200)).env,
      );
    }
    return { id: job.id as string, envs };
  }

  /** Waits (bounded) until the job has ended; fails unless it completed. */
  async ended(id: string, timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const job = await this.must('GET', `/v1/jobs/${id}`, undefined, 200);
      if (job.state === 'completed') return;
      if (['failed', 'aborted', 'cancelled'].includes(job.state))
        throw new Error(`job ${id} ended ${job.state}: ${job.error ?? ''}`);
      if (Date.now() > deadline) throw new Error(`job ${id} still ${job.state} after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGTERM');
    const t = setTimeout(() => this.child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(t);
  }
}
