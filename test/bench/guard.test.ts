// The perf guard's verdict: ratios compared with their record, never absolute times.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { geomean, judge, recordedRatios } from '../../bench/guard.js';
import { guardSection } from '../../bench/lib/guard.js';

describe('perf guard', () => {
  const recorded = { 'n2.fence_us': 1.0, 'n8.fence_us': 0.8, 'n16.fence_us': 1.2 };

  it('passes a run whose ratios moved less than 2x, on the keys both runs share', () => {
    const j = judge(recorded, { 'n2.fence_us': 0.6, 'n8.fence_us': 0.5, 'n4.new_key': 0.01 }, 2);
    expect(j.ok).toBe(true);
    expect(j.verdicts.map((v) => v.key)).toEqual(['n2.fence_us', 'n8.fence_us']);
    expect(j.recorded).toBeCloseTo(Math.sqrt(0.8), 6);
  });

  it('fails when the mean ratio falls below half its record', () => {
    const j = judge(recorded, { 'n2.fence_us': 0.45, 'n8.fence_us': 0.35 }, 2);
    expect(j.ok).toBe(false);
    expect(j.now).toBeCloseTo(geomean([0.45, 0.35]), 6);
    expect(j.verdicts.every((v) => !v.ok)).toBe(true);
  });

  it('names a single ratio that fell without failing on it alone', () => {
    const j = judge(recorded, { 'n2.fence_us': 0.3, 'n8.fence_us': 1.6, 'n16.fence_us': 1.2 }, 2);
    expect(j.ok).toBe(true);
    expect(j.verdicts.filter((v) => !v.ok).map((v) => v.key)).toEqual(['n2.fence_us']);
  });

  it('fails when the runs share no key', () => {
    expect(judge(recorded, { other: 1 }, 2).ok).toBe(false);
  });

  it('reads a record, and refuses a results file without a guard section or without the file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'guard-'));
    const with_ = join(dir, 'with.json');
    const without = join(dir, 'without.json');
    const empty = join(dir, 'empty.json');
    writeFileSync(with_, JSON.stringify({ guard: { ratios: { a: 1.5 } } }));
    writeFileSync(without, JSON.stringify({ results: {} }));
    writeFileSync(empty, JSON.stringify({ guard: { ratios: {} } }));
    expect(recordedRatios(with_)).toEqual({ a: 1.5 });
    expect(recordedRatios(without)).toMatch(/has no guard\.ratios/);
    expect(recordedRatios(empty)).toMatch(/has no guard\.ratios/);
    expect(recordedRatios(join(dir, 'absent.json'))).toMatch(/does not exist/);
  });

  it('records only finite positive ratios', () => {
    expect(guardSection({ a: 1.23456, b: NaN, c: 0, d: Infinity }).ratios).toEqual({ a: 1.235 });
  });
});
