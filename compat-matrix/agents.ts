// Long-lived rank processes ("agents", see programs/agent.c), started once per row the way Dask
// workers are: with a clean environment, registered with the sidecar as workers. Each job
// reaches them as one line on stdin; what they and their children print comes back as JSON.
import { type ChildProcess, spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { type Sidecar, sleep } from './sidecar.js';

export type Line = Record<string, unknown>;

export class Agent {
  readonly lines: Line[] = [];
  private waiters: { pred: (l: Line) => boolean; resolve: (l: Line) => void }[] = [];
  private buf = '';
  stderr = '';

  constructor(
    readonly id: string,
    readonly proc: ChildProcess,
  ) {
    proc.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      this.buf += chunk;
      let nl: number;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const text = this.buf.slice(0, nl).trim();
        this.buf = this.buf.slice(nl + 1);
        if (!text.startsWith('{')) continue;
        let line: Line;
        try {
          line = JSON.parse(text) as Line;
        } catch {
          continue;
        }
        this.lines.push(line);
        for (const w of [...this.waiters]) {
          if (w.pred(line)) {
            this.waiters.splice(this.waiters.indexOf(w), 1);
            w.resolve(line);
          }
        }
      }
    });
    proc.stderr!.setEncoding('utf8').on('data', (c: string) => {
      this.stderr = (this.stderr + c).slice(-20_000);
    });
  }

  get pid(): number {
    return this.proc.pid ?? 0;
  }

  get alive(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  send(fields: string[]): void {
    this.proc.stdin!.write(`${fields.join('\t')}\n`);
  }

  /** The first line (from `since`) satisfying `pred`, waiting up to `timeoutMs`. */
  waitFor(pred: (l: Line) => boolean, timeoutMs: number, since = 0): Promise<Line | undefined> {
    const seen = this.lines.slice(since).find(pred);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => {
      const w = { pred, resolve: (l: Line | undefined) => resolve(l) };
      this.waiters.push(w as never);
      setTimeout(() => {
        const i = this.waiters.indexOf(w as never);
        if (i >= 0) {
          this.waiters.splice(i, 1);
          resolve(undefined);
        }
      }, timeoutMs);
    });
  }

  stop(): void {
    if (this.alive) {
      this.send(['quit']);
      setTimeout(() => this.alive && this.proc.kill('SIGKILL'), 2000).unref();
    }
  }
}

const BASE_ENV_KEYS = ['PATH', 'HOME', 'LANG'];

export async function startAgents(
  sidecar: Sidecar,
  program: string,
  count: number,
  baseEnv: Record<string, string>,
  prefix: string,
): Promise<Agent[]> {
  const agents: Agent[] = [];
  for (let i = 0; i < count; i++) {
    const env: Record<string, string> = {};
    for (const k of BASE_ENV_KEYS) if (process.env[k]) env[k] = process.env[k] as string;
    // An agent left inside MPI (an MPICH survivor of a member-death cell spins in its Barrier) dies
    // with the runner: stop()'s SIGKILL timer does not outlive a runner that exits at once.
    const proc = spawn('/usr/bin/setpriv', ['--pdeathsig', 'KILL', '--', program], {
      env: { ...env, ...baseEnv },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const agent = new Agent(`${prefix}-${i}`, proc);
    agents.push(agent);
    const ready = await agent.waitFor((l) => l.agent === 'ready', 20_000);
    if (!ready) throw new Error(`agent ${agent.id} did not start: ${agent.stderr}`);
    await sidecar.request('POST', '/v1/workers', {
      id: agent.id,
      address: `agent://${agent.id}`,
      host: hostname(),
      pid: agent.pid,
      uid: process.getuid!(),
      gid: process.getgid!(),
    });
  }
  return agents;
}

export async function stopAgents(sidecar: Sidecar, agents: Agent[]): Promise<void> {
  for (const a of agents) {
    a.stop();
    await sidecar.request('DELETE', `/v1/workers/${encodeURIComponent(a.id)}`).catch(() => undefined);
  }
  await sleep(100);
}
