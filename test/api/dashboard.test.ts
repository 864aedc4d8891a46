// GET /v1/dashboard shows the page what it needs and nothing that lets a reader join a job or
// pose as a worker; PUT /v1/traffic records the workers' comm bytes; a fork job's
// namespace is a credential, so readers without the token never see it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { attemptOf, redact } from '../../src/api/routes/dashboard.js';
import { type ApiFixture, apiFixture, worker } from './fixture.js';

let fx: ApiFixture;
beforeAll(async () => {
  fx = await apiFixture();
});
afterAll(() => fx.close());

const traffic = (tcp: number, mpi: number) => ({
  tcp: { bytesSent: tcp, bytesReceived: tcp },
  mpi: { bytesSent: mpi, bytesReceived: mpi },
});
const report = (...workers: [string, number, number][]) => ({
  workers: workers.map(([id, tcp, mpi]) => ({ id, ...traffic(tcp, mpi) })),
});

describe('GET /v1/dashboard', () => {
  it('shows workers, psets and jobs with their members, without namespaces, pids, uids or tags', async () => {
    await fx.call('POST', '/v1/workers', worker('d1', 'h1', { tags: ['secret-tag'] }));
    await fx.call('POST', '/v1/workers', worker('d2', 'h2'));
    await fx.call('POST', '/v1/psets', { name: 'dp', members: ['d1', 'd2'] });
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', pset: 'dp' })).body;
    const r = await fx.call('GET', '/v1/dashboard');
    expect(r.status).toBe(200);
    const text = JSON.stringify(r.body);
    expect(text).not.toContain(job.namespace);
    expect(text).not.toMatch(/"(pid|uid|gid|tags|namespace|tag)"/);
    expect(text).not.toContain('secret-tag');
    expect(r.body).toMatchObject({ version: 'test', pmixVersion: '5.0.11', status: 'ok', epochs: [] });
    const d1 = r.body.workers.find((w: { id: string }) => w.id === 'd1');
    expect(d1).toEqual({ id: 'd1', host: 'h1', state: 'frozen', jobId: job.id });
    expect(r.body.psets).toContainEqual({ name: 'dp', members: ['d1', 'd2'] });
    const shown = r.body.jobs.find((j: { id: string }) => j.id === job.id);
    expect(shown).toMatchObject({ id: job.id, impl: 'openmpi', mode: 'fork', pset: 'dp', createdAt: job.createdAt });
    expect(shown.members.map((m: { rank: number; workerId: string }) => [m.rank, m.workerId])).toEqual([
      [0, 'd1'],
      [1, 'd2'],
    ]);
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
  });

  it("names the attempt of a job that run_mpi's retries labelled, and only of such a job", async () => {
    await fx.call('POST', '/v1/workers', worker('a1', 'h1'));
    await fx.call('POST', '/v1/workers', worker('a2', 'h2'));
    const labels = { 'dask-pmix.family': 'r0123456789ab', 'dask-pmix.attempt': '2', 'dask-pmix.attempts': '3' };
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a1'], labels })).body;
    const plain = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['a2'] })).body;
    const jobs = (await fx.call('GET', '/v1/dashboard')).body.jobs;
    expect(jobs.find((j: { id: string }) => j.id === job.id).attempt).toEqual({
      family: 'r0123456789ab',
      number: 2,
      of: 3,
    });
    expect(jobs.find((j: { id: string }) => j.id === plain.id)).not.toHaveProperty('attempt');
    expect(attemptOf({ 'dask-pmix.family': 'f', 'dask-pmix.attempt': 'x' })).toBeUndefined();
    expect(attemptOf({ 'dask-pmix.attempt': '1' })).toBeUndefined();
    expect(attemptOf({ 'dask-pmix.family': 'f', 'dask-pmix.attempt': '1' })).toEqual({ family: 'f', number: 1 });
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
    await fx.call('DELETE', `/v1/jobs/${plain.id}`);
  });

  it('wants the token as the other reads do', async () => {
    expect((await fx.anon('GET', '/v1/dashboard')).status).toBe(401);
  });

  it('takes free text apart from namespaces and pids', () => {
    expect(redact('rank 1 of dask-pmix.j00ab-3.0123456789abcdef0123456789abcdef (pid 4242) was lost')).toBe(
      'rank 1 of <namespace> (pid) was lost',
    );
    expect(redact('this worker is in pool dask-pmix.pool-ab12.1')).toBe('this worker is in pool <namespace>');
  });
});

