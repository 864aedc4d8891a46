// The REST contract over real HTTP: every route's success shape and every error it promises
// (400 schema, 401 auth, 404 unknown id, 409 conflict, 422 unresolvable, 503 stopping), and that a
// failed request changes nothing.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiFixture, apiFixture, TOKEN, worker } from './fixture.js';

let fx: ApiFixture;
beforeAll(async () => {
  fx = await apiFixture();
});
afterAll(() => fx.close());

const w = (id: string, host = 'h1', extra: Record<string, unknown> = {}) => worker(id, host, extra);
const enc = encodeURIComponent;

function expectError(r: { status: number; body: any }, status: number, message?: RegExp) {
  expect(r.status, JSON.stringify(r.body)).toBe(status);
  expect(r.body).toMatchObject({ statusCode: status, error: expect.any(String), message: expect.any(String) });
  if (message) expect(r.body.message).toMatch(message);
}

describe('health, docs and metrics', () => {
  it('GET /v1/health', async () => {
    const r = await fx.anon('GET', '/v1/health');
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'ok', version: 'test', pmixVersion: '5.0.11', impls: ['openmpi', 'mpich'] });
    expect(r.body.uptimeSeconds).toBeGreaterThanOrEqual(0);
  });

  it('serves the OpenAPI document and the docs page', async () => {
    const r = await fx.anon('GET', '/openapi.json');
    expect(r.status).toBe(200);
    expect(r.body.openapi).toMatch(/^3\./);
    for (const p of [
      '/v1/workers',
      '/v1/workers/{id}',
      '/v1/psets',
      '/v1/psets/{name}',
      '/v1/jobs',
      '/v1/jobs/{id}',
      '/v1/jobs/{id}/env/{workerId}',
      '/v1/events',
      '/v1/health',
    ]) {
      expect(Object.keys(r.body.paths)).toContain(p);
    }
    expect(r.body.paths['/v1/jobs'].post.security).toEqual([{ bearer: [] }]);
    expect(r.body.paths['/v1/jobs'].get.security).toEqual([{ bearer: [] }]);
    expect(r.body.paths['/v1/health'].get.security).toBeUndefined();
    expect(r.body.paths['/v1/jobs'].post.requestBody.content['application/json'].schema.properties.impl.enum).toEqual([
      'openmpi',
      'mpich',
      'intelmpi',
    ]);
    const docs = await fetch(`${fx.url}/docs`);
    expect(docs.status).toBe(200);
    expect(await docs.text()).toMatch(/swagger/i);
  });

  it('GET /metrics in the Prometheus text format', async () => {
    await fx.call('GET', '/v1/workers');
    const res = await fetch(`${fx.url}/metrics`);
    expect(res.headers.get('content-type')).toMatch(/text\/plain/);
    const text = await res.text();
    expect(text).toMatch(/^# TYPE dask_pmix_jobs gauge$/m);
    expect(text).toMatch(/^dask_pmix_jobs\{state="running"\} \d+$/m);
    expect(text).toMatch(/^dask_pmix_http_requests_total\{method="GET",route="\/v1\/workers",code="200"\} [1-9]/m);
  });

  it('answers unknown routes with the error shape', async () => {
    expectError(await fx.anon('GET', '/v1/nope'), 404, /no route/);
  });
});

