// Each pool epoch's secret (the key of the tcp+mpi comm backend's hellos, issue 31 item 3): the
// answer to a worker's pool join carries its epoch's, a new epoch has a new one, and nothing else
// the sidecar serves (listings, events, the dashboard, metrics) contains it.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type Api, buildApi } from '../../src/api/server.js';
import { toJson } from '../../src/api/wire.js';
import { defaultPolicy } from '../../src/policy/index.js';
import {
  type Job,
  type PoolBackend,
  type PoolEpochSpec,
  ResourceManager,
  type SequencedEvent,
} from '../../src/rm/index.js';
import { restClient } from '../helpers/http.js';
import { TOKEN, worker } from './fixture.js';

/** The PMIx side of the pool, without libpmix: the core and the API are what is under test. */
class FakePool implements PoolBackend {
  readonly uid = process.getuid?.() ?? 1000;
  readonly gid = process.getgid?.() ?? 1000;
  async open(_spec: PoolEpochSpec): Promise<void> {}
  async setUser(): Promise<void> {}
  rankEnv(namespace: string, rank: number): Record<string, string> {
    return { PMIX_NAMESPACE: namespace, PMIX_RANK: String(rank) };
  }
  async notifyJobEnded(_job: Readonly<Job>): Promise<void> {}
  async close(): Promise<void> {}
}

let rm: ResourceManager;
let api: Api;
let call: ReturnType<typeof restClient>;
let events: SequencedEvent[];

beforeEach(async () => {
  rm = new ResourceManager({ policy: defaultPolicy(), pool: { size: 4, backend: new FakePool() } });
  await rm.pool!.start();
  events = [];
  rm.events.subscribe((e) => events.push(e));
  api = await buildApi({ rm, token: TOKEN, version: 'test', pmixVersion: '5.0.11' });
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  const addr = api.app.server.address();
  call = restClient(`http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`, TOKEN);
});

afterEach(async () => {
  api.closeStreams();
  await api.app.close();
});

async function join(id: string): Promise<{ pool: { epoch: number; rank: number }; commSecret: string }> {
  expect((await call('POST', '/v1/workers', worker(id))).status).toBe(201);
  const r = await call('POST', `/v1/workers/${id}/pool`, { pid: 4242 });
  expect(r.status).toBe(200);
  return r.body;
}

describe("a pool epoch's secret", () => {
  it('is in the join answer, the same for the members of one epoch and new for the next epoch', async () => {
    const joined = [];
    for (const id of ['a', 'b', 'c', 'd', 'e']) joined.push(await join(id));
    expect(joined.map((j) => [j.pool.epoch, j.pool.rank])).toEqual([
      [0, 0],
      [0, 1],
      [0, 2],
      [0, 3],
      [1, 0],
    ]);
    for (const j of joined) expect(j.commSecret).toMatch(/^[0-9a-f]{64}$/);
    expect(new Set(joined.slice(0, 4).map((j) => j.commSecret)).size).toBe(1);
    expect(joined[4]!.commSecret).not.toBe(joined[0]!.commSecret);
  });

  it('is nowhere else: worker listings, events, the dashboard, metrics', async () => {
    const { commSecret } = await join('a');
    await call('POST', '/v1/workers/a/pool/leave', { reason: 'its session failed' });
    const served = [
      await call('GET', '/v1/workers'),
      await call('GET', '/v1/workers/a'),
      await call('GET', '/v1/dashboard'),
      await call('GET', '/metrics'),
    ];
    for (const r of served) {
      expect(r.status).toBe(200);
      expect(JSON.stringify(r.body)).not.toContain(commSecret);
    }
    expect(events.length).toBeGreaterThan(0);
    for (const e of events) expect(JSON.stringify(toJson.event(e))).not.toContain(commSecret);
  });

  it('is documented as a secret in the OpenAPI document', async () => {
    const doc = (await call('GET', '/openapi.json')).body;
    const answer = doc.paths['/v1/workers/{id}/pool'].post.responses['200'].content['application/json'].schema;
    const field = answer.properties?.commSecret ?? doc.components?.schemas?.PoolEnv?.properties?.commSecret;
    expect(field?.description).toMatch(/SECRET/);
  });
});
