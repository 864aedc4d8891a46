// The in-process pool in the core: ranks handed out as workers register, epochs, the fallback to
// fork mode, and the life of an in-process job (join barrier, group, leave, a member's death).
import { beforeEach, describe, expect, it } from 'vitest';
import { defaultPolicy } from '../../src/policy/index.js';
import {
  type CohortOptions,
  type Job,
  ManualClock,
  type PoolBackend,
  type PoolEpochSpec,
  type PoolUser,
  ResourceManager,
  type RmEvent,
} from '../../src/rm/index.js';
import { RecordingBackend } from './fake-backend.js';

class FakePool implements PoolBackend {
  readonly uid = 1000;
  readonly gid = 1000;
  readonly opened: PoolEpochSpec[] = [];
  readonly closed: string[] = [];
  readonly notified: string[] = [];
  /** Clients registered again as another user: "namespace:rank uid/gid". */
  readonly users: string[] = [];
  private readonly registered = new Map<string, PoolUser>();
  async open(spec: PoolEpochSpec): Promise<void> {
    this.opened.push(spec);
    for (const [rank, u] of spec.users) this.registered.set(`${spec.namespace}:${rank}`, u);
  }
  async setUser(namespace: string, rank: number, user: PoolUser): Promise<void> {
    const now = this.registered.get(`${namespace}:${rank}`) ?? { uid: this.uid, gid: this.gid };
    if (user.uid === now.uid && user.gid === now.gid) return;
    this.registered.set(`${namespace}:${rank}`, user);
    this.users.push(`${namespace}:${rank} ${user.uid}/${user.gid}`);
  }
  rankEnv(namespace: string, rank: number): Record<string, string> {
    return { PMIX_NAMESPACE: namespace, PMIX_RANK: String(rank) };
  }
  async notifyJobEnded(job: Readonly<Job>): Promise<void> {
    this.notified.push(`${job.id} ${job.state}`);
  }
  async close(namespace: string): Promise<void> {
    this.closed.push(namespace);
  }
}

let clock: ManualClock;
let pool: FakePool;
let fork: RecordingBackend;
let rm: ResourceManager;
let events: RmEvent[];
const flush = () => new Promise((r) => setImmediate(r));

async function setup(size = 8, cohort?: CohortOptions) {
  clock = new ManualClock();
  pool = new FakePool();
  fork = new RecordingBackend(['openmpi', 'mpich']);
  rm = new ResourceManager({
    clock,
    backends: [fork],
    policy: defaultPolicy({ releaseGraceMs: 5000 }),
    pool: { size, backend: pool, ...(cohort ? { cohort } : {}) },
  });
  events = [];
  rm.events.subscribe((e) => events.push(e.event));
  if (!cohort) await rm.pool!.start();
  else void rm.pool!.start();
}

/** Registers a worker and brings its pool rank to ready, as its worker plugin would. */
async function readyWorker(id: string): Promise<number> {
  rm.registerWorker({ id, host: 'h1', uid: 1000, gid: 1000 });
  const { seat } = await rm.joinPool(id, { pid: 42 });
  rm.poolClientConnected(seat.namespace, seat.rank);
  return seat.rank;
}

beforeEach(() => setup());