describe('workers', () => {
  it('POST registers, GET lists and gets, DELETE removes', async () => {
    const r = await fx.call(
      'POST',
      '/v1/workers',
      w('tcp://10.0.0.1:1', 'h1', { pid: 42, uid: 1000, gid: 1000, resources: { GPU: 1 }, tags: ['a'] }),
    );
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      id: 'tcp://10.0.0.1:1',
      address: 'tcp://10.0.0.1:1',
      host: 'h1',
      pid: 42,
      uid: 1000,
      gid: 1000,
      state: 'available',
      jobId: '',
      resources: { GPU: 1 },
      tags: ['a'],
    });
    expect(r.body.registeredAt).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect((await fx.call('GET', '/v1/workers')).body.workers.map((x: any) => x.id)).toContain('tcp://10.0.0.1:1');
    expect((await fx.call('GET', `/v1/workers/${enc('tcp://10.0.0.1:1')}`)).body.host).toBe('h1');
    const d = await fx.call('DELETE', `/v1/workers/${enc('tcp://10.0.0.1:1')}?reason=retired`);
    expect(d.status).toBe(200);
    expect(d.body.state).toBe('gone');
    expectError(await fx.call('GET', `/v1/workers/${enc('tcp://10.0.0.1:1')}`), 404);
  });

  it('400 on schema violations, 401 without the token, 404 on unknown ids, 409 on duplicates', async () => {
    expectError(await fx.call('POST', '/v1/workers', { ...w('x'), host: undefined }), 400, /host/);
    expectError(await fx.call('POST', '/v1/workers', w('')), 400);
    expectError(await fx.call('POST', '/v1/workers', w('x', 'h', { bogus: 1 })), 400, /additional/);
    expectError(await fx.call('POST', '/v1/workers', w('x', 'h', { pid: 'many' })), 400);
    expectError(await fx.call('POST', '/v1/workers', w('x', 'h', { uid: -1 })), 400);
    // The process its ranks run as is part of a registration: PMIx admits only that user.
    for (const missing of ['pid', 'uid', 'gid']) {
      expectError(await fx.call('POST', '/v1/workers', { ...w('x'), [missing]: undefined }), 400, new RegExp(missing));
    }
    expectError(await fx.call('POST', '/v1/workers', '{not json'), 400);
    expectError(await fx.call('POST', '/v1/workers'), 400);
    expectError(await fx.anon('POST', '/v1/workers', w('x')), 401, /Bearer/);
    expectError(await fx.anon('POST', '/v1/workers', w('x'), { authorization: 'Bearer wrong' }), 401, /not valid/);
    expectError(await fx.anon('DELETE', '/v1/workers/x'), 401);
    expectError(await fx.call('DELETE', '/v1/workers/nope'), 404);
    expect((await fx.call('POST', '/v1/workers', w('dup'))).status).toBe(201);
    expectError(await fx.call('POST', '/v1/workers', w('dup', 'h2')), 409, /already registered/);
    expect((await fx.call('GET', '/v1/workers/dup')).body.host).toBe('h1');
    expect((await fx.call('GET', '/v1/workers')).body.workers.map((x: any) => x.id)).not.toContain('x');
  });
});

describe('input that would corrupt state', () => {
  it('refuses a host that PMIx node lists or PMI maps cannot carry', async () => {
    for (const host of ['a,b', 'a b', 'h;1', 'x=y', '']) {
      expectError(await fx.call('POST', '/v1/workers', w('comma', host)), 400, /host/);
    }
    expectError(await fx.call('GET', '/v1/workers/comma'), 404);
    for (const host of ['node-1.example.org', '10.0.0.7', 'fe80::1%eth0', 'Host_2']) {
      const r = await fx.call('POST', '/v1/workers', w(`ok-${host}`, host));
      expect(r.status, JSON.stringify(r.body)).toBe(201);
      await fx.call('DELETE', `/v1/workers/${enc(`ok-${host}`)}`);
    }
  });

  it('refuses ids that are not valid UTF-8 instead of turning them into U+FFFD', async () => {
    const raw = (bytes: Buffer) =>
      fetch(`${fx.url}/v1/workers`, {
        method: 'POST',
        body: new Uint8Array(bytes),
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      }).then(async (r) => ({ status: r.status, body: await r.json() }));
    const json = (id: string) => Buffer.from(JSON.stringify(w(id)).replace('"ID"', id));
    // 0xff, and 0xc3 0x28 (a lead byte without its continuation), where the id would be.
    for (const bad of [Buffer.from([0xff]), Buffer.from([0xc3, 0x28])]) {
      const body = Buffer.concat([json('"ID"').subarray(0, 7), bad, json('"ID"').subarray(9)]);
      expectError(await raw(body), 400, /UTF-8/);
    }
    // A lone surrogate escape cannot be stored or sent as UTF-8 either.
    expectError(await raw(Buffer.from(JSON.stringify(w('ID')).replace('"ID"', '"x\\ud800"'))), 400, /surrogate/);
    // A well-formed pair is fine.
    expect((await raw(Buffer.from(JSON.stringify(w('ID')).replace('"ID"', '"x\\ud83d\\ude00"')))).status).toBe(201);
    expect((await fx.call('GET', `/v1/workers/${enc('x😀')}`)).status).toBe(200);
    expectError(await fx.call('GET', '/v1/workers/%FF'), 400);
    await fx.call('DELETE', `/v1/workers/${enc('x😀')}`);
  });

  it('accepts a DELETE with Content-Type: application/json and no body', async () => {
    await fx.call('POST', '/v1/workers', w('del-json'));
    const r = await fetch(`${fx.url}/v1/workers/del-json`, {
      method: 'DELETE',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
    });
    expect(r.status, await r.clone().text()).toBe(200);
    expect((await r.json()).state).toBe('gone');
  });
});

