import { describe, expect, it } from 'vitest';
import { selectWorkers } from '../../src/policy/index.js';
import type { Worker } from '../../src/rm/index.js';

const w = (id: string, host: string, extra: Partial<Worker> = {}): Worker => ({
  id,
  address: id,
  host,
  pid: 1,
  resources: {},
  tags: [],
  state: 'available',
  registeredAt: '',
  ...extra,
});
const pool = [w('a1', 'a'), w('b1', 'b'), w('a2', 'a'), w('c1', 'c'), w('b2', 'b'), w('a3', 'a')];
const ids = (ws: Worker[]) => ws.map((x) => x.id);

describe('selectWorkers', () => {
  it('packs: fullest host first, ranks contiguous per host', () => {
    expect(ids(selectWorkers({ count: 4, placement: 'pack' }, pool))).toEqual(['a1', 'a2', 'a3', 'b1']);
    expect(ids(selectWorkers({ count: 2 }, pool))).toEqual(['a1', 'a2']);
  });

  it('spreads: round-robin over hosts', () => {
    expect(ids(selectWorkers({ count: 5, placement: 'spread' }, pool))).toEqual(['a1', 'b1', 'c1', 'a2', 'b2']);
  });

  it('filters by tags, resources and hosts', () => {
    const ws = [
      w('g1', 'a', { tags: ['gpu'], resources: { GPU: 1 } }),
      w('g2', 'b', { tags: ['gpu', 'x'], resources: { GPU: 2 } }),
      w('n1', 'a'),
    ];
    expect(ids(selectWorkers({ count: 2, tags: ['gpu'] }, ws))).toEqual(['g1', 'g2']);
    expect(ids(selectWorkers({ count: 1, resources: { GPU: 2 } }, ws))).toEqual(['g2']);
    expect(ids(selectWorkers({ count: 2, hosts: ['a'] }, ws))).toEqual(['g1', 'n1']);
  });

  it('says why a selector cannot be met', () => {
    expect(() => selectWorkers({ count: 3, tags: ['gpu'] }, pool)).toThrow(
      /needs 3 available workers with tags gpu, but only 0 match/,
    );
    expect(() => selectWorkers({ count: 0 }, pool)).toThrow(/positive/);
  });
});