describe('PUT /v1/traffic', () => {
  it("records registered workers' bytes per transport, shown by the dashboard until the worker goes", async () => {
    await fx.call('POST', '/v1/workers', worker('t1'));
    const r = await fx.call('PUT', '/v1/traffic', report(['t1', 10, 4096], ['nobody', 1, 1]));
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toEqual({ accepted: 1 });
    let dash = (await fx.call('GET', '/v1/dashboard')).body;
    const w = dash.workers.find((x: { id: string }) => x.id === 't1');
    expect(w.traffic).toMatchObject(traffic(10, 4096));
    expect(Date.parse(w.traffic.at)).toBeGreaterThan(0);
    expect(JSON.stringify(dash)).not.toContain('nobody');
    await fx.call('DELETE', '/v1/workers/t1');
    await fx.call('POST', '/v1/workers', worker('t1'));
    dash = (await fx.call('GET', '/v1/dashboard')).body;
    expect(dash.workers.find((x: { id: string }) => x.id === 't1').traffic).toBeUndefined();
  });

  it('keeps single copies apart, and shows none for a plugin that does not report them', async () => {
    await fx.call('POST', '/v1/workers', worker('c1'));
    await fx.call('POST', '/v1/workers', worker('c2'));
    const copied = { id: 'c1', ...traffic(5, 0), cma: { bytesSent: 0, bytesReceived: 64 << 20 } };
    const r = await fx.call('PUT', '/v1/traffic', { workers: [copied, { id: 'c2', ...traffic(7, 0) }] });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const dash = (await fx.call('GET', '/v1/dashboard')).body;
    const of = (id: string) => dash.workers.find((x: { id: string }) => x.id === id).traffic;
    expect(of('c1').cma).toEqual({ bytesSent: 0, bytesReceived: 64 << 20 });
    expect(of('c2').cma).toEqual({ bytesSent: 0, bytesReceived: 0 });
    const bad = { workers: [{ ...copied, cma: { bytesSent: 1 } }] };
    expect((await fx.call('PUT', '/v1/traffic', bad)).status).toBe(400);
  });

  it('refuses a malformed report and a caller without the token', async () => {
    const bad = {
      workers: [{ id: 'd1', tcp: { bytesSent: -1, bytesReceived: 0 }, mpi: { bytesSent: 0, bytesReceived: 0 } }],
    };
    expect((await fx.call('PUT', '/v1/traffic', bad)).status).toBe(400);
    expect((await fx.call('PUT', '/v1/traffic', { ...report(['d1', 1, 1]), extra: 1 })).status).toBe(400);
    expect((await fx.anon('PUT', '/v1/traffic', report(['d1', 1, 1]))).status).toBe(401);
  });
});

describe("a fork job's namespace is its ranks' credential", () => {
  it('carries 128 random bits, so a job id does not give it away', async () => {
    await fx.call('POST', '/v1/workers', worker('n1'));
    const a = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['n1'] })).body;
    expect(a.namespace).toMatch(new RegExp(`^dask-pmix\\.${a.id}\\.[0-9a-f]{32}$`));
    await fx.call('DELETE', `/v1/jobs/${a.id}`);
  });

  it('is left out for readers without the token when reads are open: jobs and the event stream', async () => {
    const open = await apiFixture({ openReads: true });
    try {
      await open.call('POST', '/v1/workers', worker('o1'));
      const job = (await open.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['o1'] })).body;
      expect(job.namespace).toMatch(/^dask-pmix\./);
      expect((await open.call('GET', `/v1/jobs/${job.id}`)).body.namespace).toBe(job.namespace);
      const anon = (await open.anon('GET', `/v1/jobs/${job.id}`)).body;
      expect(anon.id).toBe(job.id);
      expect(anon).not.toHaveProperty('namespace');
      expect(JSON.stringify((await open.anon('GET', '/v1/jobs')).body)).not.toContain(job.namespace);

      const read = async (token: boolean): Promise<string> => {
        const ac = new AbortController();
        const res = await fetch(`${open.url}/v1/events?since=0`, {
          headers: token ? { authorization: 'Bearer sekret-token' } : {},
          signal: ac.signal,
        });
        const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
        let text = '';
        while (!text.includes('jobStateChanged')) text += (await reader.read()).value ?? '';
        ac.abort();
        return text;
      };
      expect(await read(true)).toContain(job.namespace);
      const anonText = await read(false);
      expect(anonText).toContain(job.id);
      expect(anonText).not.toContain(job.namespace);
    } finally {
      await open.close();
    }
  });
});
