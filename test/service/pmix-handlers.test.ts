// The PMIx upcall handlers against the real core, without libpmix: what each upcall answers.
import { beforeEach, describe, expect, it } from 'vitest';
import { type Info, info, Keys, PmixError, Rank, Status, type UpcallHandlers, v } from '../../src/pmix/index.js';
import { defaultPolicy } from '../../src/policy/index.js';
import { type Job, ManualClock, type PoolBackend, ResourceManager } from '../../src/rm/index.js';
import { PmixClients } from '../../src/service/pmix-clients.js';
import { pmixHandlers } from '../../src/service/pmix-handlers.js';
import { RecordingBackend } from '../rm/fake-backend.js';

let rm: ResourceManager;
let h: Required<
  Pick<
    UpcallHandlers,
    | 'query'
    | 'group'
    | 'fence'
    | 'publish'
    | 'lookup'
    | 'unpublish'
    | 'abort'
    | 'localEvent'
    | 'clientConnected'
    | 'clientFinalized'
    | 'spawn'
    | 'jobControl'
    | 'directModex'
  >
>;
let job: Readonly<Job>;

beforeEach(async () => {
  rm = new ResourceManager({
    clock: new ManualClock(),
    backends: [new RecordingBackend(['openmpi'])],
    policy: defaultPolicy(),
  });
  h = pmixHandlers({ rm }) as typeof h;
  for (const id of ['a', 'b', 'c']) rm.registerWorker({ id, host: 'h' });
  rm.definePset({ name: 'p1', members: ['a', 'b'] });
  rm.definePset({ name: 'p2', members: ['c'] });
  job = await rm.createJob({ impl: 'openmpi', pset: 'p1' });
});

const p = (rank: number) => ({ nspace: job.namespace, rank });
const keysOf = (infos: Info[]) => infos.map((i) => i.key);

describe('query', () => {
  it('answers the pset names before the count (Open MPI 5.0.x reads them in that order)', async () => {
    const out = await h.query({ proc: p(0), queries: [{ keys: [Keys.QUERY_NUM_PSETS], qualifiers: [] }] });
    expect(out).toEqual([info(Keys.QUERY_PSET_NAMES, v.string('p1,p2')), info(Keys.QUERY_NUM_PSETS, v.size(2))]);
  });

  it('answers names and membership (procs of members that are in jobs)', async () => {
    const out = await h.query({
      proc: p(0),
      queries: [
        { keys: [Keys.QUERY_PSET_NAMES], qualifiers: [] },
        { keys: [Keys.QUERY_PSET_MEMBERSHIP], qualifiers: [info(Keys.PSET_NAME, v.string('p1'))] },
        { keys: [Keys.QUERY_PSET_MEMBERSHIP], qualifiers: [info(Keys.PSET_NAME, v.string('p2'))] },
      ],
    });
    expect(out).toEqual([
      info(Keys.QUERY_PSET_NAMES, v.string('p1,p2')),
      info(Keys.QUERY_PSET_MEMBERSHIP, v.procs([p(0), p(1)])),
      info(Keys.QUERY_PSET_MEMBERSHIP, v.procs([])),
    ]);
  });

  it('refuses what it cannot answer with a PMIx status', async () => {
    await expect(
      h.query({ proc: null, queries: [{ keys: ['pmix.qry.unknown'], qualifiers: [] }] }),
    ).rejects.toMatchObject({ status: Status.ERR_NOT_FOUND });
    await expect(
      h.query({ proc: null, queries: [{ keys: [Keys.QUERY_PSET_MEMBERSHIP], qualifiers: [] }] }),
    ).rejects.toMatchObject({ status: Status.ERR_BAD_PARAM });
    await expect(
      h.query({
        proc: null,
        queries: [{ keys: [Keys.QUERY_PSET_MEMBERSHIP], qualifiers: [info(Keys.PSET_NAME, v.string('zz'))] }],
      }),
    ).rejects.toMatchObject({ status: Status.ERR_NOT_FOUND });
  });
});

describe('group', () => {
  it('answers a construct with a server-wide context id, the membership, and the endpoint data', async () => {
    const endpt = info(Keys.GROUP_ENDPT_DATA, v.bytes(Buffer.from('ep')));
    const dirs = [info(Keys.GROUP_ASSIGN_CONTEXT_ID, v.bool(true)), endpt];
    const a = await h.group({ op: 'construct', group: 'g', procs: [p(0), p(1)], directives: dirs });
    expect(a).toEqual([
      info(Keys.GROUP_CONTEXT_ID, v.size(0xffffffff)),
      info(Keys.GROUP_MEMBERSHIP, v.procs([p(0), p(1)])),
      endpt,
    ]);
    const b = await h.group({ op: 'construct', group: 'g', procs: [p(0), p(1)], directives: dirs });
    expect(b[0]).toEqual(info(Keys.GROUP_CONTEXT_ID, v.size(0xfffffffe)));
    expect(await h.group({ op: 'destruct', group: 'g', procs: [p(0), p(1)], directives: [] })).toEqual([]);
  });

  it('gives no endpoint data back for a group of pool ranks (libpmix would keep a copy per job)', async () => {
    // libpmix stores what comes back, qualified by the new context id, and never frees it: every
    // in-process job added its members' endpoint data to the pool namespace (about 50 KB for
    // four ranks) and slowed every later store. Pool ranks are all this server's clients already.
    const pool: PoolBackend = {
      uid: 1000,
      gid: 1000,
      async open() {},
      rankEnv: () => ({}),
      async setUser() {},
      async notifyJobEnded() {},
      async close() {},
    };
    const prm = new ResourceManager({
      clock: new ManualClock(),
      backends: [new RecordingBackend(['openmpi'])],
      policy: defaultPolicy(),
      pool: { size: 8, backend: pool },
    });
    await prm.pool!.start();
    const seat = prm.registerWorker({ id: 'w', host: 'h' }).pool!;
    expect(prm.isPoolNamespace(seat.namespace)).toBe(true);
    const ph = pmixHandlers({ rm: prm }) as typeof h;
    const endpt = info(Keys.GROUP_ENDPT_DATA, v.bytes(Buffer.from('ep')));
    const procs = [
      { nspace: seat.namespace, rank: 0 },
      { nspace: seat.namespace, rank: 1 },
    ];
    const out = await ph.group({
      op: 'construct',
      group: 'not-a-job',
      procs,
      directives: [info(Keys.GROUP_ASSIGN_CONTEXT_ID, v.bool(true)), endpt],
    });
    expect(keysOf(out)).toEqual([Keys.GROUP_CONTEXT_ID, Keys.GROUP_MEMBERSHIP]);
  });

  it('refuses a group of an unknown namespace', async () => {
    await expect(
      h.group({ op: 'construct', group: 'g', procs: [{ nspace: 'nope', rank: 0 }], directives: [] }),
    ).rejects.toBeInstanceOf(PmixError);
  });
});

