import { describe, expect, it } from 'vitest';
import { Collectives, ManualClock, RmError } from '../../src/rm/index.js';

const bytes = (s: string) => new TextEncoder().encode(s);

describe('Collectives', () => {
  it('completes when every participant has joined, with contributions in rank order', async () => {
    const c = new Collectives(3, new ManualClock(), 0);
    const p2 = c.join({ name: 'fence', participants: 'all', contributors: [2], data: bytes('c') });
    const p0 = c.join({ name: 'fence', participants: 'all', contributors: [0], data: bytes('a') });
    expect(c.pendingCount).toBe(1);
    const p1 = c.join({ name: 'fence', participants: 'all', contributors: [1], data: bytes('b') });
    const [r0, r1, r2] = await Promise.all([p0, p1, p2]);
    expect(r0.contributions.map((x) => x.ranks)).toEqual([[0], [1], [2]]);
    expect(r0.contributions.map((x) => new TextDecoder().decode(x.data))).toEqual(['a', 'b', 'c']);
    expect(r1).toEqual(r0);
    expect(r2).toEqual(r0);
    expect(c.pendingCount).toBe(0);
  });

  it('matches each rank’s n-th join under a name, so repeated barriers need no ids', async () => {
    const c = new Collectives(2, new ManualClock(), 0);
    const a1 = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    const a2 = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    expect(c.pendingCount).toBe(2);
    await c.join({ name: 'fence', participants: 'all', contributors: [1] });
    await a1;
    expect(c.pendingCount).toBe(1);
    await c.join({ name: 'fence', participants: 'all', contributors: [1] });
    await a2;
  });

  it('takes one join for many contributors (a PMIx server upcall brings all its local ranks)', async () => {
    const c = new Collectives(4, new ManualClock(), 0);
    const r = await c.join({ name: 'fence', participants: 'all', contributors: [0, 1, 2, 3], data: bytes('all') });
    expect(r.contributions).toHaveLength(1);
  });

  it('supports collectives over a subset of ranks', async () => {
    const c = new Collectives(4, new ManualClock(), 0);
    const p = c.join({ name: 'group:g', participants: [1, 3], contributors: [3] });
    await c.join({ name: 'group:g', participants: [3, 1], contributors: [1] });
    await p;
  });

  it('fails a pending collective when a participant dies, and refuses later joins that owe it', async () => {
    const c = new Collectives(3, new ManualClock(), 0);
    const p = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    c.markGone(2, 'was lost (killed)');
    await expect(p).rejects.toMatchObject({ kind: 'aborted', message: expect.stringMatching(/rank 2 was lost/) });
    await expect(c.join({ name: 'fence', participants: 'all', contributors: [1] })).rejects.toBeInstanceOf(RmError);
    // A collective that does not involve the dead rank still works.
    const q = c.join({ name: 'pair', participants: [0, 1], contributors: [0] });
    await c.join({ name: 'pair', participants: [0, 1], contributors: [1] });
    await q;
  });

  it('does not fail a collective the dead rank already joined', async () => {
    const c = new Collectives(2, new ManualClock(), 0);
    const p = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    c.markGone(0, 'has finalized');
    expect(c.pendingCount).toBe(1);
    await c.join({ name: 'fence', participants: 'all', contributors: [1] });
    await p;
  });

  it('times out naming the missing ranks', async () => {
    const clock = new ManualClock();
    const c = new Collectives(3, clock, 5000);
    const p = c.join({ name: 'fence', participants: 'all', contributors: [1] });
    clock.advance(4999);
    expect(c.pendingCount).toBe(1);
    clock.advance(1);
    await expect(p).rejects.toMatchObject({ kind: 'timeout', message: expect.stringMatching(/ranks 0,2/) });
  });

  it('fails everything pending and everything later once the job ends', async () => {
    const c = new Collectives(2, new ManualClock(), 0);
    const p = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    c.close('job j1 aborted');
    await expect(p).rejects.toMatchObject({ kind: 'aborted' });
    await expect(c.join({ name: 'fence', participants: 'all', contributors: [1] })).rejects.toMatchObject({
      kind: 'aborted',
    });
  });

  it('rejects bad input', async () => {
    const c = new Collectives(2, new ManualClock(), 0);
    await expect(c.join({ name: 'f', participants: [0, 5], contributors: [0] })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    await expect(c.join({ name: 'f', participants: [0], contributors: [1] })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    await expect(c.join({ name: 'f', participants: [], contributors: [] })).rejects.toMatchObject({
      kind: 'bad_request',
    });
    await expect(c.join({ name: 'f', participants: 'all', contributors: [] })).rejects.toMatchObject({
      kind: 'bad_request',
    });
  });

  it('reports durations and outcomes to its observer', async () => {
    const clock = new ManualClock();
    const seen: [string, number, string][] = [];
    const c = new Collectives(2, clock, 1000, (n, s, o) => seen.push([n, s, o]));
    const p = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    clock.advance(250);
    await c.join({ name: 'fence', participants: 'all', contributors: [1] });
    await p;
    const q = c.join({ name: 'fence', participants: 'all', contributors: [0] });
    clock.advance(1000);
    await expect(q).rejects.toThrow();
    expect(seen).toEqual([
      ['fence', 0.25, 'ok'],
      ['fence', 1, 'timeout'],
    ]);
  });

  it('hands a collective over to a delegate, which hears who is gone and when the job ends', async () => {
    const seen: [string, number, string][] = [];
    const c = new Collectives(3, new ManualClock(), 500, (n, s, o) => seen.push([n, s, o]));
    c.markGone(2, 'was lost (gone early)');
    const told: string[] = [];
    const d = c.delegate('fence', {
      rankGone: (r, m) => told.push(`${r}: ${m}`),
      close: (m) => told.push(`closed: ${m}`),
    });
    // It starts from what the model knows.
    expect(d).toMatchObject({
      timeoutMs: 500,
      gone: [[2, "collective 'fence' cannot complete: rank 2 was lost (gone early)"]],
      closed: undefined,
    });
    // Joins of the delegated name are refused here; other collectives go on as before.
    await expect(c.join({ name: 'fence', participants: 'all', contributors: [0] })).rejects.toMatchObject({
      kind: 'conflict',
    });
    expect(() => c.delegate('fence', { rankGone: () => {}, close: () => {} })).toThrow('already');
    const group = c.join({ name: 'group:g', participants: [0, 1], contributors: [0] });
    c.markGone(1, 'has finalized');
    await expect(group).rejects.toThrow('rank 1 has finalized');
    c.close('job j-1 failed: test');
    expect(told).toEqual([
      "1: collective 'fence' cannot complete: rank 1 has finalized",
      'closed: job j-1 failed: test',
    ]);
    d.observe(0.5, 'ok');
    expect(seen).toEqual([
      ['group:g', 0, 'failed'],
      ['fence', 0.5, 'ok'],
    ]);
  });
});
