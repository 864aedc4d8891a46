import { beforeEach, describe, expect, it } from 'vitest';
import { defaultPolicy } from '../../src/policy/index.js';
import { ManualClock, ResourceManager, RmError, type RmEvent } from '../../src/rm/index.js';
import { RecordingBackend } from './fake-backend.js';

let clock: ManualClock;
let backend: RecordingBackend;
let rm: ResourceManager;
let events: RmEvent[];

const flush = () => new Promise((r) => setImmediate(r));

function setup(policy = defaultPolicy({ releaseGraceMs: 5000 })) {
  clock = new ManualClock();
  backend = new RecordingBackend(['openmpi']);
  rm = new ResourceManager({ clock, backends: [backend], policy, wiringTimeoutSeconds: 30 });
  events = [];
  rm.events.subscribe((e) => events.push(e.event));
  for (const [id, host] of [
    ['w0', 'h1'],
    ['w1', 'h1'],
    ['w2', 'h2'],
    ['w3', 'h2'],
  ] as const)
    rm.registerWorker({ id, host });
}
beforeEach(() => setup());

const jobStates = () =>
  events.filter((e) => e.kind === 'jobStateChanged').map((e) => (e.kind === 'jobStateChanged' ? e.to : ''));

async function connectAll(ns: string, n: number) {
  for (let r = 0; r < n; r++) rm.memberConnected(ns, r);
}

describe('ResourceManager: job history', () => {
  it('keeps the last historySize released jobs, the oldest going first, and never an active one', async () => {
    clock = new ManualClock();
    backend = new RecordingBackend(['openmpi']);
    rm = new ResourceManager({ clock, backends: [backend], policy: defaultPolicy(), historySize: 2 });
    rm.registerWorker({ id: 'w0', host: 'h1' });
    rm.registerWorker({ id: 'w1', host: 'h1' });
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const job = await rm.createJob({ impl: 'openmpi', members: ['w0'] });
      rm.memberConnected(job.namespace, 0);
      rm.memberFinalized(job.namespace, 0);
      await rm.released(job.id);
      ids.push(job.id);
    }
    const active = await rm.createJob({ impl: 'openmpi', members: ['w1'] });
    expect(rm.listJobs().map((j) => j.id)).toEqual([...ids.slice(2), active.id]);
  });
});

describe('ResourceManager: workers and psets', () => {
  it('registers, lists and removes workers; refuses duplicates', () => {
    expect(rm.listWorkers().map((w) => w.id)).toEqual(['w0', 'w1', 'w2', 'w3']);
    expect(() => rm.registerWorker({ id: 'w0', host: 'h9' })).toThrow(/already registered/);
    expect(rm.removeWorker('w3').state).toBe('gone');
    expect(() => rm.getWorker('w3')).toThrow(RmError);
    expect(events.at(-1)).toEqual({ kind: 'workerLeft', workerId: 'w3', reason: 'removed' });
  });

  it('marks a pset member whose worker left as gone: a job on it fails naming it until the worker is back', async () => {
    rm.definePset({ name: 'p', members: ['w0', 'w1'] });
    rm.removeWorker('w1');
    expect(rm.getPset('p').gone).toEqual(['w1']);
    expect(events.at(-1)).toMatchObject({ kind: 'psetDefined', pset: { name: 'p', gone: ['w1'] } });
    await expect(rm.createJob({ impl: 'openmpi', pset: 'p' })).rejects.toThrow(
      /pset 'p' names worker w1, which left the cluster: redefine it/,
    );
    rm.registerWorker({ id: 'w1', host: 'h1' });
    expect(rm.getPset('p').gone).toBeUndefined();
    expect((await rm.createJob({ impl: 'openmpi', pset: 'p' })).members.map((m) => m.workerId)).toEqual(['w0', 'w1']);
  });

  it('defines, redefines and deletes psets, checking members', () => {
    rm.definePset({ name: 'p', members: ['w1', 'w0'] });
    expect(rm.getPset('p').members).toEqual(['w1', 'w0']);
    expect(() => rm.definePset({ name: 'p', members: ['w0'] })).toThrow(/already exists/);
    expect(() => rm.definePset({ name: 'q', members: ['nope'] })).toThrow(
      expect.objectContaining({ kind: 'unprocessable' }),
    );
    expect(() => rm.definePset({ name: 'mpi://WORLD', members: ['w0'] })).toThrow(/reserved/);
    expect(() => rm.definePset({ name: 'q', members: ['w0', 'w0'] })).toThrow(/twice/);
    expect(() => rm.definePset({ name: 'q' })).toThrow(/exactly one/);
    rm.definePset({ name: 'sel', selector: { count: 2, placement: 'spread' } });
    expect(rm.getPset('sel').members).toEqual(['w0', 'w2']);
    rm.redefinePset({ name: 'p', members: ['w3'] });
    expect(rm.getPset('p').members).toEqual(['w3']);
    rm.deletePset('p');
    expect(() => rm.getPset('p')).toThrow(expect.objectContaining({ kind: 'not_found' }));
  });
});