describe('fence, name service, abort, lifecycle', () => {
  it('completes a fence over all local ranks and returns their data', async () => {
    const data = Buffer.from('blob');
    expect(await h.fence({ procs: [{ nspace: job.namespace, rank: Rank.WILDCARD }], info: [], data })).toEqual(data);
  });

  it('publishes, looks up with the publisher, and maps duplicates to PMIX_ERR_DUPLICATE_KEY', async () => {
    await h.publish({ proc: p(0), info: [info('svc', v.string('port')), info(Keys.RANGE, v.range(5))] });
    const got = await h.lookup({ proc: p(1), keys: ['svc'], info: [] });
    expect(got).toEqual([{ proc: p(0), key: 'svc', value: v.string('port') }]);
    await expect(h.publish({ proc: p(1), info: [info('svc', v.string('x'))] })).rejects.toMatchObject({
      status: Status.ERR_DUPLICATE_KEY,
    });
    await expect(h.lookup({ proc: p(1), keys: ['none'], info: [] })).rejects.toMatchObject({
      status: Status.ERR_NOT_FOUND,
    });
    await h.unpublish({ proc: p(0), keys: ['svc'], info: [] });
    await expect(h.lookup({ proc: p(1), keys: ['svc'], info: [] })).rejects.toMatchObject({
      status: Status.ERR_NOT_FOUND,
    });
  });

  it('drives the job: connected, finalized, completed', async () => {
    await h.clientConnected({ proc: p(0), info: [] });
    await h.clientConnected({ proc: p(1), info: [] });
    expect(job.state).toBe('running');
    await h.clientFinalized({ proc: p(0) });
    await h.clientFinalized({ proc: p(1) });
    expect(job.state).toBe('completed');
  });

  it('aborts the job on abort', async () => {
    await h.abort({ proc: p(1), status: 3, message: 'boom', procs: [] });
    expect(job).toMatchObject({ state: 'aborted', error: 'rank 1 aborted the job with status 3: boom' });
  });

  it('loses every proc of a batched lost-connection event', async () => {
    await h.clientConnected({ proc: p(0), info: [] });
    await h.clientConnected({ proc: p(1), info: [] });
    await h.localEvent({ status: Status.ERR_LOST_CONNECTION, source: p(1), info: [info(Keys.PROCID, v.proc(p(0)))] });
    expect(job.members.map((m) => m.state)).toEqual(['lost', 'lost']);
    expect(job.state).toBe('failed');
    // Other events and unknown namespaces are ignored.
    await h.localEvent({ status: Status.ERR_LOST_CONNECTION, source: { nspace: 'other', rank: 0 }, info: [] });
    await h.localEvent({ status: Status.ERR_TIMEOUT, source: p(0), info: [] });
  });

  it('keeps the source of a PROC_TERM_WO_SYNC attached: it is the living process that saw a peer fail', async () => {
    const clients = new PmixClients();
    h = pmixHandlers({ rm, clients }) as typeof h;
    await h.clientConnected({ proc: p(0), info: [] });
    await h.clientConnected({ proc: p(1), info: [] });
    // Open MPI's fault tolerance in rank 0 relays that rank 1 failed (its TCP link broke).
    await h.localEvent({
      status: Status.ERR_PROC_TERM_WO_SYNC,
      source: p(0),
      info: [info(Keys.EVENT_AFFECTED_PROC, v.proc(p(1)))],
    });
    expect(clients.snapshot()[job.namespace]).toEqual([0, 1]);
    expect(job.members.map((m) => m.state)).toEqual(['connected', 'connected']);
    // libpmix's own word that rank 1's connection dropped is what counts.
    await h.localEvent({ status: Status.ERR_LOST_CONNECTION, source: p(1), info: [] });
    expect(clients.snapshot()[job.namespace]).toEqual([0]);
    expect(job.members.map((m) => m.state)).toEqual(['connected', 'lost']);
  });

  it('does not spawn, control jobs, or serve a direct modex', async () => {
    await expect(h.spawn({ proc: p(0), jobInfo: [], apps: [] })).rejects.toMatchObject({
      status: Status.ERR_NOT_SUPPORTED,
    });
    await expect(h.jobControl({ proc: p(0), directives: [], targets: [] })).rejects.toMatchObject({
      status: Status.ERR_NOT_SUPPORTED,
    });
    await expect(h.directModex({ proc: p(0), info: [] })).rejects.toMatchObject({ status: Status.ERR_NOT_FOUND });
  });
});
