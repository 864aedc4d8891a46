// A job request short of workers by those the cluster lost recently and expects back (their nanny
// restarts them, or dask-pmix replaces them) waits for them in the admission line, within its
// wiring timeout, woken as workers join; a request that can never be met still fails at once.
import { beforeEach, describe, expect, it } from 'vitest';
import { defaultPolicy } from '../../src/policy/index.js';
import { type Job, ManualClock, type Policy, ResourceManager } from '../../src/rm/index.js';
import { RecordingBackend } from './fake-backend.js';

let clock: ManualClock;
let rm: ResourceManager;
let selects: number;

const flush = () => new Promise((r) => setImmediate(r));

beforeEach(() => {
  clock = new ManualClock();
  const base = defaultPolicy({ releaseGraceMs: 5000 });
  selects = 0;
  // Counts the selector's tries: a waiting request is tried again on events only, never on a timer.
  const policy: Policy = {
    ...base,
    select: (sel, ws) => {
      selects++;
      return base.select(sel, ws);
    },
  };
  rm = new ResourceManager({ clock, backends: [new RecordingBackend()], policy, wiringTimeoutSeconds: 30 });
  for (const [id, host] of [
    ['w0', 'h1'],
    ['w1', 'h1'],
    ['w2', 'h2'],
  ] as const)
    rm.registerWorker({ id, host });
});

/** The request's outcome so far: undefined while it waits. */
function track(p: Promise<Readonly<Job>>): { job?: Readonly<Job>; error?: Error } {
  const out: { job?: Readonly<Job>; error?: Error } = {};
  p.then(
    (j) => (out.job = j),
    (e: Error) => (out.error = e),
  );
  return out;
}

