// The sidecar under test: `dask-pmix serve` as a separate process, and a small REST client.
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { join } from 'node:path';

export interface JobJson {
  id: string;
  impl: string;
  state: string;
  error?: string;
  namespace: string;
  members: { workerId: string; rank: number; host: string; state: string }[];
}

export class Sidecar {
  private constructor(
    private readonly proc: ChildProcess,
    readonly url: string,
    readonly log: () => string,
    private readonly token: string,
  ) {}

  static async start(root: string, extraArgs: string[] = []): Promise<Sidecar> {
    const port = await freePort();
    let log = '';
    const token = randomBytes(24).toString('base64url');
    const proc = spawn(
      join(root, 'bin', 'dask-pmix'),
      ['serve', '--port', String(port), '--log-level', 'warn', ...extraArgs],
      {
        env: { ...process.env, DASK_PMIX_NO_SETUP: '1', DASK_PMIX_TOKEN: token },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    proc.stdout!.on('data', (d: Buffer) => (log += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (log += d.toString()));
    const s = new Sidecar(proc, `http://127.0.0.1:${port}`, () => log, token);
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`dask-pmix serve exited: ${log}`);
      try {
        await s.request('GET', '/v1/health');
        return s;
      } catch {
        if (Date.now() > deadline) throw new Error(`dask-pmix serve did not start: ${log}`);
        await sleep(100);
      }
    }
  }

  async request<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    const res = await fetch(this.url + path, {
      method,
      headers: {
        authorization: `Bearer ${this.token}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return (text ? JSON.parse(text) : undefined) as T;
  }

  job(id: string): Promise<JobJson> {
    return this.request<JobJson>('GET', `/v1/jobs/${encodeURIComponent(id)}`);
  }

  /** Polls until the job is in one of `states` or `timeoutMs` passes; returns the last view. */
  async waitForJob(id: string, states: string[], timeoutMs: number): Promise<JobJson> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const job = await this.job(id);
      if (states.includes(job.state) || Date.now() > deadline) return job;
      await sleep(50);
    }
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null) return;
    this.proc.kill('SIGTERM');
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.proc.kill('SIGKILL');
        resolve();
      }, 10_000);
      this.proc.on('exit', () => {
        clearTimeout(t);
        resolve();
      });
    });
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}