describe('process sets', () => {
  beforeAll(async () => {
    for (const id of ['p1', 'p2', 'p3'])
      await fx.call('POST', '/v1/workers', w(id, id === 'p3' ? 'h2' : 'h1', { tags: ['pset'] }));
  });

  it('POST defines, GET lists and gets, PUT redefines, DELETE deletes', async () => {
    const r = await fx.call('POST', '/v1/psets', { name: 'ps', members: ['p2', 'p1'] });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ name: 'ps', members: ['p2', 'p1'], jobId: '' });
    const s = await fx.call('POST', '/v1/psets', {
      name: 'sel',
      selector: { count: 2, placement: 'spread', tags: ['pset'] },
    });
    expect(s.status).toBe(201);
    expect(s.body).toMatchObject({
      members: ['p1', 'p3'],
      selector: { count: 2, placement: 'spread', tags: ['pset'] },
    });
    expect((await fx.call('GET', '/v1/psets')).body.psets.map((p: any) => p.name)).toEqual(['ps', 'sel']);
    expect((await fx.call('GET', '/v1/psets/ps')).body.members).toEqual(['p2', 'p1']);
    const u = await fx.call('PUT', '/v1/psets/ps', { members: ['p3'] });
    expect(u.status).toBe(200);
    expect(u.body.members).toEqual(['p3']);
    expect((await fx.call('DELETE', '/v1/psets/sel')).status).toBe(200);
    expectError(await fx.call('GET', '/v1/psets/sel'), 404);
  });

  it('4xx: bad bodies, unknown names and members, unmet selectors, psets in use', async () => {
    expectError(await fx.call('POST', '/v1/psets', { name: 'x' }), 400, /exactly one/);
    expectError(
      await fx.call('POST', '/v1/psets', { name: 'x', members: ['p1'], selector: { count: 1 } }),
      400,
      /exactly one/,
    );
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', members: [] }), 400);
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', members: ['p1', 'p1'] }), 400);
    expectError(await fx.call('POST', '/v1/psets', { name: 'mpi://WORLD', members: ['p1'] }), 400, /reserved/);
    expectError(await fx.call('POST', '/v1/psets', { name: 'bad name', members: ['p1'] }), 400);
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', selector: { count: 0 } }), 400);
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', selector: { count: 1, placement: 'diagonal' } }), 400);
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', members: ['ghost'] }), 422, /ghost/);
    expectError(await fx.call('POST', '/v1/psets', { name: 'x', selector: { count: 9 } }), 422, /needs 9/);
    expectError(await fx.anon('POST', '/v1/psets', { name: 'x', members: ['p1'] }), 401);
    expectError(await fx.call('POST', '/v1/psets', { name: 'ps', members: ['p1'] }), 409, /already exists/);
    expectError(await fx.call('PUT', '/v1/psets/none', { members: ['p1'] }), 404);
    expectError(await fx.call('PUT', '/v1/psets/ps', { name: 'other', members: ['p1'] }), 400, /path names/);
    expectError(await fx.call('PUT', '/v1/psets/ps', { members: ['ghost'] }), 422);
    expectError(await fx.anon('PUT', '/v1/psets/ps', { members: ['p1'] }), 401);
    expectError(await fx.call('DELETE', '/v1/psets/none'), 404);
    expectError(await fx.anon('DELETE', '/v1/psets/ps'), 401);
    const job = await fx.call('POST', '/v1/jobs', { impl: 'openmpi', pset: 'ps' });
    expect(job.status).toBe(201);
    expect((await fx.call('GET', '/v1/psets/ps')).body.jobId).toBe(job.body.id);
    expectError(await fx.call('PUT', '/v1/psets/ps', { members: ['p1'] }), 409, /used by active job/);
    expectError(await fx.call('DELETE', '/v1/psets/ps'), 409, /used by active job/);
    expect((await fx.call('DELETE', `/v1/jobs/${job.body.id}`)).status).toBe(200);
    expect((await fx.call('DELETE', '/v1/psets/ps')).status).toBe(200);
    expect((await fx.call('GET', '/v1/psets')).body.psets).toEqual([]);
  });
});

