// The sidecar end to end: jobs created over REST, joined by real PMIx clients and Open MPI 5
// ranks started as separate processes with nothing but the environment the REST API handed out.
import { hostname } from 'node:os';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bin, pmiRank } from '../helpers/build-clients.js';
import { until } from '../helpers/http.js';
import { describeRanks, type RankProcess, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';
import { pmixClient } from './build.js';

const HOST = hostname();
let fx: SidecarFixture;
let nextWorker = 0;

beforeAll(async () => {
  // DASK_PMIX_TEST_LOG=<file> keeps the sidecar's debug log of the run.
  const logFile = process.env.DASK_PMIX_TEST_LOG;
  fx = await SidecarFixture.start('it', {
    releaseGraceMs: 3000,
    ...(logFile ? { logger: pino({ level: 'debug' }, pino.destination({ dest: logFile, sync: true })) } : {}),
  });
});
afterAll(() => fx?.stop());

/** Registers n fresh workers on this host and returns their ids. */
async function workers(n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = `tcp://127.0.0.1:${40000 + nextWorker++}`;
    const r = await fx.api('POST', '/v1/workers', {
      id,
      host: HOST,
      pid: process.pid,
      uid: process.getuid!(),
      gid: process.getgid!(),
    });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    ids.push(id);
  }
  return ids;
}

