// Random and malformed requests against every route: the API answers each with a status below
// 500 and the error shape, and keeps serving. Seeded, so a failure can be replayed
// (DASK_PMIX_FUZZ_SEED=<seed>).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiFixture, apiFixture, worker } from './fixture.js';

const SEED = Number(process.env.DASK_PMIX_FUZZ_SEED ?? Date.now() % 1_000_000);
let state = SEED;
const rand = () => (state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;

const IDS = ['f0', 'f1', 'f2', 'ghost', '', 'a'.repeat(300), '%2F', '..', 'mpi://WORLD', '😀'];
const FIELDS = [
  'id',
  'host',
  'pid',
  'uid',
  'name',
  'members',
  'selector',
  'count',
  'placement',
  'impl',
  'pset',
  'mode',
  'tags',
  'resources',
  'labels',
  'wiringTimeoutSeconds',
  'timeoutSeconds',
  'owner',
  'reason',
  '__proto__',
  'constructor',
];

function value(depth = 0): unknown {
  switch (Math.floor(rand() * (depth > 2 ? 6 : 9))) {
    case 0:
      return pick(IDS);
    case 1:
      return Math.floor(rand() * 10) - 3;
    case 2:
      return rand() * 1e12;
    case 3:
      return pick([true, false, null]);
    case 4:
      return pick(['openmpi', 'mpich', 'intelmpi', 'pack', 'spread', 'fork', 'running', 'IMPL_UNSPECIFIED']);
    case 5:
      return -0.5;
    case 6:
      return Array.from({ length: Math.floor(rand() * 4) }, () => value(depth + 1));
    default:
      return body(depth + 1);
  }
}

function body(depth = 0): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (let i = Math.floor(rand() * 5); i > 0; i--) o[pick(FIELDS)] = value(depth);
  return o;
}

const ROUTES: [string, () => string][] = [
  ['POST', () => '/v1/workers'],
  ['GET', () => '/v1/workers'],
  ['GET', () => `/v1/workers/${encodeURIComponent(pick(IDS))}`],
  ['DELETE', () => `/v1/workers/${encodeURIComponent(pick(IDS))}`],
  ['POST', () => '/v1/psets'],
  ['GET', () => `/v1/psets/${encodeURIComponent(pick(IDS))}`],
  ['PUT', () => `/v1/psets/${encodeURIComponent(pick(IDS))}`],
  ['DELETE', () => `/v1/psets/${encodeURIComponent(pick(IDS))}`],
  ['POST', () => '/v1/jobs'],
  ['GET', () => `/v1/jobs?state=${pick(['running', 'x', ''])}`],
  ['GET', () => `/v1/jobs/${pick(IDS)}`],
  ['DELETE', () => `/v1/jobs/${encodeURIComponent(pick(IDS))}`],
  ['GET', () => `/v1/jobs/${pick(IDS)}/env/${pick(IDS)}`],
  ['POST', () => `/v1/jobs/${pick(IDS)}/members/${pick(IDS)}/lost`],
];

let fx: ApiFixture;
beforeAll(async () => {
  fx = await apiFixture({ token: '' });
  for (const id of ['f0', 'f1', 'f2']) await fx.call('POST', '/v1/workers', worker(id, 'h'));
});
afterAll(() => fx.close());

describe(`REST fuzz (seed ${SEED})`, () => {
  it('answers 400 requests without a 5xx and stays consistent', async () => {
    const seen = new Map<number, number>();
    for (let i = 0; i < 400; i++) {
      const [method, path] = pick(ROUTES);
      const p = path();
      const raw = rand() < 0.1 ? pick(['{', 'null', '[]', '"x"', '{"a":', '\u0000']) : undefined;
      const b = method === 'GET' || method === 'DELETE' ? undefined : (raw ?? body());
      const r = await fx.call(method, p, b);
      seen.set(r.status, (seen.get(r.status) ?? 0) + 1);
      expect(r.status, `${method} ${p} ${JSON.stringify(b)} → ${JSON.stringify(r.body)}`).toBeLessThan(500);
      if (r.status >= 400)
        expect(r.body, `${method} ${p}`).toMatchObject({ statusCode: r.status, message: expect.any(String) });
    }
    // The core's invariants hold: a frozen worker belongs to exactly one active job, and back.
    const jobs = fx.rm.listJobs().filter((j) => ['pending', 'wiring', 'running'].includes(j.state));
    for (const w of fx.rm.listWorkers()) {
      const holders = jobs.filter((j) => j.members.some((m) => m.workerId === w.id));
      expect(holders.length, w.id).toBe(w.state === 'frozen' ? 1 : 0);
      if (w.state === 'frozen') expect(w.jobId).toBe(holders[0]!.id);
    }
    expect((await fx.call('GET', '/v1/health')).status).toBe(200);
    expect(seen.size).toBeGreaterThan(2);
  });
});