describe('a job request short of workers that are coming back', () => {
  it('waits for a worker whose nanny restarts it and starts as it registers again (under a new id)', async () => {
    rm.removeWorker('w2', 'its process died', { returning: true });
    const out = track(rm.createJob({ impl: 'openmpi', selector: { count: 3 } }, { waitMs: 60_000 }));
    await flush();
    expect(out).toEqual({});
    expect(rm.waitingJobs).toBe(1);
    // Nothing tries it again while nothing happens: the wait is event-driven, not a poll.
    const tries = selects;
    for (let i = 0; i < 10; i++) {
      clock.advance(1000);
      await flush();
    }
    expect(selects).toBe(tries);
    expect(out).toEqual({});
    rm.registerWorker({ id: 'w2-restarted', host: 'h2' });
    await flush();
    expect(out.error).toBeUndefined();
    expect(out.job!.members.map((m) => m.workerId).sort()).toEqual(['w0', 'w1', 'w2-restarted']);
    expect(rm.workersExpectedBack).toBe(0);
  });

  it('fails at its wiring timeout naming how many were expected back and how long it waited', async () => {
    rm.removeWorker('w1', 'its process died', { returning: true });
    rm.removeWorker('w2', 'its process died', { returning: true });
    const out = track(rm.createJob({ impl: 'openmpi', selector: { count: 3 } }, { waitMs: 60_000 }));
    await flush();
    clock.advance(29_000);
    await flush();
    rm.registerWorker({ id: 'w1-restarted', host: 'h1' }); // one of the two comes back
    await flush();
    expect(out).toEqual({});
    clock.advance(1000);
    await flush();
    expect(out.error).toMatchObject({ kind: 'unprocessable' });
    expect(out.error!.message).toMatch(
      /needs 3 available workers, but only 2 match; waited 30\.0 s \(the job's wiring timeout\) for 2 workers expected back .*and 1 did not return/,
    );
    expect(rm.waitingJobs).toBe(0);
    expect(rm.listWorkers().every((w) => w.state === 'available')).toBe(true);
  });

  it("is bounded by the request's own wait when that is shorter, and by the job's wiring timeout", async () => {
    rm.removeWorker('w2', 'its process died', { returning: true });
    const short = track(rm.createJob({ impl: 'openmpi', selector: { count: 3 } }, { waitMs: 5000 }));
    const own = track(
      rm.createJob({ impl: 'openmpi', selector: { count: 3 }, wiringTimeoutSeconds: 2 }, { waitMs: 60_000 }),
    );
    await flush();
    clock.advance(2000);
    await flush();
    expect(own.error?.message).toMatch(/waited 2\.0 s \(the job's wiring timeout\) for 1 worker expected back/);
    expect(short).toEqual({});
    clock.advance(3000);
    await flush();
    expect(short.error?.message).toMatch(/waited 5\.0 s \(the request's wait\) for 1 worker expected back/);
  });

  it('fails at once when it could never be met, or the workers that left are not coming back', async () => {
    rm.removeWorker('w2', 'its process died', { returning: true });
    // More than the workers there are and those expected back.
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 5 } }, { waitMs: 60_000 })).rejects.toMatchObject({
      kind: 'unprocessable',
      message: expect.stringMatching(/needs 5 available workers, but only 2 match$/),
    });
    // A selector the worker coming back does not match either.
    await expect(
      rm.createJob({ impl: 'openmpi', selector: { count: 3, hosts: ['h1'] } }, { waitMs: 60_000 }),
    ).rejects.toMatchObject({ kind: 'unprocessable' });
    // A member named that is not a worker and is not coming back under that name.
    await expect(
      rm.createJob({ impl: 'openmpi', members: ['w0', 'nobody'] }, { waitMs: 60_000 }),
    ).rejects.toMatchObject({ kind: 'unprocessable', message: "member 'nobody' is not a registered worker" });
    // Retired (not expected back): at once.
    rm.removeWorker('w1', 'retired');
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 3 } }, { waitMs: 60_000 })).rejects.toMatchObject({
      kind: 'unprocessable',
    });
    expect(rm.waitingJobs).toBe(0);
  });

  it('counts only workers that left within the wiring timeout, and never makes a plain request wait', async () => {
    rm.removeWorker('w2', 'its process died', { returning: true });
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 3 } })).rejects.toMatchObject({
      kind: 'unprocessable',
      message: expect.stringMatching(/1 worker that left the cluster is expected back .*may not wait/),
    });
    clock.advance(31_000);
    await expect(rm.createJob({ impl: 'openmpi', selector: { count: 3 } }, { waitMs: 60_000 })).rejects.toMatchObject({
      kind: 'unprocessable',
      message: 'the selector needs 3 available workers, but only 2 match',
    });
    expect(rm.waitingJobs).toBe(0);
  });

  it('waits for a member named by its id when it comes back under that id (a fixed address)', async () => {
    rm.removeWorker('w2', 'replaced by dask-pmix', { returning: true });
    const out = track(rm.createJob({ impl: 'openmpi', members: ['w2', 'w0'] }, { waitMs: 60_000 }));
    await flush();
    expect(out).toEqual({});
    rm.registerWorker({ id: 'w2', host: 'h2' });
    await flush();
    expect(out.job!.members.map((m) => m.workerId)).toEqual(['w2', 'w0']);
  });

  it('says so when a member named by its id came back under another address', async () => {
    rm.removeWorker('w2', 'replaced by dask-pmix', { returning: true });
    const out = track(rm.createJob({ impl: 'openmpi', members: ['w2', 'w0'] }, { waitMs: 60_000 }));
    await flush();
    expect(out).toEqual({});
    clock.advance(1500);
    rm.registerWorker({ id: 'w2-restarted', host: 'h2' });
    await flush();
    expect(out.error).toMatchObject({ kind: 'unprocessable' });
    expect(out.error!.message).toBe(
      "member 'w2' left the cluster and came back under another address, as a restarted worker usually does: " +
        'name the workers there are now, or ask for a number of members (after waiting 1.5 s for 1 worker expected back)',
    );
    expect(rm.waitingJobs).toBe(0);
  });
});