describe('jobs', () => {
  beforeAll(async () => {
    for (const id of ['j1', 'j2', 'j3', 'j4']) await fx.call('POST', '/v1/workers', w(id, id < 'j3' ? 'ha' : 'hb'));
  });

  it('POST creates from members, GET lists and gets, env per member, DELETE aborts and forgets', async () => {
    const r = await fx.call('POST', '/v1/jobs', {
      impl: 'openmpi',
      members: ['j2', 'j3'],
      owner: 'client-1',
      labels: { app: 'x' },
      wiringTimeoutSeconds: 30,
    });
    expect(r.status).toBe(201);
    const job = r.body;
    expect(job).toMatchObject({
      impl: 'openmpi',
      mode: 'fork',
      state: 'pending',
      owner: 'client-1',
      labels: { app: 'x' },
      wiringTimeoutSeconds: 30,
      timeoutSeconds: 0,
      error: '',
      members: [
        { workerId: 'j2', rank: 0, host: 'ha', localRank: 0, nodeRank: 0, nodeId: 0, state: 'assigned' },
        { workerId: 'j3', rank: 1, host: 'hb', localRank: 0, nodeRank: 0, nodeId: 1, state: 'assigned' },
      ],
    });
    expect(job.namespace).toContain(job.id);
    expect((await fx.call('GET', '/v1/workers/j2')).body).toMatchObject({ state: 'frozen', jobId: job.id });
    expect((await fx.call('GET', '/v1/jobs')).body.jobs.map((j: any) => j.id)).toContain(job.id);
    expect((await fx.call('GET', '/v1/jobs?state=pending')).body.jobs.map((j: any) => j.id)).toEqual([job.id]);
    expect((await fx.call('GET', '/v1/jobs?state=running')).body.jobs).toEqual([]);
    expect((await fx.call('GET', `/v1/jobs/${job.id}`)).body.id).toBe(job.id);
    const env = await fx.call('GET', `/v1/jobs/${job.id}/env/j3`);
    expect(env.status).toBe(200);
    expect(env.body).toEqual({
      jobId: job.id,
      workerId: 'j3',
      rank: 1,
      size: 2,
      impl: 'openmpi',
      env: { NS: job.namespace, RANK: '1' },
    });
    const d = await fx.call('DELETE', `/v1/jobs/${job.id}`);
    expect(d.status).toBe(200);
    expect(d.body).toMatchObject({ state: 'aborted', error: 'deleted over REST' });
    expect(d.body.releasedAt).not.toBe('');
    expectError(await fx.call('GET', `/v1/jobs/${job.id}`), 404);
    expect((await fx.call('GET', '/v1/workers/j2')).body.state).toBe('available');
  });

  it('ends a job with the reason its deleter gives, and refuses a reason that is empty or too long', async () => {
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1', 'j4'] })).body;
    expectError(await fx.call('DELETE', `/v1/jobs/${job.id}?reason=`), 400);
    expectError(await fx.call('DELETE', `/v1/jobs/${job.id}?reason=${'x'.repeat(501)}`), 400);
    expect((await fx.call('GET', `/v1/jobs/${job.id}`)).body.state).toBe('pending');
    const why = 'the cluster was restarted (client.restart()) while the job ran';
    const d = await fx.call('DELETE', `/v1/jobs/${job.id}?reason=${encodeURIComponent(why)}`);
    expect(d.status).toBe(200);
    expect(d.body).toMatchObject({ state: 'aborted', error: why });
    expect((await fx.call('GET', '/v1/workers/j4')).body.state).toBe('available');
  });

  it('creates from a selector and honours placement', async () => {
    const r = await fx.call('POST', '/v1/jobs', {
      impl: 'mpich',
      selector: { count: 2, placement: 'spread', hosts: ['ha', 'hb'] },
    });
    expect(r.status).toBe(201);
    expect(r.body.members.map((m: any) => m.host)).toEqual(['ha', 'hb']);
    await fx.call('DELETE', `/v1/jobs/${r.body.id}`);
  });

  it('reports a member lost: the job fails, env is refused', async () => {
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1', 'j4'] })).body;
    const r = await fx.call('POST', `/v1/jobs/${job.id}/members/j4/lost`, { reason: 'child killed by SIGKILL' });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ state: 'failed', error: 'rank 1 (worker j4) was lost: child killed by SIGKILL' });
    expectError(await fx.call('GET', `/v1/jobs/${job.id}/env/j1`), 409, /failed/);
    expectError(await fx.call('POST', `/v1/jobs/${job.id}/members/nope/lost`, {}), 404);
    expectError(await fx.call('POST', '/v1/jobs/nope/members/j1/lost', {}), 404);
    expectError(await fx.anon('POST', `/v1/jobs/${job.id}/members/j1/lost`, {}), 401);
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
  });

  it('POST /jobs/:id/reused: only an in-process job that runs on a kept communicator', async () => {
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'] })).body;
    expectError(await fx.call('POST', `/v1/jobs/${job.id}/reused?from=j-0`), 409, /not in-process/);
    expectError(await fx.call('POST', `/v1/jobs/${job.id}/reused?from=`), 400);
    expectError(await fx.call('POST', `/v1/jobs/${job.id}/reused?other=1`), 400);
    expectError(await fx.call('POST', '/v1/jobs/nope/reused?from=j-0'), 404);
    expectError(await fx.anon('POST', `/v1/jobs/${job.id}/reused?from=j-0`), 401);
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
  });

  it('4xx: schema, auth, unknown ids, conflicts, unresolvable requests; nothing changes', async () => {
    const before = JSON.stringify((await fx.call('GET', '/v1/workers')).body);
    expectError(await fx.call('POST', '/v1/jobs', { members: ['j1'] }), 400, /impl/);
    expectError(
      await fx.call('POST', '/v1/jobs', { impl: 'lam', members: ['j1'] }),
      400,
      /invalid request: body\/impl must be equal to one of the allowed values: "openmpi", "mpich", "intelmpi"$/,
    );
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'IMPL_UNSPECIFIED', members: ['j1'] }), 400);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi' }), 400, /exactly one/);
    expectError(
      await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'], selector: { count: 1 } }),
      400,
      /exactly one/,
    );
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'], timeoutSeconds: -1 }), 400);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'], mode: 'teleport' }), 400);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'], extra: true }), 400);
    expectError(await fx.anon('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'] }), 401);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['ghost'] }), 422, /ghost/);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', pset: 'ghost' }), 422, /no pset/);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', selector: { count: 99 } }), 422);
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'intelmpi', members: ['j1'] }), 422, /cannot serve intelmpi/);
    const held = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j1'] })).body;
    expectError(await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['j2', 'j1'] }), 409, /already in job/);
    expectError(await fx.call('GET', '/v1/jobs/nope'), 404);
    expectError(await fx.call('DELETE', '/v1/jobs/nope'), 404);
    expectError(await fx.anon('DELETE', `/v1/jobs/${held.id}`), 401);
    expectError(await fx.call('GET', '/v1/jobs/nope/env/j1'), 404);
    expectError(await fx.call('GET', `/v1/jobs/${held.id}/env/j2`), 404, /not a member/);
    expectError(await fx.anon('GET', `/v1/jobs/${held.id}/env/j1`), 401);
    expectError(await fx.call('GET', '/v1/jobs?state=bogus'), 400);
    await fx.call('DELETE', `/v1/jobs/${held.id}`);
    expect(JSON.stringify((await fx.call('GET', '/v1/workers')).body)).toBe(before);
    expect(
      (await fx.call('GET', '/v1/jobs')).body.jobs.filter((j: any) =>
        ['pending', 'wiring', 'running'].includes(j.state),
      ),
    ).toEqual([]);
  });
});

