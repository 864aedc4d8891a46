// A `dask-pmix serve` child process for the benchmarks, driven over REST as Dask's plugin drives
// it: its own process, so that nothing the benchmark does runs on the sidecar's event loop.
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
    const token = randomBytes(24).toString('base64url');
    const child = spawn(
      process.execPath,
      [
        ...nodeArgs,
        join(ROOT, 'dist', 'src', 'cli', 'main.js'),
        'serve',
        '--port',
        '0',
        '--log-level',
        'warn',
        ...args,
      ],
      {
        env: { ...process.env, DASK_PMIX_TOKEN: token, ...env },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const url = await new Promise<string>((resolve, reject) => {
      let out = '';
      const t = setTimeout(() => reject(new Error('the sidecar did not start within 60 s')), 60_000);
      child.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /listening on (http:\/\/\S+)/.exec(out);
        if (m) {
          clearTimeout(t);
          resolve(m[1]!);
        }
      });
      child.on('exit', (code) => {
        clearTimeout(t);
        reject(new Error(`the sidecar exited with ${code}: ${out.slice(-1000)}`));
      });
    });
    child.stdout!.resume();
    return new SidecarProcess(child, url, token);
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
