// The real resource manager with the PMI backend installed, as the sidecar runs them, plus
// helpers to create MPICH jobs over registered workers and wait for their ends.
import type { TraceEvent } from '../../../src/pmi/index.js';
import { defaultPolicy } from '../../../src/policy/index.js';
import { type Impl, type Job, type JobState, ResourceManager, type RmOptions } from '../../../src/rm/index.js';
import { PmiBackend, type PmiBackendOptions } from '../../../src/service/pmi-backend.js';
import { WireClient } from './wire-client.js';

export interface FixtureJob {
  job: Readonly<Job>;
  workers: string[];
  envs: Record<string, string>[];
  /** Each member's PMI_ID credential. */
  pmiIds: string[];
}

export class PmiRmFixture {
  private nextWorker = 0;

  private constructor(
    readonly rm: ResourceManager,
    readonly backend: PmiBackend,
    readonly trace: TraceEvent[],
    /** What the backend and its connections survived (a bug in a handler or the core). */
    readonly errors: { what: string; err: unknown }[],
  ) {}

  static async start(
    opts: { traceOn?: boolean; extraEnv?: Record<string, string>; releaseGraceMs?: number } & Pick<
      PmiBackendOptions,
      'limits' | 'bindTimeoutMs' | 'maxUnbound'
    > &
      Pick<RmOptions, 'collectiveTimeoutMs' | 'onCollective'> = {},
  ): Promise<PmiRmFixture> {
    const rm = new ResourceManager({
      policy: defaultPolicy({ releaseGraceMs: opts.releaseGraceMs ?? 2000 }),
      wiringTimeoutSeconds: 60,
      ...(opts.collectiveTimeoutMs !== undefined ? { collectiveTimeoutMs: opts.collectiveTimeoutMs } : {}),
      ...(opts.onCollective ? { onCollective: opts.onCollective } : {}),
    });
    const trace: TraceEvent[] = [];
    const errors: { what: string; err: unknown }[] = [];
    const backend = await PmiBackend.start({
      rm,
      onError: (what, err) => errors.push({ what, err }),
      ...(opts.extraEnv ? { extraEnv: opts.extraEnv } : {}),
      ...(opts.limits ? { limits: opts.limits } : {}),
      ...(opts.bindTimeoutMs !== undefined ? { bindTimeoutMs: opts.bindTimeoutMs } : {}),
      ...(opts.maxUnbound !== undefined ? { maxUnbound: opts.maxUnbound } : {}),
      ...(opts.traceOn ? { trace: (e: TraceEvent) => trace.push(e) } : {}),
    });
    rm.addBackend(backend);
    return new PmiRmFixture(rm, backend, trace, errors);
  }

  get port(): number {
    return this.backend.listener.port;
  }

  /**
   * Registers `n` workers on `hosts` (default all on this host), running as `uid` (default: not
   * said, so the sidecar's own), and creates a job over them.
   */
  async job(
    n: number,
    opts: { hosts?: string[]; impl?: Impl; wiringTimeoutSeconds?: number; uid?: number } = {},
  ): Promise<FixtureJob> {
    const workers: string[] = [];
    for (let i = 0; i < n; i++) {
      const id = `w${++this.nextWorker}`;
      const user = opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : {};
      this.rm.registerWorker({ id, host: opts.hosts?.[i] ?? 'localhost', ...user });
      workers.push(id);
    }
    const job = await this.rm.createJob({
      impl: opts.impl ?? 'mpich',
      members: workers,
      ...(opts.wiringTimeoutSeconds !== undefined ? { wiringTimeoutSeconds: opts.wiringTimeoutSeconds } : {}),
    });
    const envs = workers.map((w) => this.rm.memberEnv(job.id, w).env);
    return { job, workers, envs, pmiIds: envs.map((e) => e.PMI_ID!) };
  }

  /** A PMI-1 connection bound as member `rank` of `j` (the initack's four reply lines read). */
  async bound(j: FixtureJob, rank: number): Promise<WireClient> {
    const c = await WireClient.connect(this.port);
    c.send(`cmd=initack pmiid=${j.pmiIds[rank]}\n`);
    for (let i = 0; i < 4; i++) await c.line();
    return c;
  }

  state(jobId: string): JobState {
    return this.rm.getJob(jobId).state;
  }

  /** Resolves when the job reaches one of `states`; rejects after `ms`. */
  waitFor(jobId: string, states: JobState[], ms = 20_000): Promise<Readonly<Job>> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const j = this.rm.getJob(jobId);
        if (states.includes(j.state)) {
          off();
          clearTimeout(t);
          resolve(j);
        }
      };
      const off = this.rm.events.subscribe(check);
      const t = setTimeout(() => {
        off();
        reject(new Error(`job ${jobId} is ${this.rm.getJob(jobId).state}, not ${states.join('|')}, after ${ms} ms`));
      }, ms);
      check();
    });
  }

  /** Resolves once the job has been released by the core. */
  async released(jobId: string): Promise<void> {
    await this.rm.released(jobId);
  }

  async stop(): Promise<void> {
    await this.rm.shutdown();
  }

  transcript(): string {
    return this.trace.map((e) => `${e.conn} ${e.dir} ${e.text.trimEnd()}`).join('\n');
  }
}