describe('ResourceManager: the job state machine', () => {
  it('pending → wiring → running → completed, then released and unfrozen', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w2', 'w0', 'w1'] });
    expect(job.state).toBe('pending');
    expect(job.members.map((m) => [m.workerId, m.rank, m.host, m.localRank, m.nodeId])).toEqual([
      ['w2', 0, 'h2', 0, 0],
      ['w0', 1, 'h1', 0, 1],
      ['w1', 2, 'h1', 1, 1],
    ]);
    expect(rm.getWorker('w0')).toMatchObject({ state: 'frozen', jobId: job.id });
    expect(rm.memberEnv(job.id, 'w1').env).toEqual({ NS: job.namespace, RANK: '2' });
    rm.memberConnected(job.namespace, 0);
    expect(job.state).toBe('wiring');
    rm.memberConnected(job.namespace, 1);
    rm.memberConnected(job.namespace, 2);
    expect(job.state).toBe('running');
    expect(job.startedAt).toBeDefined();
    for (const r of [0, 1, 2]) rm.memberFinalized(job.namespace, r);
    expect(job.state).toBe('completed');
    expect(job.error).toBeUndefined();
    await rm.released(job.id);
    expect(job.releasedAt).toBeDefined();
    expect(backend.calls).toEqual([`prepare ${job.id} w2,w0,w1`, `release ${job.id}`]);
    expect(rm.getWorker('w0').state).toBe('available');
    expect(jobStates()).toEqual(['pending', 'wiring', 'running', 'completed']);
    expect(events.filter((e) => e.kind === 'workerStateChanged')).toHaveLength(6);
  });

  it('fails a job whose member is lost, tells the others, and releases when they have left', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1', 'w2'] });
    await connectAll(job.namespace, 3);
    const fence = rm.collective(job.namespace, { name: 'fence', participants: 'all', contributors: [0] });
    rm.memberLost(job.namespace, 2, 'connection lost');
    expect(job.state).toBe('failed');
    expect(job.error).toMatch(/rank 2 \(worker w2\) was lost: connection lost/);
    await expect(fence).rejects.toMatchObject({ kind: 'aborted' });
    await flush();
    expect(backend.calls).toContain(`notify ${job.id} failed`);
    expect(backend.calls).not.toContain(`release ${job.id}`);
    expect(rm.getWorker('w0').state).toBe('frozen');
    rm.memberLost(job.namespace, 0, 'aborted by event');
    rm.memberFinalized(job.namespace, 1);
    // The member that ended the job stays marked as the cause; the one lost afterwards does not.
    expect(job.members.map((m) => m.endedJob ?? false)).toEqual([false, false, true]);
    await rm.released(job.id);
    expect(backend.calls.at(-1)).toBe(`release ${job.id}`);
    expect(rm.getWorker('w0').state).toBe('available');
  });

  it('releases a failed job after the grace period even if members linger', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    await connectAll(job.namespace, 2);
    rm.memberLost(job.namespace, 1, 'killed');
    clock.advance(4999);
    await flush();
    expect(job.releasedAt).toBeUndefined();
    clock.advance(1);
    await rm.released(job.id);
    expect(rm.getWorker('w0').state).toBe('available');
  });

  it('fails a job whose member never connects at the wiring timeout', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'], wiringTimeoutSeconds: 2 });
    rm.memberConnected(job.namespace, 0);
    clock.advance(1999);
    expect(job.state).toBe('wiring');
    clock.advance(1);
    expect(job.state).toBe('failed');
    expect(job.error).toBe('wiring timeout: rank 1 did not connect within 2 s');
  });

  it('does not fire the wiring timeout once running, and enforces the job timeout', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0'], wiringTimeoutSeconds: 1, timeoutSeconds: 10 });
    rm.memberConnected(job.namespace, 0);
    clock.advance(5000);
    expect(job.state).toBe('running');
    clock.advance(5000);
    expect(job.state).toBe('failed');
    expect(job.error).toMatch(/job timeout/);
  });

  it('aborts the job when a member calls abort', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    await connectAll(job.namespace, 2);
    rm.abort(job.namespace, 1, 7, 'bad input');
    expect(job.state).toBe('aborted');
    expect(job.error).toBe('rank 1 aborted the job with status 7: bad input');
    expect(() => rm.memberConnected(job.namespace, 0)).toThrow(RmError);
  });

  it('fails the job when a member’s worker leaves the cluster', async () => {
    const job = await rm.createJob({ impl: 'openmpi', selector: { count: 2 } });
    rm.removeWorker('w1', 'retired');
    expect(job.state).toBe('failed');
    expect(job.members[1]).toMatchObject({ state: 'lost', reason: 'its worker left (retired)' });
    expect(job.error).toMatch(/worker w1/);
  });

  it('deletes a job: aborts, releases at once, forgets it', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    await connectAll(job.namespace, 2);
    const done = await rm.deleteJob(job.id);
    expect(done.state).toBe('aborted');
    expect(done.error).toBe('deleted over REST');
    expect(backend.calls).toEqual([`prepare ${job.id} w0,w1`, `notify ${job.id} aborted`, `release ${job.id}`]);
    expect(() => rm.getJob(job.id)).toThrow(expect.objectContaining({ kind: 'not_found' }));
    expect(rm.getWorker('w0').state).toBe('available');
    expect(rm.jobByNamespace(job.namespace)).toBeUndefined();
  });

  it('keeps lost and finalized members from coming back, and ignores repeats', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    rm.memberConnected(job.namespace, 0);
    rm.memberConnected(job.namespace, 0);
    rm.memberFinalized(job.namespace, 0);
    rm.memberFinalized(job.namespace, 0);
    rm.memberLost(job.namespace, 0, 'late');
    expect(job.members[0]!.state).toBe('finalized');
    expect(job.state).toBe('wiring');
    expect(() => rm.memberConnected(job.namespace, 0)).toThrow(/finalized/);
    expect(() => rm.findMember(job.namespace, 9)).toThrow(/no rank 9/);
    expect(() => rm.findMember('nope', 0)).toThrow(/no job with namespace/);
  });
});

