// Job requests that find their workers busy wait in line (POST /v1/jobs?wait=<s>) instead of
// failing at once: they start as workers are freed, oldest first; the line is bounded (429) and
// every wait ends at its deadline with the reason (409).
import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiFixture, apiFixture, TOKEN, worker } from './fixture.js';

let fx: ApiFixture;
beforeAll(async () => {
  fx = await apiFixture({ maxWaitingJobs: 8 });
  for (const id of ['a', 'b', 'c', 'd']) await fx.call('POST', '/v1/workers', worker(id));
});
afterAll(() => fx.close());

describe('admission', () => {
  it('a request for busy workers waits and starts when they are freed', async () => {
    const held = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a', 'b'] })).body;
    const t0 = Date.now();
    const waiting = fx.call('POST', '/v1/jobs?wait=20', { impl: 'openmpi', members: ['b', 'c'] });
    await new Promise((r) => setTimeout(r, 300));
    expect(fx.rm.waitingJobs).toBe(1);
    expect((await fx.call('DELETE', `/v1/jobs/${held.id}`)).status).toBe(200);
    const r = await waiting;
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body.members.map((m: any) => m.workerId)).toEqual(['b', 'c']);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
    await fx.call('DELETE', `/v1/jobs/${r.body.id}`);
  });

  it('without wait, or past its deadline, a busy request is refused with the reason', async () => {
    const held = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a'] })).body;
    const now = await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a'] });
    expect(now.status).toBe(409);
    const later = await fx.call('POST', '/v1/jobs?wait=0.5', { impl: 'openmpi', members: ['a'] });
    expect(later.status).toBe(409);
    expect(later.body.message).toMatch(/already in job .*after waiting 0\.\d s/);
    // Not busy but impossible: no waiting.
    const never = await fx.call('POST', '/v1/jobs?wait=30', { impl: 'openmpi', selector: { count: 9 } });
    expect(never.status).toBe(422);
    expect((await fx.call('POST', '/v1/jobs?wait=9999', { impl: 'openmpi', members: ['a'] })).status).toBe(400);
    await fx.call('DELETE', `/v1/jobs/${held.id}`);
  });

  it('a selector waits for enough free workers; the line is bounded', async () => {
    const held = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', selector: { count: 4 } })).body;
    const waiters = Array.from({ length: 8 }, () =>
      fx.call('POST', '/v1/jobs?wait=30', { impl: 'openmpi', selector: { count: 2 } }),
    );
    await new Promise((r) => setTimeout(r, 300));
    expect(fx.rm.waitingJobs).toBe(8);
    const over = await fx.call('POST', '/v1/jobs?wait=30', { impl: 'openmpi', selector: { count: 2 } });
    expect(over.status).toBe(429);
    expect(over.body.message).toMatch(/8 job requests are waiting/);
    await fx.call('DELETE', `/v1/jobs/${held.id}`);
    // Two start at once on the four workers; each, once deleted, lets the next ones in.
    const done = await Promise.all(
      waiters.map(async (w) => {
        const r = await w;
        expect(r.status, JSON.stringify(r.body)).toBe(201);
        await fx.call('DELETE', `/v1/jobs/${r.body.id}`);
        return r.body.id;
      }),
    );
    expect(new Set(done).size).toBe(8);
  });

  it('a request that asks is told (102) once it waits in line; its connection closing withdraws it', async () => {
    const held = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a', 'b'] })).body;
    const body = JSON.stringify({ impl: 'openmpi', members: ['a'] });
    const req = httpRequest(`${fx.url}/v1/jobs?wait=20`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${TOKEN}`,
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(body),
        'x-dask-pmix-queued': 'notify',
      },
    });
    req.on('error', () => {}); // destroyed below
    const interim = new Promise<number>((resolve) => req.on('information', (info) => resolve(info.statusCode)));
    req.end(body);
    expect(await interim).toBe(102);
    expect(fx.rm.waitingJobs).toBe(1);
    req.destroy();
    for (let i = 0; i < 50 && fx.rm.waitingJobs > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(fx.rm.waitingJobs).toBe(0);
    // Withdrawn, it never takes the worker once it is freed: the next request gets it at once.
    expect((await fx.call('DELETE', `/v1/jobs/${held.id}`)).status).toBe(200);
    const next = await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a'] });
    expect(next.status, JSON.stringify(next.body)).toBe(201);
    await fx.call('DELETE', `/v1/jobs/${next.body.id}`);
    // Without the header, no interim answer: the request's only answer is its job.
    const plain = await fx.call('POST', '/v1/jobs?wait=5', { impl: 'openmpi', members: ['a'] });
    expect(plain.status).toBe(201);
    await fx.call('DELETE', `/v1/jobs/${plain.body.id}`);
  });

  it('many clients at once over few workers all get their jobs', async () => {
    let ok = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        for (let i = 0; i < 10; i++) {
          const r = await fx.call('POST', '/v1/jobs?wait=30', { impl: 'openmpi', selector: { count: 2 } });
          expect(r.status, JSON.stringify(r.body)).toBe(201);
          ok++;
          await fx.call('DELETE', `/v1/jobs/${r.body.id}`);
        }
      }),
    );
    expect(ok).toBe(40);
  });

  it('a selector short of a worker removed with returning=true waits for it to register again', async () => {
    expect((await fx.call('DELETE', '/v1/workers/d?returning=true&reason=its%20process%20died')).status).toBe(200);
    // Without wait, at once, saying why; with wait, it starts once a worker registers.
    const now = await fx.call('POST', '/v1/jobs', { impl: 'openmpi', selector: { count: 4 } });
    expect(now.status).toBe(422);
    expect(now.body.message).toMatch(/1 worker that left the cluster is expected back/);
    const waiting = fx.call('POST', '/v1/jobs?wait=20', { impl: 'openmpi', selector: { count: 4 } });
    await new Promise((r) => setTimeout(r, 300));
    expect(fx.rm.waitingJobs).toBe(1);
    expect((await fx.call('POST', '/v1/workers', worker('d2'))).status).toBe(201);
    const r = await waiting;
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body.members.map((m: any) => m.workerId).sort()).toEqual(['a', 'b', 'c', 'd2']);
    await fx.call('DELETE', `/v1/jobs/${r.body.id}`);
    // Removed without it (retired): no waiting.
    expect((await fx.call('DELETE', '/v1/workers/d2')).status).toBe(200);
    const never = await fx.call('POST', '/v1/jobs?wait=20', { impl: 'openmpi', selector: { count: 4 } });
    expect(never.status).toBe(422);
    expect(never.body.message).toBe('the selector needs 4 available workers, but only 3 match');
  });
});
