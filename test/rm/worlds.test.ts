// In-process seats for MPICH / Intel MPI in the core: each worker process a world of its own, a
// job's members trading the ports of their merge tree through join, and the failures the
// sidecar must report itself (MPICH tells its processes of none).
import { beforeEach, describe, expect, it } from 'vitest';
import { defaultPolicy } from '../../src/policy/index.js';
import {
  acceptSteps,
  type Impl,
  ManualClock,
  ResourceManager,
  type Worker,
  type WorldBackend,
} from '../../src/rm/index.js';
import { RecordingBackend } from './fake-backend.js';

class FakeWorlds implements WorldBackend {
  readonly impls: readonly Impl[] = ['mpich', 'intelmpi'];
  readonly opened: string[] = [];
  readonly closed: string[] = [];
  open(namespace: string, impl: Impl, worker: Readonly<Worker>): Record<string, string> {
    this.opened.push(`${namespace} ${impl} ${worker.id}`);
    return { PMI_ID: `id-${namespace}` };
  }
  close(namespace: string): void {
    this.closed.push(namespace);
  }
}

let clock: ManualClock;
let worlds: FakeWorlds;
let fork: RecordingBackend;
let rm: ResourceManager;

beforeEach(() => {
  clock = new ManualClock();
  worlds = new FakeWorlds();
  fork = new RecordingBackend(['openmpi', 'mpich']);
  rm = new ResourceManager({ clock, backends: [fork], policy: defaultPolicy({ releaseGraceMs: 5000 }) });
  rm.installWorlds(worlds);
});

/** Registers a worker whose process initialised MPICH as a world of its own. */
async function readyWorld(id: string, impl: Impl = 'mpich'): Promise<string> {
  rm.registerWorker({ id, host: 'h1' });
  const { seat, env } = await rm.joinPool(id, { pid: 7 }, undefined, impl);
  expect(env.PMI_ID).toBe(`id-${seat.namespace}`);
  expect(rm.worldRefusal(seat.namespace)).toBeUndefined();
  rm.worldConnected(seat.namespace);
  return seat.namespace;
}

/** The ports rank `rank` of `size` brings: one per merge step it accepts at. */
function portsOf(rank: number, size: number): Record<string, string> {
  return Object.fromEntries(acceptSteps(rank, size).map((s) => [String(s), `port-${rank}-${s}`]));
}

describe('the merge tree', () => {
  it('has every rank but the first accept or connect once per round, one port per accepting step', () => {
    expect([0, 1, 2, 3, 4].map((r) => acceptSteps(r, 5))).toEqual([[1, 2, 4], [], [1], [], []]);
    expect(acceptSteps(0, 1)).toEqual([]);
    expect(acceptSteps(6, 8)).toEqual([1]);
  });
});

describe('worlds', () => {
  it('each worker process is a world of its own, ready once its PMI connection is bound, never reused', async () => {
    const a = await readyWorld('a');
    const b = await readyWorld('b', 'intelmpi');
    expect(a).not.toBe(b);
    expect(rm.getWorker('a').pool).toMatchObject({ impl: 'mpich', state: 'ready', rank: 0, namespace: a });
    expect(() => rm.worldConnected(a)).toThrow(/ready/);
    expect(rm.worldRefusal(a)).toMatch(/ready already/);
    rm.worldGone(a, 'its worker process ended');
    expect(rm.getWorker('a').pool).toMatchObject({ state: 'retired', reason: 'its worker process ended' });
    expect(worlds.closed).toEqual([a]);
    expect(() => rm.joinPool('a', { pid: 8 }, undefined, 'mpich')).toThrow(/left the pool/);
  });

  it('a job over worlds runs in-process: members trade their ports, and the job runs once all joined', async () => {
    for (const id of ['a', 'b', 'c']) await readyWorld(id);
    const job = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['c', 'a', 'b'] });
    expect([job.mode, job.modeReason]).toEqual(['inprocess', undefined]);
    expect(fork.calls).toEqual([]);
    const first = rm.joinJob(job.id, 'c', 1000, portsOf(0, 3));
    // A member must bring exactly the ports of its accepting steps.
    await expect(rm.joinJob(job.id, 'a', 1000, { 1: 'p' })).rejects.toThrow(
      /merge steps \[\] and must bring one port for each/,
    );
    await expect(rm.joinJob(job.id, 'c', 1000, { 1: 'other', 2: 'x' })).rejects.toThrow(/other ports/);
    const second = rm.joinJob(job.id, 'a', 1000, portsOf(1, 3));
    expect(rm.getJob(job.id).state).toBe('wiring');
    const third = await rm.joinJob(job.id, 'b', 1000, portsOf(2, 3));
    expect(third.ready).toBe(true);
    expect(third.ports).toEqual([portsOf(0, 3), {}, portsOf(2, 3)]);
    expect((await first).ports).toEqual(third.ports);
    expect((await second).ready).toBe(true);
    expect(rm.getJob(job.id).state).toBe('running');
    for (const id of ['a', 'b', 'c']) rm.leaveJob(job.id, id, true, '');
    expect(rm.getJob(job.id).state).toBe('completed');
    await rm.released(job.id);
    expect(rm.getWorker('a').state).toBe('available');
  });

  it('falls back to fork mode, with the reason, when a member has no world of that library', async () => {
    await readyWorld('a');
    await readyWorld('i', 'intelmpi');
    rm.registerWorker({ id: 'plain', host: 'h1' });
    const j1 = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['a', 'plain'] });
    expect([j1.mode, j1.modeReason]).toEqual(['fork', expect.stringMatching(/'plain' has no mpich world/)]);
    await rm.deleteJob(j1.id);
    const j2 = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['a', 'i'] });
    expect([j2.mode, j2.modeReason]).toEqual(['fork', expect.stringMatching(/'i' runs intelmpi, not mpich/)]);
    await rm.deleteJob(j2.id);
    const j3 = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a'] });
    expect([j3.mode, j3.modeReason]).toEqual(['fork', expect.stringMatching(/no in-process pool/)]);
  });

  it('a world whose connection closes mid-job fails the job at once, naming it (MPICH reports no failed process)', async () => {
    await readyWorld('a');
    const b = await readyWorld('b');
    const job = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['a', 'b'] });
    const joinA = rm.joinJob(job.id, 'a', 10_000, portsOf(0, 2));
    await rm.joinJob(job.id, 'b', 10_000, portsOf(1, 2));
    await joinA;
    rm.worldGone(b, 'its worker process ended (its PMI connection closed: reset)');
    const failed = rm.getJob(job.id);
    expect(failed.state).toBe('failed');
    expect(failed.error).toMatch(/rank 1 \(worker b\) was lost: its worker process ended/);
    // The survivor hears of it by asking (its watcher), leaves, and serves the next job.
    rm.leaveJob(job.id, 'a', false, 'the job failed');
    await rm.released(job.id);
    expect(rm.getWorker('a').state).toBe('available');
    expect(rm.getWorker('b').pool!.state).toBe('retired');
  });

  it("MPI_Abort from a world aborts its worker's job", async () => {
    const a = await readyWorld('a');
    await readyWorld('b');
    const job = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['a', 'b'] });
    rm.worldAbort(a, 3, 'giving up');
    expect(rm.getJob(job.id)).toMatchObject({ state: 'aborted' });
    expect(rm.getJob(job.id).error).toMatch(/giving up/);
  });
});