describe('elastic jobs', () => {
  const labels = (g: number, change = '') => ({
    'dask-pmix.elastic': 'e-1',
    'dask-pmix.generation': String(g),
    ...(change ? { 'dask-pmix.change': change } : {}),
  });

  it('shows generations as jobs labelled with the elastic id, and drains as the scheduler records them', async () => {
    for (const id of ['e1', 'e2', 'e3']) await fx.call('POST', '/v1/workers', w(id, 'he'));
    expectError(await fx.call('GET', '/v1/elastic/e-1'), 404, /no elastic job 'e-1'/);
    const g0 = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['e1', 'e2'], labels: labels(0) })).body;
    const seen: any[] = [];
    const off = fx.rm.events.subscribe((e) => {
      if (e.event.kind === 'drainChanged') seen.push(e.event);
    });
    const asked = await fx.call('PUT', `/v1/elastic/e-1/drains/e2`, { state: 'requested', reason: 'retired by Dask' });
    expect(asked.status).toBe(200);
    expect(asked.body).toMatchObject({ workerId: 'e2', state: 'requested', reason: 'retired by Dask', resolvedAt: '' });
    // Asked again while open: the same request.
    await fx.call('PUT', `/v1/elastic/e-1/drains/e2`, { state: 'requested', reason: 'retired by Dask' });
    await fx.call('DELETE', `/v1/jobs/${g0.id}?reason=generation%20ends`);
    const g1 = (
      await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['e1', 'e3'], labels: labels(1, '-e2; +e3') })
    ).body;
    const done = await fx.call('PUT', `/v1/elastic/e-1/drains/e2`, { state: 'honoured', generation: 1 });
    expect(done.body).toMatchObject({ workerId: 'e2', state: 'honoured', generation: 1 });
    expect(done.body.resolvedAt).not.toBe('');
    off();
    expect(seen.map((e) => [e.elasticId, e.drain.state])).toEqual([
      ['e-1', 'requested'],
      ['e-1', 'honoured'],
    ]);
    // g0 was deleted (forgotten), so the view starts at g1.
    const view = (await fx.call('GET', '/v1/elastic/e-1')).body;
    expect(view).toMatchObject({
      id: 'e-1',
      state: 'pending',
      generations: [{ generation: 1, jobId: g1.id, workers: ['e1', 'e3'], change: '-e2; +e3', state: 'pending' }],
      drains: [{ workerId: 'e2', state: 'honoured', generation: 1, reason: 'retired by Dask' }],
    });
    expect(view.drains).toHaveLength(1);
    const list = (await fx.call('GET', '/v1/elastic')).body.elasticJobs;
    expect(list.map((e: any) => e.id)).toEqual(['e-1']);
    await fx.call('DELETE', `/v1/jobs/${g1.id}`);
  });

  it('refuses a drain that ends without being open, an unknown state and a stranger', async () => {
    expectError(await fx.call('PUT', `/v1/elastic/e-2/drains/x`, { state: 'lapsed' }), 409, /no drain request open/);
    expectError(await fx.call('PUT', `/v1/elastic/e-2/drains/x`, { state: 'sleeping' }), 400);
    expectError(await fx.call('PUT', `/v1/elastic/e-2/drains/x`, { reason: 'no state' }), 400, /state/);
    expectError(await fx.call('PUT', `/v1/elastic/e-2/drains/x`, { state: 'requested', bogus: 1 }), 400);
    expectError(await fx.anon('PUT', `/v1/elastic/e-2/drains/x`, { state: 'requested' }), 401);
    expectError(await fx.anon('GET', '/v1/elastic'), 401);
    expect((await fx.call('GET', '/v1/elastic')).body.elasticJobs.map((e: any) => e.id)).not.toContain('e-2');
  });

  it('keeps a bounded number of drains per elastic job', async () => {
    for (let i = 0; i < 70; i++) {
      await fx.call('PUT', `/v1/elastic/e-3/drains/w${i}`, { state: 'requested', reason: 'Adaptive scaling down' });
      await fx.call('PUT', `/v1/elastic/e-3/drains/w${i}`, { state: 'lapsed' });
    }
    const drains = (await fx.call('GET', '/v1/elastic/e-3')).body.drains;
    expect(drains).toHaveLength(64);
    expect(drains[0].workerId).toBe('w6');
    expect(drains.every((d: any) => d.state === 'lapsed')).toBe(true);
  });
});