async function createJob(body: Record<string, unknown>) {
  const r = await fx.api('POST', '/v1/jobs', { impl: 'openmpi', ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body as { id: string; namespace: string; members: { workerId: string; rank: number }[] };
}

async function envs(job: { id: string; members: { workerId: string }[] }): Promise<Record<string, string>[]> {
  const out: Record<string, string>[] = [];
  for (const m of job.members) {
    const r = await fx.api('GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(m.workerId)}`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    out.push(r.body.env);
  }
  return out;
}

const jobState = async (id: string) => (await fx.api('GET', `/v1/jobs/${id}`)).body;
const waitState = (id: string, states: string[], ms = 20_000) =>
  until(
    async () => {
      const j = await jobState(id);
      return states.includes(j.state) ? j : undefined;
    },
    ms,
    `job ${id} to reach ${states.join('|')}`,
  );
const waitReleased = (id: string) =>
  until(
    async () => {
      const j = await jobState(id);
      return j.releasedAt ? j : undefined;
    },
    20_000,
    `job ${id} released`,
  );

const client = (env: Record<string, string>, ...args: string[]) => startRank(bin('pmix_client'), args, env, 30_000);

async function expectAllExit0(ranks: RankProcess[]) {
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual(ranks.map(() => 0));
}

describe('the sidecar with real PMIx clients', () => {
  it('hands out an environment with which clients connect, fence and finalize: the job completes', async () => {
    const ids = await workers(3);
    const job = await createJob({ members: ids });
    const e = await envs(job);
    expect(e[0]).toMatchObject({
      PMIX_NAMESPACE: job.namespace,
      PMIX_RANK: '0',
      PMIX_HOSTNAME: HOST,
      OMPI_MCA_btl: '^ofi',
    });
    expect((await fx.api('GET', `/v1/workers/${encodeURIComponent(ids[0]!)}`)).body).toMatchObject({
      state: 'frozen',
      jobId: job.id,
    });
    const ranks = e.map((env) => client(env, 'put-get'));
    await expectAllExit0(ranks);
    for (const [rank, r] of ranks.entries())
      expect(r.lines).toContainEqual({ rank, size: 3, peer: (rank + 1) % 3, got: `value-from-${(rank + 1) % 3}` });
    const done = await waitReleased(job.id);
    expect(done).toMatchObject({ state: 'completed', error: '' });
    expect(done.members.map((m: { state: string }) => m.state)).toEqual(['finalized', 'finalized', 'finalized']);
    expect(done.startedAt).not.toBe('');
    expect((await fx.api('GET', `/v1/workers/${encodeURIComponent(ids[0]!)}`)).body).toMatchObject({
      state: 'available',
      jobId: '',
    });
    // The namespace is torn down once the finalized clients have closed their connections.
    await until(() => fx.sidecar.pmixClients.count(job.namespace) === 0, 5000, 'the clients to let go');
  });

  it('answers pset queries with the psets defined over REST', async () => {
    const ids = await workers(2);
    expect((await fx.api('POST', '/v1/psets', { name: 'alpha', members: ids })).status).toBe(201);
    expect((await fx.api('POST', '/v1/psets', { name: 'beta', members: [ids[1]] })).status).toBe(201);
    const job = await createJob({ pset: 'alpha' });
    expect((await fx.api('DELETE', '/v1/psets/alpha')).status).toBe(409);
    const ranks = (await envs(job)).map((env) => client(env, 'query-psets'));
    await expectAllExit0(ranks);
    for (const r of ranks)
      expect(r.lines).toContainEqual(expect.objectContaining({ num_psets: 2, pset_names: 'alpha,beta' }));
    await waitReleased(job.id);
    expect((await fx.api('DELETE', '/v1/psets/alpha')).status).toBe(200);
    expect((await fx.api('DELETE', '/v1/psets/beta')).status).toBe(200);
  });

  it('publishes and looks up (with wait) through the name service', async () => {
    const job = await createJob({ members: await workers(3) });
    const ranks = (await envs(job)).map((env) => client(env, 'publish-lookup', 'svc-it'));
    await expectAllExit0(ranks);
    for (const r of ranks.slice(1))
      expect(r.lines).toContainEqual(expect.objectContaining({ looked_up: `port-of-${job.namespace}`, publisher: 0 }));
    await waitState(job.id, ['completed']);
  });

  it('constructs a group with a server-wide context id', async () => {
    const job = await createJob({ members: await workers(2) });
    const ranks = (await envs(job)).map((env) => client(env, 'group', 'grp-it'));
    await expectAllExit0(ranks);
    const cids = ranks.map((r) => r.lines.find((l) => 'context_id' in l)?.context_id);
    expect(cids[0]).toBe(cids[1]);
    expect(Number(cids[0])).toBeGreaterThan(0xffff0000);
  });

  it('fails a job whose member never connects at the wiring timeout', async () => {
    const job = await createJob({ members: await workers(2), wiringTimeoutSeconds: 1 });
    const [e0] = await envs(job);
    const r0 = client(e0!, 'hang');
    await r0.waitFor((l) => l.init === true);
    const t0 = Date.now();
    const failed = await waitState(job.id, ['failed'], 5000);
    expect(failed.error).toBe('wiring timeout: rank 1 did not connect within 1 s');
    expect(Date.now() - t0).toBeLessThan(2000);
    r0.kill();
    await waitReleased(job.id);
    // Its workers can serve the next job.
    const again = await createJob({ members: job.members.map((m) => m.workerId) });
    await fx.api('DELETE', `/v1/jobs/${again.id}`);
  });

  it('fails the job promptly when a member is killed, and frees the workers', async () => {
    const job = await createJob({ members: await workers(2) });
    const ranks = (await envs(job)).map((env) => client(env, 'hang'));
    await Promise.all(ranks.map((r) => r.waitFor((l) => l.init === true)));
    await waitState(job.id, ['running']);
    const t0 = Date.now();
    ranks[1]!.kill();
    const failed = await waitState(job.id, ['failed'], 10_000);
    const seconds = (Date.now() - t0) / 1000;
    expect(failed.error).toMatch(/rank 1 .* was lost: its connection to the PMIx server dropped/);
    expect(failed.members[1]).toMatchObject({ state: 'lost' });
    expect(seconds).toBeLessThan(3);
    expect(fx.sidecar.pmixClients.count(job.namespace)).toBe(1);
    ranks[0]!.kill();
    await waitReleased(job.id);
    await until(() => fx.sidecar.pmixClients.count(job.namespace) === 0, 5000, 'the last client to go');
  });

  it('tells the surviving members that their job failed (a PMIx event to the namespace)', async () => {
    const watcher = await pmixClient('event_watcher');
    const bystander = await createJob({ members: await workers(1) });
    const [eb] = await envs(bystander);
    const b = startRank(watcher, ['3'], eb!, 30_000);
    const job = await createJob({ members: await workers(2) });
    const [e0, e1] = await envs(job);
    const w = startRank(watcher, [], e0!, 30_000);
    const h = client(e1!, 'hang');
    await Promise.all([w.waitFor((l) => l.init === true), h.waitFor((l) => l.init === true)]);
    h.kill();
    const ev = await w.waitFor((l) => 'event' in l, 10_000);
    expect(ev).toMatchObject({ rank: 0, event: -200, source_nspace: job.namespace, terminate: true });
    expect(String(ev.text)).toMatch(new RegExp(`job ${job.id} failed: rank 1 .* was lost`));
    expect(await w.exited).toBe(0);
    const done = await waitReleased(job.id);
    expect(done.members.map((m: { state: string }) => m.state)).toEqual(['finalized', 'lost']);
    // Another job's member heard nothing of it.
    expect(await b.exited, describeRanks([b])).toBe(3);
    expect(b.lines.filter((l) => 'event' in l)).toEqual([]);
  });

  it('DELETE of a running job tells its members, tears it down, and the server goes on', async () => {
    const watcher = await pmixClient('event_watcher');
    const job = await createJob({ members: await workers(2) });
    const ranks = (await envs(job)).map((env) => startRank(watcher, ['20'], env, 30_000));
    await Promise.all(ranks.map((r) => r.waitFor((l) => l.init === true)));
    await waitState(job.id, ['running']);
    const del = await fx.api('DELETE', `/v1/jobs/${job.id}`);
    expect(del.body).toMatchObject({ state: 'aborted', error: 'deleted over REST' });
    for (const r of ranks)
      expect(await r.waitFor((l) => 'event' in l, 10_000)).toMatchObject({ event: -7, terminate: true });
    await Promise.all(ranks.map((r) => r.exited));
    expect((await fx.api('GET', `/v1/jobs/${job.id}`)).status).toBe(404);
    const next = await createJob({ members: job.members.map((m) => m.workerId) });
    await expectAllExit0((await envs(next)).map((env) => client(env, 'put-get')));
    await waitState(next.id, ['completed']);
  });

  it('aborts the job when a member calls PMIx_Abort', async () => {
    const job = await createJob({ members: await workers(1) });
    const [e] = await envs(job);
    const r = client(e!, 'abort', '7');
    await r.waitFor((l) => 'abort_returned' in l);
    const aborted = await waitState(job.id, ['aborted']);
    expect(aborted.error).toBe('rank 0 aborted the job with status 7: test client abort');
    r.kill();
    await waitReleased(job.id);
  });
});

describe('the sidecar with Open MPI 5 ranks', () => {
  it('runs MPI_Session_init + MPI_Comm_create_from_group + Allreduce over 4 ranks of a pset', async () => {
    const ids = await workers(4);
    await fx.api('POST', '/v1/psets', { name: 'ompi4', members: ids });
    const job = await createJob({ pset: 'ompi4' });
    const ranks = (await envs(job)).map((env) => startRank(bin('mpi_job_ompi5'), ['session'], env, 60_000));
    await expectAllExit0(ranks);
    for (const [rank, r] of ranks.entries()) {
      expect(
        r.lines.find((l) => 'sum' in l),
        describeRanks(ranks),
      ).toMatchObject({ rank, size: 4, sum: 10, ok: true });
    }
    const done = await waitReleased(job.id);
    expect(done.state).toBe('completed');
    const metrics = await (await fetch(`${fx.sidecar.url}/metrics`)).text();
    expect(metrics).toMatch(/dask_pmix_pmix_upcalls_total\{upcall="group",status="PMIX_SUCCESS"\} [1-9]/);
    // The C allocator's bytes: libpmix and Node alone hold megabytes.
    const inUse = Number(/^dask_pmix_native_heap_bytes\{kind="in_use"\} (\S+)$/m.exec(metrics)?.[1]);
    const free = Number(/^dask_pmix_native_heap_bytes\{kind="free"\} (\S+)$/m.exec(metrics)?.[1]);
    expect(inUse).toBeGreaterThan(1 << 20);
    expect(free).toBeGreaterThanOrEqual(0);
  });

  it('runs MPI_Init + Allreduce over 2 ranks chosen by a selector, twice on the same workers', async () => {
    const ids = await workers(2);
    for (let round = 0; round < 2; round++) {
      const job = await createJob({ members: ids });
      const ranks = (await envs(job)).map((env) => startRank(bin('mpi_job_ompi5'), ['world'], env, 60_000));
      await expectAllExit0(ranks);
      expect((await waitReleased(job.id)).state).toBe('completed');
    }
  });
});

describe('the sidecar with MPICH ranks (PMI-1)', () => {
  it('runs an MPICH job created over REST through the same job model', async () => {
    const job = (await fx.api('POST', '/v1/jobs', { impl: 'mpich', members: await workers(2) })).body;
    expect(job.impl).toBe('mpich');
    const e = await envs(job);
    expect(Object.keys(e[0]!).filter((k) => k.startsWith('PMIX_'))).toEqual([]);
    expect(e[1]).toMatchObject({ PMI_RANK: '1', PMI_SIZE: '2', PMI_PORT: expect.stringMatching(/:\d+$/) });
    const ranks = e.map((env) => startRank(...pmiRank(bin('mpi_job_mpich4'), ['world']), env, 60_000));
    await expectAllExit0(ranks);
    for (const [rank, r] of ranks.entries())
      expect(
        r.lines.find((l) => 'sum' in l),
        describeRanks(ranks),
      ).toMatchObject({ rank, size: 2, sum: 3, ok: true });
    const done = await waitReleased(job.id);
    expect(done.state).toBe('completed');
  });
});
