// A hostile (or broken) client with the token cannot grow the sidecar's memory without bound: big
// requests are refused with a 4xx naming the limit, counts stop at their bounds with 429, a reader
// that stops reading the event stream is cut off, and the heap stays bounded throughout.
import { hostname } from 'node:os';
import { afterAll, describe, expect, it } from 'vitest';
import { type ServeChild, startServe } from '../../bench/lib/sidecar.js';
import { restClient, SERVE_START_MS, statusOfHead, until } from '../helpers/http.js';

let serve: ServeChild | undefined;
afterAll(() => serve?.child.kill('SIGKILL'));

async function heapBytes(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(/^nodejs_heap_size_used_bytes (\S+)$/m.exec(text)![1]);
}

describe('memory bounds from REST', () => {
  it("refuses a hostile client's big requests and keeps the heap bounded", { timeout: 180_000 }, async () => {
    serve = await startServe({
      args: ['--no-pmi', '--pool-size', '0', '--max-workers', '300', '--max-psets', '100'],
      token: 'tok',
      startMs: SERVE_START_MS,
    });
    const { url } = serve;
    const api = restClient(url, 'tok');
    const base = await heapBytes(url);
    const t0 = Date.now();
    const mark = (what: string) => process.stdout.write(`[limits] ${what} at ${Date.now() - t0} ms\n`);
    const worker = (id: string, extra: Record<string, unknown> = {}) => ({
      id,
      host: hostname(),
      pid: 1,
      uid: process.getuid!(),
      gid: process.getgid!(),
      ...extra,
    });

    // The attack of the issue: registrations of ~0.9 MB, each with a 60,000-key resources map.
    const resources = Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`r${i}`, i]));
    const huge = JSON.stringify(worker('x', { resources }));
    expect(huge.length).toBeGreaterThan(800_000);
    for (let i = 0; i < 60; i++) {
      const r = await api('POST', '/v1/workers', huge.replace('"id":"x"', `"id":"huge-${i}"`));
      expect(r.status).toBe(400);
      expect(r.body.message).toMatch(/resources must NOT have more than 32 properties/);
    }
    const r2 = await api(
      'POST',
      '/v1/workers',
      JSON.stringify(worker('big', { tags: Array.from({ length: 20_000 }, (_, i) => `t${i}`) })),
    );
    expect(r2.status).toBe(400);
    const tooLong = { authorization: 'Bearer tok', 'content-type': 'application/json', 'content-length': '2097152' };
    expect(await statusOfHead(url, 'POST', '/v1/workers', tooLong)).toBe(413);

    mark('big requests refused');
    // Counts: as many workers and psets as allowed, each as large as allowed; then 429.
    const tags = Array.from({ length: 32 }, (_, i) => `${'t'.repeat(60)}${i}`);
    const res = Object.fromEntries(Array.from({ length: 32 }, (_, i) => [`${'r'.repeat(60)}${i}`, i]));
    const ids: string[] = [];
    for (let i = 0; i < 300; i++) {
      const id = `w-${i}-${'i'.repeat(200)}`;
      ids.push(id);
      expect((await api('POST', '/v1/workers', worker(id, { tags, resources: res }))).status).toBe(201);
    }
    const over = await api('POST', '/v1/workers', worker('one-more'));
    expect(over.status).toBe(429);
    expect(over.body.message).toMatch(/at most 300 workers/);
    for (let i = 0; i < 100; i++)
      expect((await api('POST', '/v1/psets', { name: `p${i}`, members: ids })).status).toBe(201);
    const p = await api('POST', '/v1/psets', { name: 'p-over', members: ids });
    expect(p.status).toBe(429);
    expect(p.body.message).toMatch(/at most 100 psets/);

    mark('counts at their bounds');
    // Event streams: 64 readers at most; a reader that never reads is dropped, not buffered.
    const ctl = new AbortController();
    const streams = await Promise.all(
      Array.from({ length: 64 }, () =>
        fetch(`${url}/v1/events?since=0`, { headers: { authorization: 'Bearer tok' }, signal: ctl.signal }),
      ),
    );
    expect(streams.every((s) => s.status === 200)).toBe(true);
    const refused = await api('GET', '/v1/events');
    expect(refused.status).toBe(429);
    expect(refused.body.message).toMatch(/at most 64/);
    // None of the 64 reads: churn psets until their queues overflow and they are cut.
    for (let round = 0; round < 12; round++) {
      for (let i = 0; i < 100; i++)
        await api('PUT', `/v1/psets/p${i}`, { members: ids.slice(0, 1 + ((i + round) % 300)) });
    }
    mark('churned');
    await until(
      async () =>
        /^dask_pmix_event_streams_dropped_total (\d+)/m.exec(await (await fetch(`${url}/metrics`)).text())?.[1] ===
        '64',
      30_000,
      'the stalled readers to be dropped',
    );
    ctl.abort();
    expect((await api('GET', '/v1/health')).status).toBe(200);

    const heap = await heapBytes(url);
    // Held at the bounds: 300 workers and 100 psets of 300 members, the event history: tens of MB.
    expect(heap - base).toBeLessThan(150 * 1024 * 1024);
    process.stdout.write(
      `[limits] heap ${Math.round(base / 1e6)} MB at start, ${Math.round(heap / 1e6)} MB at the bounds\n`,
    );
  });
});