describe('the pool: ranks and epochs', () => {
  it('hands each worker its rank as it registers, never reuses one, and opens a new epoch before they run out', async () => {
    await setup(4);
    const seats = ['a', 'b', 'c'].map((id) => rm.registerWorker({ id, host: 'h' }).pool!);
    expect(seats.map((s) => [s.epoch, s.rank, s.state])).toEqual([
      [0, 0, 'assigned'],
      [0, 1, 'assigned'],
      [0, 2, 'assigned'],
    ]);
    // One rank left (a tenth of 4, at least one): the next epoch is already being opened.
    expect(pool.opened.map((e) => e.epoch)).toEqual([0, 1]);
    rm.removeWorker('b');
    expect(rm.registerWorker({ id: 'd', host: 'h' }).pool!.rank).toBe(3);
    await flush();
    const e = rm.registerWorker({ id: 'e', host: 'h' }).pool!;
    expect([e.epoch, e.rank]).toEqual([1, 0]);
    expect(e.namespace).not.toBe(seats[0]!.namespace);
  });

  it('a worker registered while its epoch opens waits for its rank and is told by an event', async () => {
    clock = new ManualClock();
    pool = new FakePool();
    let open!: () => void;
    pool.open = (spec) => {
      pool.opened.push(spec);
      return new Promise((r) => (open = r));
    };
    rm = new ResourceManager({ clock, policy: defaultPolicy(), pool: { size: 4, backend: pool } });
    events = [];
    rm.events.subscribe((ev) => events.push(ev.event));
    expect(rm.registerWorker({ id: 'a', host: 'h' }).pool).toBeUndefined();
    const joining = rm.joinPool('a', {});
    open();
    const { seat, env } = await joining;
    expect([seat.rank, seat.state]).toEqual([0, 'joining']);
    expect(env.PMIX_RANK).toBe('0');
    expect(events.some((ev) => ev.kind === 'workerPoolChanged' && ev.pool.state === 'assigned')).toBe(true);
  });

  it('joining records what the worker process says of itself; a worker of another user has its client registered as that user', async () => {
    rm.registerWorker({ id: 'a', host: 'sched' });
    const { worker } = await rm.joinPool('a', { host: 'node7', pid: 99, uid: 1000, gid: 1000 });
    expect([worker.host, worker.pid, worker.uid]).toEqual(['node7', 99, 1000]);
    expect(pool.users).toEqual([]);
    const b = rm.registerWorker({ id: 'b', host: 'h' }).pool!;
    const { seat } = await rm.joinPool('b', { uid: 65534, gid: 65534 });
    expect(seat.state).toBe('joining');
    expect(pool.users).toEqual([`${b.namespace}:${b.rank} 65534/65534`]);
  });

  it('a worker whose client cannot be registered as its user is retired, saying why', async () => {
    pool.setUser = () => Promise.reject(new Error('libpmix said no'));
    rm.registerWorker({ id: 'b', host: 'h' });
    await expect(rm.joinPool('b', { uid: 0, gid: 0 })).rejects.toThrow(
      /could not be registered as uid 0\/gid 0: libpmix said no/,
    );
    expect(rm.getWorker('b').pool!.state).toBe('retired');
    await expect(rm.joinPool('b', {})).rejects.toThrow(/left the pool/);
  });

  it('only a worker that is joining may connect as its rank', async () => {
    const a = rm.registerWorker({ id: 'a', host: 'h' }).pool!;
    expect(rm.poolRefusal(a.namespace, a.rank)).toMatch(/has not asked to join/);
    expect(rm.poolRefusal(a.namespace, 7)).toMatch(/belongs to no registered worker/);
    await rm.joinPool('a', {});
    expect(rm.poolRefusal(a.namespace, a.rank)).toBeUndefined();
    rm.poolClientConnected(a.namespace, a.rank);
    expect(rm.poolRefusal(a.namespace, a.rank)).toMatch(/connected already/);
    rm.poolClientGone(a.namespace, a.rank, 'its worker process died');
    expect(rm.poolRefusal(a.namespace, a.rank)).toMatch(/was retired: its worker process died/);
  });

  it('a rank whose connection drops is retired; its worker no longer qualifies', async () => {
    const r = await readyWorker('a');
    const ns = rm.getWorker('a').pool!.namespace;
    rm.poolClientGone(ns, r, 'its worker process died');
    expect(rm.getWorker('a').pool).toMatchObject({ state: 'retired', reason: 'its worker process died' });
  });
});