describe('authentication', () => {
  it('an outsider without the token can neither register a worker, read an env, nor read jobs, workers, psets or events', async () => {
    await fx.call('POST', '/v1/workers', w('auth1'));
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['auth1'] })).body;
    const attempts: Record<string, string>[] = [
      {},
      { authorization: 'Bearer wrong-token!' },
      { authorization: `Basic ${Buffer.from(`x:${TOKEN}`).toString('base64')}` },
    ];
    for (const headers of attempts) {
      expectError(await fx.anon('POST', '/v1/workers', w('intruder'), headers), 401);
      expectError(await fx.anon('GET', `/v1/jobs/${job.id}/env/auth1`, undefined, headers), 401);
      for (const path of [
        '/v1/jobs',
        `/v1/jobs/${job.id}`,
        '/v1/workers',
        '/v1/workers/auth1',
        '/v1/psets',
        '/v1/events',
      ]) {
        expectError(await fx.anon('GET', path, undefined, headers), 401);
      }
    }
    expectError(await fx.call('GET', '/v1/workers/intruder'), 404);
    expect((await fx.call('GET', `/v1/jobs/${job.id}/env/auth1`)).status).toBe(200);
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
  });

  it('refuses an outsider before reading its body', async () => {
    const big = JSON.stringify(w('big', 'h1', { tags: Array.from({ length: 100_000 }, (_, i) => `t${i}`) }));
    expectError(await fx.anon('POST', '/v1/workers', big), 401);
  });

  it('with open reads, reads need no token; writes and member environments still do', async () => {
    const open = await apiFixture({ openReads: true });
    try {
      await open.call('POST', '/v1/workers', w('o1'));
      const job = (await open.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['o1'] })).body;
      expect((await open.anon('GET', '/v1/workers')).status).toBe(200);
      expect((await open.anon('GET', `/v1/jobs/${job.id}`)).status).toBe(200);
      expectError(await open.anon('GET', `/v1/jobs/${job.id}/env/o1`), 401);
      expectError(await open.anon('POST', '/v1/workers', w('o2')), 401);
    } finally {
      await open.close();
    }
  });
});

describe('admission and shutdown', () => {
  it('409 at the cap of active jobs; 503 once stopping', async () => {
    const small = await apiFixture({ maxActiveJobs: 1, token: '' });
    try {
      for (const id of ['a', 'b']) await small.call('POST', '/v1/workers', w(id));
      expect((await small.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a'] })).status).toBe(201);
      expectError(await small.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['b'] }), 409, /at most 1/);
      await small.rm.shutdown('SIGTERM');
      expectError(await small.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['b'] }), 503, /stopping/);
      expect((await small.call('GET', '/v1/health')).body.status).toBe('stopping');
    } finally {
      await small.close();
    }
  });
});
