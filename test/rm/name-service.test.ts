import { describe, expect, it } from 'vitest';
import { KvStore, ManualClock, NameService } from '../../src/rm/index.js';

const a0 = { jobId: 'a', namespace: 'ns-a', rank: 0 };
const a1 = { jobId: 'a', namespace: 'ns-a', rank: 1 };
const b0 = { jobId: 'b', namespace: 'ns-b', rank: 0 };

describe('NameService', () => {
  it('publishes and looks up across jobs in the session range', async () => {
    const ns = new NameService<string>(new ManualClock());
    ns.publish(a0, [{ key: 'svc', value: 'port-1' }]);
    const [d] = await ns.lookup(b0, ['svc']);
    expect(d).toMatchObject({ key: 'svc', value: 'port-1', publisher: a0 });
  });

  it('keeps namespace-range data inside its job', async () => {
    const ns = new NameService<string>(new ManualClock());
    ns.publish(a0, [{ key: 'k', value: 'v' }], { range: 'namespace' });
    await expect(ns.lookup(a1, ['k'], { range: 'namespace' })).resolves.toHaveLength(1);
    await expect(ns.lookup(b0, ['k'])).rejects.toMatchObject({ kind: 'not_found' });
  });

  it('refuses a duplicate key in the same range', () => {
    const ns = new NameService<string>(new ManualClock());
    ns.publish(a0, [{ key: 'k', value: 'v' }]);
    expect(() => ns.publish(b0, [{ key: 'k', value: 'w' }])).toThrow(/already published/);
    expect(() =>
      ns.publish(a0, [
        { key: 'x', value: '1' },
        { key: 'x', value: '2' },
      ]),
    ).toThrow(/twice/);
  });

  it('holds a waiting lookup until every key is published', async () => {
    const ns = new NameService<string>(new ManualClock());
    const p = ns.lookup(b0, ['x', 'y'], { wait: true, timeoutMs: 1000 });
    ns.publish(a0, [{ key: 'x', value: '1' }]);
    ns.publish(a1, [{ key: 'y', value: '2' }]);
    expect((await p).map((d) => d.value)).toEqual(['1', '2']);
  });

  it('with a count, answers once at least that many keys are published (0: all of them)', async () => {
    const ns = new NameService<string>(new ManualClock());
    const one = ns.lookup(b0, ['p', 'q'], { wait: 1, timeoutMs: 1000 });
    const all = ns.lookup(b0, ['p', 'q'], { wait: 0, timeoutMs: 1000 });
    let allDone = false;
    void all.then(() => (allDone = true));
    ns.publish(a0, [{ key: 'q', value: '2' }]);
    expect((await one).map((d) => d.key)).toEqual(['q']);
    await Promise.resolve();
    expect(allDone).toBe(false);
    ns.publish(a1, [{ key: 'p', value: '1' }]);
    expect((await all).map((d) => d.value)).toEqual(['1', '2']);
  });

  it('times a waiting lookup out, and fails it when the waiting job ends', async () => {
    const clock = new ManualClock();
    const ns = new NameService<string>(clock);
    const p = ns.lookup(b0, ['never'], { wait: true, timeoutMs: 100 });
    clock.advance(100);
    await expect(p).rejects.toMatchObject({ kind: 'timeout', message: expect.stringMatching(/never/) });
    const q = ns.lookup(b0, ['never'], { wait: true });
    ns.jobEnded('b', 'job b failed');
    await expect(q).rejects.toMatchObject({ kind: 'aborted' });
  });

  it('honours persistence: first read, proc, app', async () => {
    const ns = new NameService<string>(new ManualClock());
    ns.publish(a0, [{ key: 'once', value: '1' }], { persistence: 'first_read' });
    ns.publish(a0, [{ key: 'proc', value: '2' }], { persistence: 'proc' });
    ns.publish(a1, [{ key: 'app', value: '3' }]);
    ns.publish(a1, [{ key: 'forever', value: '4' }], { persistence: 'session' });
    await ns.lookup(b0, ['once']);
    await expect(ns.lookup(b0, ['once'])).rejects.toThrow();
    ns.procEnded('a', 0);
    await expect(ns.lookup(b0, ['proc'])).rejects.toThrow();
    await expect(ns.lookup(b0, ['app'])).resolves.toHaveLength(1);
    ns.jobReleased('a');
    await expect(ns.lookup(b0, ['app'])).rejects.toThrow();
    await expect(ns.lookup(b0, ['forever'])).resolves.toHaveLength(1);
  });

  it('unpublishes only what the caller published', () => {
    const ns = new NameService<string>(new ManualClock());
    ns.publish(a0, [
      { key: 'k1', value: '1' },
      { key: 'k2', value: '2' },
    ]);
    expect(ns.unpublish(a1, ['k1'])).toBe(0);
    expect(ns.unpublish(a0, ['k1'])).toBe(1);
    expect(ns.unpublish(a0, [])).toBe(1);
    expect(ns.size).toBe(0);
  });
});

describe('KvStore', () => {
  it('puts, gets, and waits for a key', async () => {
    const kv = new KvStore(new ManualClock());
    kv.put(0, 'a', '1');
    expect(kv.get('a')).toBe('1');
    expect(kv.get('b')).toBeUndefined();
    const p = kv.waitFor('b', 1000);
    kv.put(1, 'b', '2');
    await expect(p).resolves.toBe('2');
  });

  it('fails waiters when closed and on timeout', async () => {
    const clock = new ManualClock();
    const kv = new KvStore(clock);
    const p = kv.waitFor('x', 10);
    clock.advance(10);
    await expect(p).rejects.toMatchObject({ kind: 'timeout' });
    const q = kv.waitFor('y');
    kv.close('job ended');
    await expect(q).rejects.toMatchObject({ kind: 'aborted' });
    expect(() => kv.put(0, 'z', '1')).toThrow(/job ended/);
  });
});