describe('cohorts: the workers that join the first epoch together', () => {
  const cohort = { settleMs: 1000, maxWaitMs: 10_000 };

  it('are declared on one node per host once nobody arrived for the quiet time; later joiners are alone', async () => {
    await setup(16, cohort);
    for (const [id, host] of [
      ['a', 'h1'],
      ['b', 'h1'],
      ['c', 'h1'],
      ['d', 'h2'],
    ])
      rm.registerWorker({ id: id!, host: host!, uid: 1000, gid: 1000 });
    expect(pool.opened).toEqual([]);
    const joins = ['a', 'b', 'c', 'd'].map((id) => rm.joinPool(id, { pid: 1 }));
    clock.advance(999);
    await flush();
    expect(pool.opened).toEqual([]);
    clock.advance(1);
    await flush();
    expect(pool.opened.map((e) => [e.epoch, e.cohorts])).toEqual([[0, [{ host: 'h1', ranks: [0, 1, 2] }]]]);
    expect([...pool.opened[0]!.users.keys()]).toEqual([0, 1, 2, 3]);
    const seats = (await Promise.all(joins)).map((j) => j.seat);
    expect(seats.map((s) => [s.rank, s.state, s.localPeers])).toEqual([
      [0, 'joining', [0, 1, 2]],
      [1, 'joining', [0, 1, 2]],
      [2, 'joining', [0, 1, 2]],
      [3, 'joining', undefined],
    ]);
    // A later joiner is answered at once, alone on its own node.
    rm.registerWorker({ id: 'e', host: 'h1', uid: 1000, gid: 1000 });
    const e = await rm.joinPool('e', {});
    expect([e.seat.rank, e.seat.state, e.seat.localPeers]).toEqual([4, 'joining', undefined]);
    expect(pool.opened).toHaveLength(1);
    // GET /v1/workers and the events show the cohort.
    expect(
      events.some((ev) => ev.kind === 'workerPoolChanged' && ev.workerId === 'a' && ev.pool.localPeers?.length === 3),
    ).toBe(true);
  });

  it('a worker that never asks holds the epoch until the deadline; one that leaves is not declared and holds nothing', async () => {
    await setup(16, cohort);
    for (const id of ['a', 'b', 'c', 'd']) rm.registerWorker({ id, host: 'h1' });
    const joins = ['a', 'b'].map((id) => rm.joinPool(id, {}));
    clock.advance(5000);
    await flush();
    expect(pool.opened).toEqual([]); // c and d are registered and may still ask
    rm.removeWorker('c', 'its process died');
    clock.advance(5000 - 1);
    await flush();
    expect(pool.opened).toEqual([]);
    clock.advance(1); // the deadline: d never asked
    await flush();
    expect(pool.opened[0]!.cohorts).toEqual([{ host: 'h1', ranks: [0, 1] }]);
    expect((await Promise.all(joins)).map((j) => j.seat.localPeers)).toEqual([
      [0, 1],
      [0, 1],
    ]);
    const d = await rm.joinPool('d', {});
    expect(d.seat.localPeers).toBeUndefined();
  });

  it('a worker that leaves while the others wait closes the epoch after the quiet time', async () => {
    await setup(16, cohort);
    for (const id of ['a', 'b', 'c']) rm.registerWorker({ id, host: 'h1' });
    const joins = ['a', 'b'].map((id) => rm.joinPool(id, {}));
    clock.advance(3000);
    rm.leavePool('c', 'its MPI library is not Open MPI');
    clock.advance(1000);
    await flush();
    expect(pool.opened[0]!.cohorts).toEqual([{ host: 'h1', ranks: [0, 1] }]);
    await Promise.all(joins);
  });

  it("one cohort per host and user; each client is registered as its worker's user", async () => {
    await setup(16, cohort);
    const users: [string, number][] = [
      ['a', 1000],
      ['b', 2000],
      ['c', 1000],
      ['d', 2000],
      ['e', 3000],
    ];
    for (const [id, uid] of users) rm.registerWorker({ id, host: 'h1', uid, gid: uid });
    const joins = users.map(([id]) => rm.joinPool(id, {}));
    clock.advance(1000);
    await flush();
    const spec = pool.opened[0]!;
    expect(spec.cohorts).toEqual([
      { host: 'h1', ranks: [0, 2] },
      { host: 'h1', ranks: [1, 3] },
    ]);
    expect(Object.fromEntries([...spec.users].map(([r, u]) => [r, u.uid]))).toEqual({
      0: 1000,
      1: 2000,
      2: 1000,
      3: 2000,
      4: 3000,
    });
    await Promise.all(joins);
    expect(pool.users).toEqual([]); // registered as their users up front: nothing to register again
  });

  it("workers beyond the forming epoch's ranks wait for the next epoch", async () => {
    await setup(2, cohort);
    for (const id of ['a', 'b', 'c']) rm.registerWorker({ id, host: 'h1' });
    expect(rm.getWorker('c').pool).toBeUndefined();
    const joins = ['a', 'b'].map((id) => rm.joinPool(id, {}));
    clock.advance(1000);
    await flush();
    await flush();
    expect(pool.opened.map((e) => [e.epoch, e.cohorts.length]).slice(0, 2)).toEqual([
      [0, 1],
      [1, 0],
    ]);
    await Promise.all(joins);
    expect(rm.getWorker('c').pool).toMatchObject({ epoch: 1, rank: 0 });
    expect((await rm.joinPool('c', {})).seat).toMatchObject({ epoch: 1, rank: 0, state: 'joining' });
  });

  it('a worker that asked while the forming epoch was full is answered once the next epoch opens', async () => {
    await setup(2, cohort);
    for (const id of ['a', 'b', 'c']) rm.registerWorker({ id, host: 'h1' });
    const joins = ['a', 'b', 'c'].map((id) => rm.joinPool(id, {}));
    clock.advance(1000);
    for (let i = 0; i < 5; i++) await flush();
    const seats = (await Promise.all(joins)).map((j) => [j.seat.epoch, j.seat.rank, j.seat.localPeers]);
    expect(seats).toEqual([
      [0, 0, [0, 1]],
      [0, 1, [0, 1]],
      [1, 0, undefined],
    ]);
  });

  /** Workers `ids` of host h1 form the forming epoch's cohort and connect; their seats. */
  async function connectedCohort(ids: string[]) {
    for (const id of ids) rm.registerWorker({ id, host: 'h1' });
    const joins = ids.map((id) => rm.joinPool(id, {}));
    clock.advance(cohort.settleMs);
    await flush();
    const seats = (await Promise.all(joins)).map((j) => j.seat);
    for (const s of seats) rm.poolClientConnected(s.namespace, s.rank);
    return seats;
  }

  it('once every worker of the epoch is gone (a restart of them all), the next ones form a new cohort epoch', async () => {
    await setup(16, cohort);
    const seats = await connectedCohort(['a', 'b']);
    // One leaves: a newcomer now sits alone in the epoch, beside the one still there.
    rm.removeWorker('b', 'its process died');
    rm.poolClientGone(seats[1]!.namespace, seats[1]!.rank, 'its process died');
    rm.registerWorker({ id: 'c', host: 'h1' });
    const c = (await rm.joinPool('c', {})).seat;
    expect([c.epoch, c.rank, c.localPeers]).toEqual([0, 2, undefined]);
    // All gone: the workers that come next gather into a cohort of a new epoch.
    for (const [id, s] of [
      ['a', seats[0]!],
      ['c', rm.getWorker('c').pool!],
    ] as const) {
      rm.removeWorker(id, 'restarted');
      rm.poolClientGone(s.namespace, s.rank, 'restarted');
    }
    for (const id of ['d', 'e']) rm.registerWorker({ id, host: 'h1' });
    await flush();
    expect(pool.closed).toEqual([seats[0]!.namespace]); // the old epoch goes
    const again = ['d', 'e'].map((id) => rm.joinPool(id, {}));
    clock.advance(999);
    await flush();
    expect(pool.opened).toHaveLength(1);
    clock.advance(1);
    await flush();
    expect(pool.opened.map((e) => [e.epoch, e.cohorts])).toEqual([
      [0, [{ host: 'h1', ranks: [0, 1] }]],
      [1, [{ host: 'h1', ranks: [0, 1] }]],
    ]);
    expect((await Promise.all(again)).map((j) => [j.seat.epoch, j.seat.localPeers])).toEqual([
      [1, [0, 1]],
      [1, [0, 1]],
    ]);
  });

  it('the workers of a restart that registered before the old ones were gone still form a new cohort when they ask', async () => {
    await setup(16, cohort);
    const old = await connectedCohort(['a', 'b']);
    // The new workers register while the old ones are still there: seats of the old epoch.
    for (const id of ['c', 'd']) rm.registerWorker({ id, host: 'h1' });
    expect(['c', 'd'].map((id) => rm.getWorker(id).pool!.epoch)).toEqual([0, 0]);
    for (const [id, s] of [
      ['a', old[0]!],
      ['b', old[1]!],
    ] as const) {
      rm.removeWorker(id, 'restarted');
      rm.poolClientGone(s.namespace, s.rank, 'restarted');
    }
    // They ask once the old ones are gone: both move to a new epoch, which gathers them.
    const again = ['c', 'd'].map((id) => rm.joinPool(id, {}));
    expect(['c', 'd'].map((id) => rm.getWorker(id).pool!.epoch)).toEqual([1, 1]);
    clock.advance(1000);
    await flush();
    expect(pool.opened.map((e) => [e.epoch, e.cohorts])).toEqual([
      [0, [{ host: 'h1', ranks: [0, 1] }]],
      [1, [{ host: 'h1', ranks: [0, 1] }]],
    ]);
    expect((await Promise.all(again)).map((j) => [j.seat.epoch, j.seat.rank, j.seat.localPeers])).toEqual([
      [1, 0, [0, 1]],
      [1, 1, [0, 1]],
    ]);
    expect(pool.closed).toEqual([old[0]!.namespace]);
    // A lone newcomer beside workers in use stays in their epoch, alone on its node.
    for (const j of await Promise.all(again)) rm.poolClientConnected(j.seat.namespace, j.seat.rank);
    rm.registerWorker({ id: 'e', host: 'h1' });
    const e = (await rm.joinPool('e', {})).seat;
    expect([e.epoch, e.localPeers]).toEqual([1, undefined]);
  });

  it('a join waits at most waitMs for the epoch to be registered', async () => {
    await setup(16, cohort);
    rm.registerWorker({ id: 'a', host: 'h1' });
    rm.registerWorker({ id: 'b', host: 'h1' });
    const join = rm.joinPool('a', {}, 4000);
    clock.advance(4000);
    await expect(join).rejects.toThrow(/was not registered within 4000 ms/);
  });

  it('a join waiting for its cohort ends when the sidecar stops, and later ones are refused', async () => {
    await setup(16, cohort);
    rm.registerWorker({ id: 'a', host: 'h1' });
    const join = rm.joinPool('a', {}, 60_000);
    await flush();
    await rm.shutdown('the sidecar received SIGTERM');
    await expect(join).rejects.toMatchObject({ kind: 'unavailable', message: /the sidecar received SIGTERM/ });
    rm.registerWorker({ id: 'b', host: 'h1' });
    await expect(rm.joinPool('b', {})).rejects.toMatchObject({ kind: 'unavailable' });
  });
});

