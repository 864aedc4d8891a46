// The native binding with real PMIx clients: separate processes that connect to our server with
// the environment from PMIx_server_setup_fork and nothing else.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PmixError, PmixServer, Status, v } from '../../src/pmix/index.js';
import { loadNative } from '../../src/pmix/native.js';
import { bin } from '../helpers/build-clients.js';
import { PmixFixture } from '../helpers/pmix-fixture.js';
import { describeRanks, startRank } from '../helpers/ranks.js';

let fx: PmixFixture;
beforeAll(async () => {
  fx = await PmixFixture.start();
});
afterAll(() => fx?.stop());

const client = (env: Record<string, string>, ...args: string[]) => startRank(bin('pmix_client'), args, env, 30_000);

describe('PMIx server binding', () => {
  it('reports the library version it runs (>= 4.2.4)', () => {
    const version = PmixServer.libraryVersion();
    expect(version).toMatch(/^\d+\.\d+\.\d+$/);
    const [maj, min, rel] = version.split('.').map(Number) as [number, number, number];
    expect(maj * 10000 + min * 100 + rel).toBeGreaterThanOrEqual(40204);
  });

  it('hands out a client environment from setup_fork', async () => {
    const [env] = await fx.job('env-job', 1);
    expect(env).toMatchObject({ PMIX_NAMESPACE: 'env-job', PMIX_RANK: '0' });
    expect(env!.PMIX_SERVER_URI41).toMatch(/tcp4:\/\/127\.0\.0\.1:\d+/);
    expect(env!.PMIX_SECURITY_MODE).toBeTruthy();
    expect(env!.PMIX_GDS_MODULE).toContain('hash');
  });

  it('exchanges keys with put, commit, fence and get', async () => {
    const envs = await fx.job('putget', 3);
    const ranks = envs.map((e) => client(e, 'put-get'));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    expect(codes, describeRanks(ranks)).toEqual([0, 0, 0]);
    for (const [rank, r] of ranks.entries()) {
      const peer = (rank + 1) % 3;
      expect(r.lines).toContainEqual({ rank, size: 3, peer, got: `value-from-${peer}` });
    }
    expect(fx.recorded.connected.filter((p) => p.nspace === 'putget')).toHaveLength(3);
    expect(fx.recorded.finalized.filter((p) => p.nspace === 'putget')).toHaveLength(3);
  });

  it('publishes and looks up with PMIX_WAIT across ranks', async () => {
    const envs = await fx.job('pubjob', 3);
    const ranks = envs.map((e) => client(e, 'publish-lookup', 'svc-a'));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    expect(codes, describeRanks(ranks)).toEqual([0, 0, 0]);
    for (const r of ranks.slice(1)) {
      expect(r.lines).toContainEqual(expect.objectContaining({ looked_up: 'port-of-pubjob', publisher: 0 }));
    }
  });

  it('answers pset queries from the query handler', async () => {
    fx.psets.set('alpha', [{ nspace: 'qjob', rank: 0 }]);
    fx.psets.set('beta', [{ nspace: 'qjob', rank: 0 }]);
    const [env] = await fx.job('qjob', 1);
    const r = client(env!, 'query-psets');
    expect(await r.exited, describeRanks([r])).toBe(0);
    expect(r.lines).toContainEqual({ rank: 0, num_psets: 2, pset_names: 'alpha,beta' });
    fx.psets.clear();
  });

  it('constructs a group with a context id from the group handler', async () => {
    const envs = await fx.job('grpjob', 2);
    const ranks = envs.map((e) => client(e, 'group', 'grp-1'));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    expect(codes, describeRanks(ranks)).toEqual([0, 0]);
    const construct = fx.recorded.groups.find((g) => g.group === 'grp-1' && g.op === 'construct');
    expect(construct?.contextId).toBeDefined();
    for (const r of ranks) {
      expect(r.lines).toContainEqual(expect.objectContaining({ group: 'grp-1', context_id: construct!.contextId }));
    }
  });

  it('delivers PMIx_Abort to the abort handler', async () => {
    const [env] = await fx.job('abortjob', 1);
    const r = client(env!, 'abort', '7');
    await r.waitFor((l) => 'abort_returned' in l);
    r.kill();
    expect(fx.recorded.aborts).toContainEqual({
      proc: { nspace: 'abortjob', rank: 0 },
      status: 7,
      message: 'test client abort',
    });
  });

  it('answers a client with the status a handler throws, and keeps serving', async () => {
    fx.extraHandlers.query = async () => {
      throw new PmixError(Status.ERR_NO_PERMISSIONS);
    };
    const [env] = await fx.job('qfail', 1);
    const r = client(env!, 'query-psets');
    expect(await r.exited).toBe(2);
    expect(r.lines).toContainEqual(expect.objectContaining({ error: 'query', status: Status.ERR_NO_PERMISSIONS }));
    fx.extraHandlers.query = async () => {
      throw new Error('a bug in a handler');
    };
    const [env2] = await fx.job('qfail2', 1);
    const r2 = client(env2!, 'query-psets');
    expect(await r2.exited).toBe(2);
    expect(r2.lines).toContainEqual(expect.objectContaining({ error: 'query', status: Status.ERROR }));
    delete fx.extraHandlers.query;
    const [env3] = await fx.job('qok', 1);
    const r3 = client(env3!, 'put-get');
    expect(await r3.exited, describeRanks([r3])).toBe(0);
  });

  it('rejects bad input with clear errors and loses nothing', async () => {
    await expect(fx.server.registerNspace('x'.repeat(300), 1, [])).rejects.toThrow(/nspace must have/);
    await expect(fx.server.registerNspace('bad', 1, [{ key: 'k', value: v.uint16(70000) }])).rejects.toThrow(
      /out of range for uint16/,
    );
    await expect(fx.server.registerNspace('bad', 1, [{ key: 'k', value: { type: 'nope' } as never }])).rejects.toThrow(
      /unknown PMIx data type/,
    );
    expect(() => fx.server.setupFork({ nspace: 'never-registered', rank: 0 })).not.toThrow();
    await expect(fx.server.defineProcessSet('ok-set', [{ nspace: 'putget', rank: 0 }])).resolves.toBeUndefined();
    await expect(fx.server.deleteProcessSet('ok-set')).resolves.toBeUndefined();
  });

  it('uses the attribute keys and status codes of the headers it was built with', () => {
    const { constants } = loadNative();
    return import('../../src/pmix/keys.js').then(({ Keys }) => {
      for (const [name, value] of Object.entries(Keys)) expect(constants.keys[`PMIX_${name}`], name).toBe(value);
      for (const [name, value] of Object.entries(Status)) expect(constants.ints[`PMIX_${name}`], name).toBe(value);
    });
  });
});
