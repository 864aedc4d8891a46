// A sidecar killed with SIGKILL mid-job comes back from its state directory: its process sets and
// job history are there (the interrupted job failed, saying why), the shared-memory segments its
// Open MPI ranks would have left are removed, and new jobs and events do not collide with old ones.
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startServe } from '../../bench/lib/sidecar.js';
import { ompiJobId } from '../../src/service/shm-cleanup.js';
import { restClient, SERVE_START_MS } from '../helpers/http.js';

const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-state-test-'));
const started: ChildProcess[] = [];
afterAll(() => {
  for (const c of started) c.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

async function serve() {
  const { child, url } = await startServe({
    args: ['--no-pmi', '--pool-size', '0', '--state-dir', dir],
    token: 'tok',
    startMs: SERVE_START_MS,
  });
  started.push(child);
  return { child, api: restClient(url, 'tok') };
}

const worker = (id: string) => ({
  id,
  host: hostname(),
  pid: process.pid,
  uid: process.getuid!(),
  gid: process.getgid!(),
});

describe('the state directory', () => {
  it('the job id of a namespace is the one Open MPI 5 puts in its segment names', () => {
    // Seen: ranks of namespace dask-pmix.jee32-1 mapped /dev/shm/sm_segment.vm.0.7ed30000.{0,1}.
    expect(ompiJobId('dask-pmix.jee32-1')).toBe('7ed30000');
  });

  it('brings psets and job history back after kill -9, fails the interrupted job and removes its segments', async () => {
    const a = await serve();
    for (const id of ['w0', 'w1', 'w2']) expect((await a.api('POST', '/v1/workers', worker(id))).status).toBe(201);
    expect((await a.api('POST', '/v1/psets', { name: 'kept', members: ['w1', 'w0'] })).status).toBe(201);
    expect((await a.api('POST', '/v1/psets', { name: 'dropped', members: ['w2'] })).status).toBe(201);
    expect((await a.api('DELETE', '/v1/psets/dropped')).status).toBe(200);
    const done = (await a.api('POST', '/v1/jobs', { impl: 'openmpi', members: ['w2'] })).body;
    await a.api('POST', `/v1/jobs/${done.id}/members/w2/lost`, { reason: 'test' });
    const running = (await a.api('POST', '/v1/jobs', { impl: 'openmpi', pset: 'kept', labels: { app: 'x' } })).body;
    expect(running.state).toBe('pending');
    // What Open MPI ranks of the running job leave when they die with it.
    const segment = join(
      '/dev/shm',
      `sm_segment.dask-pmix-test-${process.pid}.${process.getuid!()}.${ompiJobId(running.namespace)}.0`,
    );
    const unrelated = join(
      '/dev/shm',
      `sm_segment.dask-pmix-test-${process.pid}.${process.getuid!()}.${ompiJobId('someone-else')}.0`,
    );
    writeFileSync(segment, '');
    writeFileSync(unrelated, '');
    try {
      a.child.kill('SIGKILL');
      await new Promise((r) => a.child.once('exit', r));

      const b = await serve();
      const psets = (await b.api('GET', '/v1/psets')).body.psets;
      expect(psets.map((p: any) => [p.name, p.members, p.jobId])).toEqual([['kept', ['w1', 'w0'], '']]);
      const jobs = (await b.api('GET', '/v1/jobs')).body.jobs;
      const byId = Object.fromEntries(jobs.map((j: any) => [j.id, j]));
      expect(byId[done.id]).toMatchObject({ state: 'failed', error: expect.stringContaining('test') });
      expect(byId[running.id]).toMatchObject({
        state: 'failed',
        pset: 'kept',
        labels: { app: 'x' },
        error: expect.stringMatching(/restarted/),
      });
      expect(byId[running.id].releasedAt).not.toBe('');
      expect(existsSync(segment)).toBe(false);
      expect(existsSync(unrelated)).toBe(true);

      // The workers register again (the plugin does); the pset is usable, ids are new.
      for (const id of ['w0', 'w1', 'w2']) expect((await b.api('POST', '/v1/workers', worker(id))).status).toBe(201);
      const again = (await b.api('POST', '/v1/jobs', { impl: 'openmpi', pset: 'kept' })).body;
      expect(again.members.map((m: any) => m.workerId)).toEqual(['w1', 'w0']);
      expect([done.id, running.id]).not.toContain(again.id);
      // A DELETE forgets the job here and in the store.
      expect((await b.api('DELETE', `/v1/jobs/${done.id}`)).status).toBe(200);
      b.child.kill('SIGKILL');
      await new Promise((r) => b.child.once('exit', r));

      const c = await serve();
      const ids = (await c.api('GET', '/v1/jobs')).body.jobs.map((j: any) => j.id);
      expect(ids).toContain(running.id);
      expect(ids).toContain(again.id);
      expect(ids).not.toContain(done.id);
      c.child.kill('SIGTERM');
      await new Promise((r) => c.child.once('exit', r));
    } finally {
      rmSync(segment, { force: true });
      rmSync(unrelated, { force: true });
    }
  }, 180_000);
});