describe('in-process jobs', () => {
  it('run as a group of pool ranks: join barrier, group construct, leave, release', async () => {
    const ranks = [await readyWorker('a'), await readyWorker('b'), await readyWorker('c')];
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['c', 'a'] });
    expect(job.mode).toBe('inprocess');
    expect(job.namespace).toBe(rm.getWorker('a').pool!.namespace);
    expect(job.members.map((m) => m.poolRank)).toEqual([ranks[2], ranks[0]]);
    expect(job.tag).toBe(`dask-pmix:${job.id}`);
    expect(fork.calls).toEqual([]);

    const first = rm.joinJob(job.id, 'c', 1000);
    expect(rm.getJob(job.id).state).toBe('wiring');
    const second = await rm.joinJob(job.id, 'a', 1000);
    expect(second.ready).toBe(true);
    expect((await first).ready).toBe(true);
    // The communicator of another tag (one the job builds itself) changes nothing.
    rm.poolGroupConstructed(job.namespace, 'something-else', [ranks[0]!, ranks[2]!]);
    expect(rm.getJob(job.id).state).toBe('wiring');
    rm.poolGroupConstructed(job.namespace, `${job.tag}-[[57598,0],0].2`, [ranks[0]!, ranks[2]!]);
    expect(rm.getJob(job.id).state).toBe('running');
    rm.leaveJob(job.id, 'a', true, '');
    rm.leaveJob(job.id, 'c', true, '');
    expect(rm.getJob(job.id).state).toBe('completed');
    await rm.released(job.id);
    expect(rm.getWorker('a').state).toBe('available');
    // The same workers serve the next job at once.
    expect((await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b', 'c'] })).mode).toBe(
      'inprocess',
    );
  });

  it('a job whose members duplicate a kept communicator runs when the scheduler says so: no group construct, its own timeout holds', async () => {
    await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({
      impl: 'openmpi',
      mode: 'inprocess',
      members: ['a', 'b'],
      wiringTimeoutSeconds: 5,
      timeoutSeconds: 20,
    });
    // The members met at the scheduler's barrier: the server heard no join.
    expect(rm.getJob(job.id).state).toBe('pending');
    const ran = rm.reusedJob(job.id, 'job-before');
    expect(ran.state).toBe('running');
    expect(ran.members.map((m) => m.state)).toEqual(['connected', 'connected']);
    expect(events).toContainEqual(
      expect.objectContaining({
        kind: 'jobStateChanged',
        jobId: job.id,
        to: 'running',
        reason: 'its members derive their communicator from the one kept since job job-before',
      }),
    );
    expect(rm.reusedJob(job.id, 'job-before').state).toBe('running'); // said twice: no change
    clock.advance(6000); // past the wiring timeout: it runs
    expect(rm.getJob(job.id).state).toBe('running');
    clock.advance(15_000); // its own timeout holds
    expect(rm.getJob(job.id)).toMatchObject({ state: 'failed', error: expect.stringMatching(/job timeout/) });
    expect(() => rm.reusedJob(job.id, 'job-before')).toThrow(/is failed/);
  });

  it('a job told it reuses a communicator after its members completed it stays completed', async () => {
    await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b'] });
    expect(rm.completeJob(job.id).state).toBe('completed');
    expect(() => rm.reusedJob(job.id, 'x')).toThrow(expect.objectContaining({ kind: 'aborted' }));
    rm.registerWorker({ id: 'plain', host: 'h1' });
    const forked = await rm.createJob({ impl: 'openmpi', mode: 'fork', members: ['plain'] });
    expect(() => rm.reusedJob(forked.id, 'x')).toThrow(expect.objectContaining({ kind: 'conflict' }));
  });

  it('a join waits at most waitMs and tells the member to ask again', async () => {
    await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b'] });
    const waiting = rm.joinJob(job.id, 'a', 500);
    clock.advance(500);
    expect((await waiting).ready).toBe(false);
    expect(rm.getJob(job.id).members[0]!.state).toBe('connected');
    const again = rm.joinJob(job.id, 'a', 500);
    await rm.joinJob(job.id, 'b', 500);
    expect((await again).ready).toBe(true);
  });

  it('falls back to fork mode, with the reason, when in-process cannot serve', async () => {
    await readyWorker('a');
    rm.registerWorker({ id: 'plain', host: 'h1' });
    const j1 = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'plain'] });
    expect([j1.mode, j1.modeReason]).toEqual(['fork', expect.stringMatching(/'plain' has not joined the pool/)]);
    expect(fork.calls[0]).toMatch(/^prepare/);
    await rm.deleteJob(j1.id);
    const j2 = await rm.createJob({ impl: 'mpich', mode: 'inprocess', members: ['a'] });
    expect([j2.mode, j2.modeReason]).toEqual(['fork', expect.stringMatching(/no in-process seats for mpich/)]);
    await rm.deleteJob(j2.id);
    const j3 = await rm.createJob({ impl: 'openmpi', members: ['a'] });
    expect([j3.mode, j3.modeReason]).toEqual(['fork', undefined]);
  });

  it('waits, within poolJoinMs, for a member whose worker has not asked to join yet, then runs in-process', async () => {
    await readyWorker('a');
    rm.registerWorker({ id: 'late', host: 'h1' });
    let settled: Job | undefined;
    const creating = rm
      .createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'late'], poolJoinMs: 5000 }, { waitMs: 60_000 })
      .then((j) => (settled = j));
    await flush();
    clock.advance(1000);
    await flush();
    expect(settled).toBeUndefined(); // still waiting for 'late'
    await rm.joinPool('late', { pid: 43 }); // its plugin asks: joining is enough to plan the job
    await creating;
    expect([settled!.mode, settled!.modeReason]).toEqual(['inprocess', undefined]);
  });

  it('after poolJoinMs a member that never asked makes the job run in fork mode, or fail when in-process was demanded', async () => {
    await readyWorker('a');
    rm.registerWorker({ id: 'never', host: 'h1' });
    const lenient = rm.createJob(
      { impl: 'openmpi', mode: 'inprocess', members: ['a', 'never'], poolJoinMs: 2000 },
      { waitMs: 60_000 },
    );
    await flush();
    clock.advance(2000);
    const j = await lenient;
    expect([j.mode, j.modeReason]).toEqual(['fork', expect.stringMatching(/'never' has not joined the pool/)]);
    await rm.deleteJob(j.id);
    const strict = rm.createJob(
      { impl: 'openmpi', mode: 'inprocess', strictMode: true, members: ['a', 'never'], poolJoinMs: 2000 },
      { waitMs: 60_000 },
    );
    const refused = expect(strict).rejects.toThrow(
      /asked to run in-process, but worker 'never' has not joined the pool .*after waiting/,
    );
    await flush();
    clock.advance(2000);
    await refused;
    // Without waiting (a plain REST request), strict mode fails at once and fork mode is immediate.
    await expect(
      rm.createJob({ impl: 'openmpi', mode: 'inprocess', strictMode: true, members: ['a', 'never'] }),
    ).rejects.toThrow(/asked to run in-process/);
  });

  it('a selector prefers workers that can run in-process', async () => {
    rm.registerWorker({ id: 'plain0', host: 'h1' });
    await readyWorker('a');
    rm.registerWorker({ id: 'plain1', host: 'h1' });
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', selector: { count: 2 } });
    expect([job.mode, job.members.map((m) => m.workerId)]).toEqual(['inprocess', ['a', 'b']]);
  });

  it('a member whose worker process dies fails the job at once, naming it; only that rank is retired', async () => {
    const ra = await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b'] });
    const joinA = rm.joinJob(job.id, 'a', 10_000);
    await rm.joinJob(job.id, 'b', 10_000);
    await joinA;
    rm.poolClientGone(job.namespace, ra, 'its worker process died');
    const failed = rm.getJob(job.id);
    expect(failed.state).toBe('failed');
    expect(failed.error).toMatch(/rank 0 \(worker a\) was lost: its worker process died/);
    expect(failed.members[0]!.endedJob).toBe(true);
    await flush();
    expect(pool.notified).toEqual([`${job.id} failed`]);
    // b is still connected: the job is released when it leaves (or after the grace).
    rm.leaveJob(job.id, 'b', false, 'MPI_ERR_PROC_FAILED');
    await rm.released(job.id);
    expect(rm.getWorker('b').state).toBe('available');
    expect(rm.getWorker('b').pool!.state).toBe('ready');
    expect(rm.getWorker('a').pool!.state).toBe('retired');
  });

  it('a member that reports failure fails the job; a join after the end is refused', async () => {
    await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b'] });
    const joinA = rm.joinJob(job.id, 'a', 10_000);
    rm.leaveJob(job.id, 'a', false, 'ValueError: bad input');
    await expect(joinA).rejects.toThrow(/ValueError: bad input/);
    await expect(rm.joinJob(job.id, 'b', 10)).rejects.toMatchObject({ kind: 'aborted' });
    expect(rm.getJob(job.id).error).toMatch(/worker a\) was lost: ValueError: bad input/);
  });

  it('a member that saw others fail before the server noticed names them: they are blamed, not it', async () => {
    await readyWorker('a');
    await readyWorker('b');
    await readyWorker('c');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b', 'c'] });
    rm.leaveJob(job.id, 'a', false, 'MPI_ERR_PROC_FAILED', [2]);
    const j = rm.getJob(job.id);
    expect(j.state).toBe('failed');
    expect(j.members.map((m) => [m.state, m.endedJob ?? false])).toEqual([
      ['lost', false],
      ['assigned', false],
      ['lost', true],
    ]);
    expect(j.error).toMatch(/rank 2 \(worker c\) was lost: rank 0 \(worker a\) saw its process fail/);
  });

  it('the wiring timeout fails a job whose communicator is never built; the grace releases a member that never leaves', async () => {
    await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({
      impl: 'openmpi',
      mode: 'inprocess',
      members: ['a', 'b'],
      wiringTimeoutSeconds: 5,
    });
    const j = rm.joinJob(job.id, 'a', 10_000);
    clock.advance(5000);
    await expect(j).rejects.toThrow(/wiring timeout/);
    expect(rm.getJob(job.id).state).toBe('failed');
    expect(rm.getWorker('a').state).toBe('frozen');
    clock.advance(5000);
    await flush();
    expect(rm.getWorker('a').state).toBe('available');
  });

  it("MPI_Abort from a pool rank aborts its worker's job", async () => {
    const ra = await readyWorker('a');
    await readyWorker('b');
    const job = await rm.createJob({ impl: 'openmpi', mode: 'inprocess', members: ['a', 'b'] });
    rm.poolAbort(job.namespace, ra, 3, 'boom');
    expect(rm.getJob(job.id)).toMatchObject({
      state: 'aborted',
      error: expect.stringMatching(/rank 0 aborted the job with status 3: boom/),
    });
  });
});