describe('ResourceManager: admission and failed requests', () => {
  it('refuses a worker that is already in a job, and a pset in use', async () => {
    rm.definePset({ name: 'p', members: ['w0', 'w1'] });
    const job = await rm.createJob({ impl: 'openmpi', pset: 'p' });
    expect(job.pset).toBe('p');
    expect(rm.getPset('p').jobId).toBe(job.id);
    await expect(rm.createJob({ impl: 'openmpi', members: ['w1', 'w2'] })).rejects.toMatchObject({
      kind: 'conflict',
      message: `worker 'w1' is already in job ${job.id}`,
    });
    await expect(rm.createJob({ impl: 'openmpi', pset: 'p' })).rejects.toMatchObject({ kind: 'conflict' });
    expect(() => rm.deletePset('p')).toThrow(/used by active job/);
    expect(() => rm.redefinePset({ name: 'p', members: ['w3'] })).toThrow(/used by active job/);
    expect(rm.psetProcs('p')).toEqual([
      { namespace: job.namespace, rank: 0 },
      { namespace: job.namespace, rank: 1 },
    ]);
    // A selector only sees the free workers.
    const other = await rm.createJob({ impl: 'openmpi', selector: { count: 2 } });
    expect(other.members.map((m) => m.workerId)).toEqual(['w2', 'w3']);
    // Every worker is in a job: the request could start later (it may wait), unlike one that never can.
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 1 } })).rejects.toMatchObject({
      kind: 'conflict',
      message: expect.stringMatching(/in jobs now/),
    });
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 9 } })).rejects.toMatchObject({
      kind: 'unprocessable',
    });
  });

  it('rejects malformed and unservable requests', async () => {
    await expect(rm.createJob({ impl: 'openmpi' })).rejects.toMatchObject({ kind: 'bad_request' });
    await expect(rm.createJob({ impl: 'openmpi', members: ['w0'], pset: 'p' })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    await expect(rm.createJob({ impl: 'mpich', members: ['w0'] })).rejects.toMatchObject({
      kind: 'unprocessable',
      message: expect.stringMatching(/cannot serve mpich/),
    });
    await expect(rm.createJob({ impl: 'openmpi', members: ['zz'] })).rejects.toMatchObject({ kind: 'unprocessable' });
    await expect(rm.createJob({ impl: 'openmpi', pset: 'nope' })).rejects.toMatchObject({ kind: 'unprocessable' });
    await expect(rm.createJob({ impl: 'openmpi', members: ['w0', 'w0'] })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    await expect(rm.createJob({ impl: 'openmpi', members: ['w0'], wiringTimeoutSeconds: -1 })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    expect(rm.listJobs()).toHaveLength(0);
    expect(events.filter((e) => e.kind !== 'workerJoined')).toHaveLength(0);
  });

  it('changes nothing when the backend refuses the job', async () => {
    backend.failPrepare = new Error('nspace registration failed');
    await expect(rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] })).rejects.toMatchObject({
      kind: 'unavailable',
      message: expect.stringMatching(/nspace registration failed/),
    });
    expect(rm.listJobs()).toHaveLength(0);
    expect(rm.getWorker('w0').state).toBe('available');
  });

  it('does not hand the same worker to two concurrent requests', async () => {
    let go!: () => void;
    backend.hold = new Promise((r) => (go = r));
    const a = rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    await expect(rm.createJob({ impl: 'openmpi', members: ['w1'] })).rejects.toMatchObject({ kind: 'conflict' });
    go();
    await a;
  });

  it('caps the number of active jobs, counting those still being created', async () => {
    setup(defaultPolicy({ maxActiveJobs: 1 }));
    let go!: () => void;
    backend.hold = new Promise((r) => (go = r));
    const first = rm.createJob({ impl: 'openmpi', members: ['w0'] });
    await expect(rm.createJob({ impl: 'openmpi', members: ['w2'] })).rejects.toMatchObject({ kind: 'conflict' });
    go();
    await first;
    await expect(rm.createJob({ impl: 'openmpi', members: ['w1'] })).rejects.toMatchObject({
      kind: 'conflict',
      message: expect.stringMatching(/at most 1 job/),
    });
  });

  it('on shutdown refuses new jobs and aborts the active ones', async () => {
    const job = await rm.createJob({ impl: 'openmpi', members: ['w0'] });
    rm.memberConnected(job.namespace, 0);
    await rm.shutdown('SIGTERM');
    expect(job.state).toBe('aborted');
    expect(job.error).toBe('SIGTERM');
    expect(backend.calls).toEqual([`prepare ${job.id} w0`, `notify ${job.id} aborted`, `release ${job.id}`, 'close']);
    await expect(rm.createJob({ impl: 'openmpi', members: ['w1'] })).rejects.toMatchObject({ kind: 'unavailable' });
  });
});

describe('ResourceManager: protocol services', () => {
  it('gives each job its own key-value space and collectives', async () => {
    const a = await rm.createJob({ impl: 'openmpi', members: ['w0', 'w1'] });
    const b = await rm.createJob({ impl: 'openmpi', members: ['w2'] });
    rm.kv(a.namespace).put(0, 'k', 'a');
    expect(rm.kv(b.namespace).get('k')).toBeUndefined();
    await rm.collective(b.namespace, { name: 'fence', participants: 'all', contributors: [0] });
    const f = rm.collective(a.namespace, { name: 'fence', participants: 'all', contributors: [1] });
    await rm.collective(a.namespace, { name: 'fence', participants: 'all', contributors: [0] });
    await f;
    expect(rm.contextIds.allocate()).toBe(0xffffffff);
    expect(rm.contextIds.allocate()).toBe(0xfffffffe);
  });
});
