// The PMI wire server against the real resource manager, driven by a raw TCP client: every
// command of both protocols, the errors a client gets for bad input, and what a member's
// failure does to the others. MPICH itself is in mpich.test.ts.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LIMITS, PMI1_MAX_LINE } from '../../src/pmi/limits.js';
import { type FixtureJob, PmiRmFixture } from './helpers/rm-fixture.js';
import { frame2, parse1, parse2, WireClient } from './helpers/wire-client.js';

let fx: PmiRmFixture;
beforeAll(async () => {
  fx = await PmiRmFixture.start({ releaseGraceMs: 5000 });
});
afterAll(() => fx.stop());

async function until(cond: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Connects as member `rank` of `j` over PMI-1 and checks the initack handshake. */
async function member1(j: FixtureJob, rank: number): Promise<WireClient> {
  const c = await WireClient.connect(fx.port);
  c.send(`cmd=initack pmiid=${j.pmiIds[rank]}\n`);
  expect(await c.line()).toBe('cmd=initack rc=0');
  expect(await c.line()).toBe(`cmd=set size=${j.job.members.length}`);
  expect(await c.line()).toBe(`cmd=set rank=${rank}`);
  expect(await c.line()).toBe('cmd=set debug=0');
  return c;
}

/** Connects as member `rank` of `j` over PMI-2 (PMI-1 init line, then fullinit). */
async function member2(j: FixtureJob, rank: number): Promise<WireClient> {
  const c = await WireClient.connect(fx.port);
  expect(await c.cmd1('cmd=init pmi_version=2 pmi_subversion=0')).toMatchObject({
    cmd: 'response_to_init',
    rc: '0',
    pmi_version: '2',
  });
  const r = await c.cmd2(`cmd=fullinit;pmirank=${j.pmiIds[rank]};`);
  expect(r).toMatchObject({
    cmd: 'fullinit-response',
    rc: '0',
    rank: String(rank),
    size: String(j.job.members.length),
    appnum: '0',
  });
  return c;
}

describe('member environment', () => {
  it('holds PMI_PORT, a 128-bit PMI_ID credential, PMI_RANK and PMI_SIZE, the yield settings, and never PMIX_*', async () => {
    const [a, b] = [await fx.job(2), await fx.job(1, { impl: 'intelmpi' })];
    expect(a.envs[1]).toEqual({
      PMI_PORT: `127.0.0.1:${fx.port}`,
      PMI_ID: expect.stringMatching(/^[0-9a-f]{32}$/),
      // The fixture's workers run on this host: they may use the UNIX socket.
      DASK_PMIX_PMI_SOCKET: fx.backend.listener.socketPath!,
      PMI_RANK: '1',
      PMI_SIZE: '2',
      MPIR_CVAR_CH4_PROGRESS_THROTTLE: '1',
      MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT: '16',
    });
    expect(b.envs[0]).toMatchObject({ PMI_RANK: '0', PMI_SIZE: '1', I_MPI_THREAD_YIELD: '2' });
    const ids = [...a.pmiIds, ...b.pmiIds];
    expect(new Set(ids).size).toBe(ids.length);
    for (const e of [...a.envs, ...b.envs]) expect(Object.keys(e).filter((k) => k.startsWith('PMIX'))).toEqual([]);
    await fx.rm.deleteJob(a.job.id);
    await fx.rm.deleteJob(b.job.id);
  });
});

describe('the UNIX socket for ranks on this host', () => {
  it('binds with the credential like TCP, and is offered only to members on this host', async () => {
    const j = await fx.job(2, { hosts: ['localhost', 'elsewhere'] });
    expect(j.envs[0]!.DASK_PMIX_PMI_SOCKET).toBe(fx.backend.listener.socketPath);
    expect(j.envs[1]!.DASK_PMIX_PMI_SOCKET).toBeUndefined();
    const stranger = await WireClient.connect(j.envs[0]!.DASK_PMIX_PMI_SOCKET!);
    stranger.send(`cmd=initack pmiid=${'2'.repeat(32)}\n`);
    expect(parse1(await stranger.line())).toMatchObject({ cmd: 'initack', rc: '-1' });
    await stranger.closed;
    const c = await WireClient.connect(j.envs[0]!.DASK_PMIX_PMI_SOCKET!);
    c.send(`cmd=initack pmiid=${j.pmiIds[0]}\n`);
    expect(await c.line()).toBe('cmd=initack rc=0');
    expect(await c.line()).toBe('cmd=set size=2');
    expect(await c.line()).toBe('cmd=set rank=0');
    await c.line();
    expect(await c.cmd1(`cmd=put kvsname=${j.job.namespace} key=k value=v`)).toMatchObject({ rc: '0' });
    await fx.rm.deleteJob(j.job.id);
    c.close();
  });
});

describe('job attributes', () => {
  it('hands ranks on this host the host topology (PMI_hwloc_xmlfile), as hydra does, and ranks elsewhere none', async () => {
    const j = await fx.job(2, { hosts: ['localhost', 'elsewhere'] });
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    const r = await a.cmd1(`cmd=get kvsname=${j.job.namespace} key=PMI_hwloc_xmlfile`);
    expect(r).toMatchObject({ rc: '0' });
    expect(readFileSync(r.value!, 'utf8')).toContain('<topology');
    expect(await b.cmd1(`cmd=get kvsname=${j.job.namespace} key=PMI_hwloc_xmlfile`)).toMatchObject({ rc: '-1' });
    expect(await b.cmd1(`cmd=get kvsname=${j.job.namespace} key=PMI_process_mapping`)).toMatchObject({
      rc: '0',
      value: '(vector,(0,2,1))',
    });
    await fx.rm.deleteJob(j.job.id);
    a.close();
    b.close();
  });
});

describe('PMI-1', () => {
  it('serves the whole command set to a job of two', async () => {
    const j = await fx.job(2);
    const kvs = j.job.namespace;
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    expect(fx.state(j.job.id)).toBe('running');

    expect(await a.cmd1('cmd=init pmi_version=1 pmi_subversion=1')).toEqual({
      cmd: 'response_to_init',
      rc: '0',
      pmi_version: '1',
      pmi_subversion: '1',
    });
    expect(await a.cmd1('cmd=get_maxes')).toEqual({
      cmd: 'maxes',
      rc: '0',
      kvsname_max: '256',
      keylen_max: '64',
      vallen_max: '1024',
    });
    expect(await a.cmd1('cmd=get_appnum')).toEqual({ cmd: 'appnum', rc: '0', appnum: '0' });
    expect(await a.cmd1('cmd=get_my_kvsname')).toEqual({ cmd: 'my_kvsname', rc: '0', kvsname: kvs });
    expect(await a.cmd1('cmd=get_universe_size')).toEqual({ cmd: 'universe_size', rc: '0', size: '2' });
    expect(await a.cmd1(`cmd=get kvsname=${kvs} key=PMI_process_mapping`)).toEqual({
      cmd: 'get_result',
      rc: '0',
      value: '(vector,(0,1,2))',
    });

    // A put is the putter's at once, everyone's after the next barrier.
    expect(await a.cmd1(`cmd=put kvsname=${kvs} key=card-0 value=AB12`)).toEqual({ cmd: 'put_result', rc: '0' });
    expect(await a.cmd1(`cmd=get kvsname=${kvs} key=card-0`)).toMatchObject({ rc: '0', value: 'AB12' });
    const early = await b.cmd1(`cmd=get kvsname=${kvs} key=card-0`);
    expect(early).toMatchObject({ cmd: 'get_result', rc: '-1' });
    expect(early.msg).toContain('visible_after_the_next_barrier');
    expect(await b.cmd1(`cmd=get kvsname=${kvs} key=nobody`)).toMatchObject({ rc: '-1', msg: 'key_nobody_not_found' });

    a.send('cmd=barrier_in\n');
    expect(await a.silent(100)).toBe(true);
    b.send('cmd=barrier_in\n');
    expect(parse1(await a.line())).toEqual({ cmd: 'barrier_out', rc: '0' });
    expect(parse1(await b.line())).toEqual({ cmd: 'barrier_out', rc: '0' });
    expect(await b.cmd1(`cmd=get kvsname=${kvs} key=card-0`)).toEqual({ cmd: 'get_result', rc: '0', value: 'AB12' });

    // Name service, shared by every job of the sidecar.
    expect(await a.cmd1('cmd=publish_name service=svc-1 port=tag#0$connentry#00AB$')).toEqual({
      cmd: 'publish_result',
      rc: '0',
    });
    expect(await a.cmd1('cmd=publish_name service=svc-1 port=other')).toMatchObject({
      cmd: 'publish_result',
      rc: '-1',
    });
    expect(await b.cmd1('cmd=lookup_name service=svc-1')).toEqual({
      cmd: 'lookup_result',
      rc: '0',
      port: 'tag#0$connentry#00AB$',
    });
    expect(await b.cmd1('cmd=unpublish_name service=svc-1')).toMatchObject({ cmd: 'unpublish_result', rc: '-1' });
    expect(await a.cmd1('cmd=unpublish_name service=svc-1')).toEqual({ cmd: 'unpublish_result', rc: '0' });
    expect(await b.cmd1('cmd=lookup_name service=svc-1')).toMatchObject({ cmd: 'lookup_result', rc: '-1' });

    expect(await a.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    expect(fx.state(j.job.id)).toBe('running');
    expect(await b.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    expect(fx.state(j.job.id)).toBe('completed');
    a.close();
    b.close();
    await fx.released(j.job.id);
  });

  it('accepts every line the advertised maxima allow: a maximal put and its get round-trip', async () => {
    // MPICH 5 across hosts puts 4096-byte business cards as 511-byte hex segments: a put line
    // of about 1090 bytes, beyond the 1024 of MPICH's own client buffer.
    const j = await fx.job(2);
    const kvs = j.job.namespace;
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    const maxes = await a.cmd1('cmd=get_maxes');
    const [kvsMax, keyMax, valMax] = [Number(maxes.kvsname_max), Number(maxes.keylen_max), Number(maxes.vallen_max)];
    const key = 'k'.repeat(keyMax);
    const value = Array.from({ length: valMax }, (_, i) => '0123456789ABCDEF'[(i * 7) % 16]).join('');
    expect(await a.cmd1(`cmd=put kvsname=${kvs} key=${key} value=${value}`)).toEqual({ cmd: 'put_result', rc: '0' });
    // The longest put the maxima allow (a kvsname of kvsname_max) is read and answered on its
    // merits (here: not this member's kvsname), not dropped for its length.
    const longest = `cmd=put kvsname=${'n'.repeat(kvsMax)} key=${key} value=${value}`;
    expect(longest.length + 1).toBe(PMI1_MAX_LINE);
    expect(await a.cmd1(longest)).toMatchObject({
      cmd: 'put_result',
      rc: '-1',
      msg: expect.stringContaining('wrong_kvsname'),
    });
    expect(await a.cmd1(`cmd=publish_name service=${'s'.repeat(kvsMax)} port=${value}`)).toEqual({
      cmd: 'publish_result',
      rc: '0',
    });
    await Promise.all([a.cmd1('cmd=barrier_in'), b.cmd1('cmd=barrier_in')]);
    expect(await b.cmd1(`cmd=get kvsname=${kvs} key=${key}`)).toEqual({ cmd: 'get_result', rc: '0', value });
    expect(await b.cmd1(`cmd=lookup_name service=${'s'.repeat(kvsMax)}`)).toEqual({
      cmd: 'lookup_result',
      rc: '0',
      port: value,
    });
    // Past the bound: a clear error, and the connection goes on.
    a.send(`${longest}X\n`);
    expect(parse1(await a.line())).toMatchObject({
      cmd: 'error',
      rc: '-1',
      msg: `line_longer_than_${PMI1_MAX_LINE}_bytes`,
    });
    expect(await a.cmd1(`cmd=put kvsname=${kvs} key=${key} value=${value}F`)).toMatchObject({
      rc: '-1',
      msg: `value_longer_than_${valMax}_characters`,
    });
    expect(await a.cmd1(`cmd=lookup_name service=${'s'.repeat(kvsMax + 1)}`)).toMatchObject({
      rc: '-1',
      msg: expect.stringContaining(`longer_than_${kvsMax}`),
    });
    await fx.rm.deleteJob(j.job.id);
    a.close();
    b.close();
  });

  it('answers bad input with rc=-1 and a msg, and keeps the connection', async () => {
    // Two members, of which only rank 0 shows up: the job stays open for the whole test.
    const j = await fx.job(2);
    const kvs = j.job.namespace;
    const before = await WireClient.connect(fx.port);
    expect(await before.cmd1('cmd=get_my_kvsname')).toMatchObject({
      cmd: 'my_kvsname',
      rc: '-1',
      msg: expect.stringContaining('no_PMI_ID'),
    });
    before.close();

    const c = await member1(j, 0);
    const bad: [string, Record<string, unknown>][] = [
      ['cmd=frobnicate x=1', { cmd: 'error', rc: '-1', msg: 'unknown_PMI-1_command_frobnicate' }],
      [
        'cmd=put kvsname=kvs_other key=k value=v',
        { cmd: 'put_result', rc: '-1', msg: expect.stringContaining('wrong_kvsname_kvs_other') },
      ],
      [
        `cmd=put kvsname=${kvs} key=PMI_process_mapping value=v`,
        { cmd: 'put_result', rc: '-1', msg: expect.stringContaining('reserved') },
      ],
      [
        `cmd=put kvsname=${kvs} key=${'k'.repeat(65)} value=v`,
        { cmd: 'put_result', rc: '-1', msg: expect.stringContaining('longer_than_64') },
      ],
      [`cmd=put kvsname=${kvs} value=v`, { cmd: 'put_result', rc: '-1', msg: 'missing_key=' }],
      [
        `cmd=put kvsname=${kvs} key=a value=b stray`,
        { cmd: 'put_result', rc: '-1', msg: expect.stringContaining('malformed_token') },
      ],
      [`cmd=get kvsname=${kvs} key=PMI_dead_processes`, { cmd: 'get_result', rc: '-1' }],
      [
        'cmd=init pmi_version=3 pmi_subversion=0',
        { cmd: 'response_to_init', rc: '-1', msg: expect.stringContaining('version_mismatch') },
      ],
      ['cmd=barrier_in group=WORLD:1', { cmd: 'barrier_out', rc: '-1', msg: expect.stringContaining('PMI_1.2') }],
      [
        `cmd=initack pmiid=${j.pmiIds[0]}`,
        { cmd: 'initack', rc: '-1', msg: expect.stringContaining('already_initialized') },
      ],
      ['cmd=initack pmiid=seven', { cmd: 'initack', rc: '-1', msg: expect.stringContaining('already_initialized') }],
    ];
    for (const [line, reply] of bad) expect(await c.cmd1(line), line).toMatchObject(reply);
    // A bad initack on a bound connection must not hang up (it only does so for unbound ones).
    expect(c.isClosed).toBe(false);

    // An over-long line is skipped up to its newline; the next command is served.
    c.send(`cmd=put kvsname=${kvs} key=big value=${'F'.repeat(PMI1_MAX_LINE)}\n`);
    expect(parse1(await c.line())).toMatchObject({
      cmd: 'error',
      rc: '-1',
      msg: `line_longer_than_${PMI1_MAX_LINE}_bytes`,
    });
    expect(await c.cmd1('cmd=get_appnum')).toEqual({ cmd: 'appnum', rc: '0', appnum: '0' });

    // Spawn: a clear refusal after the last block of the request.
    c.send(
      'mcmd=spawn\nnprocs=1\nexecname=/bin/true\ntotspawns=2\nspawnssofar=1\nargcnt=0\npreput_num=0\ninfo_num=0\nendcmd\n',
    );
    expect(await c.silent(100)).toBe(true);
    c.send(
      'mcmd=spawn\nnprocs=1\nexecname=/bin/true\ntotspawns=2\nspawnssofar=2\nargcnt=1\narg1=a b\npreput_num=0\ninfo_num=0\nendcmd\n',
    );
    expect(parse1(await c.line())).toMatchObject({
      cmd: 'spawn_result',
      rc: '-1',
      msg: expect.stringContaining('MPI_Comm_spawn_is_not_supported'),
    });

    expect(await c.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    expect(await c.cmd1('cmd=get_appnum')).toMatchObject({
      rc: '-1',
      msg: expect.stringContaining('already_finalized'),
    });
    c.close();
    expect(fx.state(j.job.id)).toBe('wiring');
    await fx.rm.deleteJob(j.job.id);
  });

  it('refuses an unknown PMI_ID and a second connection with the same PMI_ID, then hangs up', async () => {
    const j = await fx.job(1);
    const stranger = await WireClient.connect(fx.port);
    stranger.send(`cmd=initack pmiid=${'0'.repeat(32)}\n`);
    const refusal = parse1(await stranger.line());
    expect(refusal).toMatchObject({ cmd: 'initack', rc: '-1', msg: expect.stringContaining('unknown_PMI_ID') });
    expect(refusal.msg).not.toContain('0'.repeat(32));
    await stranger.closed;
    // MPI sending PMI_ID itself (an int, as MPICH and Intel MPI do) is told how to join.
    const raw = await WireClient.connect(fx.port);
    raw.send('cmd=initack pmiid=12345\n');
    expect(parse1(await raw.line())).toMatchObject({
      cmd: 'initack',
      rc: '-1',
      msg: expect.stringContaining('dask_pmix.pmi_connect'),
    });
    await raw.closed;
    // Guesses sent along after a wrong one are not looked at.
    const pipelined = await WireClient.connect(fx.port);
    pipelined.send(`cmd=initack pmiid=${'1'.repeat(32)}\ncmd=initack pmiid=${j.pmiIds[0]}\n`);
    expect(parse1(await pipelined.line())).toMatchObject({ cmd: 'initack', rc: '-1' });
    await pipelined.closed;
    expect(fx.state(j.job.id)).toBe('pending');

    const first = await member1(j, 0);
    const twin = await WireClient.connect(fx.port);
    twin.send(`cmd=initack pmiid=${j.pmiIds[0]}\n`);
    expect(parse1(await twin.line())).toMatchObject({
      cmd: 'initack',
      rc: '-1',
      msg: expect.stringContaining('already_connected'),
    });
    await twin.closed;
    // The twin's hang-up is not the member's: the job goes on.
    expect(fx.state(j.job.id)).toBe('running');
    expect(await first.cmd1('cmd=finalize')).toMatchObject({ rc: '0' });
    first.close();
  });

  it('closes a connection that sends bytes that are no PMI, losing its member', async () => {
    const j = await fx.job(2);
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    a.send('cmd=barrier_in\n');
    b.send('GET / HTTP/1.1\r\n\r\n');
    expect(parse1(await b.line())).toMatchObject({
      cmd: 'error',
      rc: '-1',
      msg: expect.stringContaining('not_a_PMI_command'),
    });
    await b.closed;
    const out = parse1(await a.line());
    expect(out).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
    expect(out.msg).toContain('rank_1');
    expect((await fx.waitFor(j.job.id, ['failed'])).error).toContain('closed before PMI finalize');
    a.close();
  });

  it('fails the job when a member disconnects before finalize: the others get errors', async () => {
    const j = await fx.job(3);
    const [a, b, c] = [await member1(j, 0), await member1(j, 1), await member1(j, 2)];
    a.send('cmd=barrier_in\n');
    b.send('cmd=barrier_in\n');
    expect(await a.silent(50)).toBe(true);
    c.close();
    for (const m of [a, b]) {
      const r = parse1(await m.line());
      expect(r).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
      expect(r.msg).toContain('rank_2');
    }
    const job = await fx.waitFor(j.job.id, ['failed']);
    expect(job.error).toMatch(/rank 2 .* was lost: its PMI connection closed before PMI finalize/);
    // Everything after the failure says so; finalize is still acknowledged so that the process
    // can exit. The server never hangs up on its own (MPICH 5 crashes on an unexpected EOF).
    expect(await a.cmd1(`cmd=get kvsname=${j.job.namespace} key=x`)).toMatchObject({
      rc: '-1',
      msg: expect.stringContaining('failed'),
    });
    expect(await a.cmd1('cmd=barrier_in')).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
    expect(await a.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    expect(a.isClosed).toBe(false);
    // Once the last member has left, the core releases the job without waiting out its grace.
    a.close();
    b.close();
    await until(() => fx.rm.getJob(j.job.id).releasedAt !== undefined, 1000);
    expect(fx.rm.getJob(j.job.id).members.map((m) => m.state)).toEqual(['finalized', 'lost', 'lost']);
    // The released job's PMI_IDs are forgotten.
    const late = await WireClient.connect(fx.port);
    late.send(`cmd=initack pmiid=${j.pmiIds[1]}\n`);
    expect(parse1(await late.line())).toMatchObject({ rc: '-1', msg: expect.stringContaining('unknown_PMI_ID') });
  });

  it('aborts the job on abort: no reply to the aborter, errors for the others', async () => {
    const j = await fx.job(2);
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    b.send('cmd=barrier_in\n');
    a.send('cmd=abort exitcode=7\n');
    expect(parse1(await b.line())).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
    const job = await fx.waitFor(j.job.id, ['aborted']);
    expect(job.error).toBe('rank 0 aborted the job with status 7: exit code 7');
    expect(await a.silent(50)).toBe(true);
    a.close();
    b.close();
  });

  it('keeps interleaved jobs apart on one listener, and one failing does not touch the other', async () => {
    const [j1, j2] = [await fx.job(2), await fx.job(2)];
    const m1 = [await member1(j1, 0), await member1(j1, 1)];
    const m2 = [await member1(j2, 0), await member1(j2, 1)];
    await m1[0]!.cmd1(`cmd=put kvsname=${j1.job.namespace} key=k value=one`);
    await m2[0]!.cmd1(`cmd=put kvsname=${j2.job.namespace} key=k value=two`);
    // Job 1's barrier does not complete with job 2's ranks.
    m1[0]!.send('cmd=barrier_in\n');
    m2[1]!.send('cmd=barrier_in\n');
    expect(await m1[0]!.silent(50)).toBe(true);
    m2[0]!.send('cmd=barrier_in\n');
    expect(parse1(await m2[0]!.line())).toMatchObject({ rc: '0' });
    expect(parse1(await m2[1]!.line())).toMatchObject({ rc: '0' });
    expect(await m1[0]!.silent(20)).toBe(true);
    // A member of job 1 cannot read job 2's store.
    expect(await m1[1]!.cmd1(`cmd=get kvsname=${j2.job.namespace} key=k`)).toMatchObject({
      rc: '-1',
      msg: expect.stringContaining('wrong_kvsname'),
    });
    // Job 1 fails; job 2 goes on.
    m1[1]!.close();
    expect(parse1(await m1[0]!.line())).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
    await fx.waitFor(j1.job.id, ['failed']);
    expect(await m2[1]!.cmd1(`cmd=get kvsname=${j2.job.namespace} key=k`)).toEqual({
      cmd: 'get_result',
      rc: '0',
      value: 'two',
    });
    for (const m of m2) expect(await m.cmd1('cmd=finalize')).toMatchObject({ rc: '0' });
    expect(fx.state(j2.job.id)).toBe('completed');
    for (const m of [...m1, ...m2]) m.close();
  });

  it("keeps the connections of a released job open, answering with the job's end", async () => {
    const j = await fx.job(2);
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    const job = await fx.rm.deleteJob(j.job.id, 'deleted by the test');
    expect(job.state).toBe('aborted');
    expect(await a.cmd1('cmd=barrier_in')).toMatchObject({
      cmd: 'barrier_out',
      rc: '-1',
      msg: expect.stringContaining('released'),
    });
    expect(await b.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    expect(a.isClosed || b.isClosed).toBe(false);
    a.close();
    b.close();
  });
});

describe('PMI-2', () => {
  it('serves the whole command set, echoing thrid', async () => {
    const j = await fx.job(2, { hosts: ['hostA', 'hostA'] });
    const kvs = j.job.namespace;
    const [a, b] = [await member2(j, 0), await member2(j, 1)];
    expect(await a.cmd2('cmd=job-getid;thrid=0x7f01;')).toEqual({
      cmd: 'job-getid-response',
      thrid: '0x7f01',
      rc: '0',
      jobid: kvs,
    });
    expect(await a.cmd2('cmd=info-getjobattr;key=PMI_process_mapping;')).toMatchObject({
      rc: '0',
      found: 'TRUE',
      value: '(vector,(0,1,2))',
    });
    expect(await a.cmd2('cmd=info-getjobattr;key=universeSize;')).toMatchObject({ rc: '0', found: 'TRUE', value: '2' });
    expect(await a.cmd2('cmd=info-getjobattr;key=PMI_dead_processes;')).toMatchObject({ rc: '0', found: 'FALSE' });

    expect(await a.cmd2('cmd=kvs-put;key=bc-0;value=with space;')).toEqual({ cmd: 'kvs-put-response', rc: '0' });
    expect(await b.cmd2(`cmd=kvs-get;jobid=${kvs};srcid=0;key=bc-0;`)).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining('after the next kvs-fence'),
    });
    expect(await b.cmd2('cmd=kvs-get;key=-NONEXIST-KEY;')).toMatchObject({ rc: '0', found: 'FALSE' });

    // Node attributes: a waiting get is answered when another rank on the host puts the key.
    b.send(frame2('cmd=info-getnodeattr;thrid=0xb;key=shm;wait=TRUE;'));
    expect(await b.silent(50)).toBe(true);
    expect(await a.cmd2('cmd=info-putnodeattr;key=shm;value=/dev/shm/x;')).toMatchObject({ rc: '0' });
    expect(parse2(await b.frame())).toEqual({
      cmd: 'info-getnodeattr-response',
      thrid: '0xb',
      rc: '0',
      found: 'TRUE',
      value: '/dev/shm/x',
    });
    expect(await b.cmd2('cmd=info-getnodeattr;key=nope;')).toMatchObject({ rc: '0', found: 'FALSE' });

    a.send(frame2('cmd=kvs-fence;thrid=0xa;'));
    expect(await a.silent(50)).toBe(true);
    // While rank 1's fence is pending, its other commands are still served (threaded clients).
    b.send(frame2('cmd=kvs-fence;thrid=0x1;'));
    expect(parse2(await a.frame())).toEqual({ cmd: 'kvs-fence-response', thrid: '0xa', rc: '0' });
    expect(parse2(await b.frame())).toEqual({ cmd: 'kvs-fence-response', thrid: '0x1', rc: '0' });
    expect(await b.cmd2('cmd=kvs-get;key=bc-0;')).toEqual({
      cmd: 'kvs-get-response',
      rc: '0',
      found: 'TRUE',
      value: 'with space',
    });

    expect(await a.cmd2('cmd=name-publish;name=svc-2;port=p2;')).toMatchObject({ rc: '0' });
    expect(await b.cmd2('cmd=name-lookup;name=svc-2;')).toMatchObject({ rc: '0', port: 'p2', value: 'p2' });
    expect(await a.cmd2('cmd=name-unpublish;name=svc-2;')).toMatchObject({ rc: '0' });
    expect(await b.cmd2('cmd=name-lookup;name=svc-2;')).toMatchObject({ rc: '-1' });

    expect(await a.cmd2('cmd=finalize;')).toEqual({ cmd: 'finalize-response', rc: '0' });
    expect(await b.cmd2('cmd=finalize;')).toEqual({ cmd: 'finalize-response', rc: '0' });
    expect(fx.state(j.job.id)).toBe('completed');
    a.close();
    b.close();
  });

  it('speaks to the older PMI-2 clients: srcid, left-aligned lengths, pmi-version in the reply', async () => {
    const j = await fx.job(1);
    const c = await WireClient.connect(fx.port);
    await c.cmd1('cmd=init pmi_version=2 pmi_subversion=0');
    const body = `cmd=fullinit;pmijobid=x;srcid=${j.pmiIds[0]};threaded=FALSE;`;
    c.send(`${String(body.length).padEnd(6, ' ')}${body}`);
    expect(parse2(await c.frame())).toEqual({
      cmd: 'fullinit-response',
      rc: '0',
      'pmi-version': '2',
      'pmi-subversion': '0',
      rank: '0',
      size: '1',
      appnum: '0',
      pmiverbose: 'FALSE',
    });
    // Their abort says msg=, not message=.
    c.send(frame2('cmd=abort;isworld=TRUE;msg=bye;'));
    expect((await fx.waitFor(j.job.id, ['aborted'])).error).toBe('rank 0 aborted the job with status 1: bye');
    expect(await c.silent(20)).toBe(true);
    c.close();
  });

  it('accepts a maximal kvs-put and name-publish (every field at the advertised maxima)', async () => {
    const j = await fx.job(2);
    const [a, b] = [await member2(j, 0), await member2(j, 1)];
    const key = 'k'.repeat(LIMITS.keyMax);
    const value = 'F'.repeat(LIMITS.valueMax);
    expect(await a.cmd2(`cmd=kvs-put;thrid=0x7fffffffffff;key=${key};value=${value};`)).toEqual({
      cmd: 'kvs-put-response',
      thrid: '0x7fffffffffff',
      rc: '0',
    });
    await Promise.all([a.cmd2('cmd=kvs-fence;'), b.cmd2('cmd=kvs-fence;')]);
    expect(await b.cmd2(`cmd=kvs-get;key=${key};`)).toEqual({ cmd: 'kvs-get-response', rc: '0', found: 'TRUE', value });
    expect(await a.cmd2(`cmd=name-publish;name=${'s'.repeat(LIMITS.kvsnameMax)};port=${value};`)).toMatchObject({
      rc: '0',
    });
    expect(await a.cmd2(`cmd=kvs-put;key=${key};value=${value}F;`)).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining(`longer than ${LIMITS.valueMax}`),
    });
    await fx.rm.deleteJob(j.job.id);
    a.close();
    b.close();
  });

  it('closes a socket at its first wrong PMI_ID: no second guess on it', async () => {
    const j = await fx.job(1);
    for (const wrong of [`pmirank=${'f'.repeat(32)}`, 'pmirank=0', 'srcid=-1', '']) {
      const c = await WireClient.connect(fx.port);
      c.send(frame2(`cmd=fullinit;${wrong}${wrong ? ';' : ''}`));
      c.send(frame2(`cmd=fullinit;pmirank=${j.pmiIds[0]};`));
      expect(parse2(await c.frame())).toMatchObject({ cmd: 'fullinit-response', rc: '-1' });
      await c.closed;
    }
    // Nobody got in.
    expect(fx.state(j.job.id)).toBe('pending');
    const ok = await member2(j, 0);
    expect(await ok.cmd2('cmd=finalize;')).toMatchObject({ rc: '0' });
    ok.close();
  });

  it('takes over a connection bound by the starter (initack with the credential, then PMI_FD): fullinit names the rank', async () => {
    const j = await fx.job(2);
    const [a, b] = [await member1(j, 0), await member1(j, 1)];
    // What MPICH >= 4.1 sends on PMI_FD with PMI_RANK set, and what Slurm's libpmi2 sends.
    expect(await a.cmd1('cmd=init pmi_version=2 pmi_subversion=0')).toMatchObject({ rc: '0', pmi_version: '2' });
    expect(await a.cmd2('cmd=fullinit;pmirank=0;')).toMatchObject({
      cmd: 'fullinit-response',
      rc: '0',
      rank: '0',
      size: '2',
    });
    expect(await a.cmd2('cmd=fullinit;pmirank=0;')).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining('already initialized'),
    });
    expect(await b.cmd2('cmd=fullinit;pmirank=0;')).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining('rank 1'),
    });
    expect(b.isClosed).toBe(false);
    expect(await b.cmd2('cmd=fullinit;srcid=1;threaded=FALSE;')).toMatchObject({ rc: '0', rank: '1' });
    await Promise.all([a.cmd2('cmd=kvs-fence;'), b.cmd2('cmd=kvs-fence;')]);
    expect(await a.cmd2('cmd=finalize;')).toMatchObject({ rc: '0' });
    expect(await b.cmd2('cmd=finalize;')).toMatchObject({ rc: '0' });
    expect(fx.state(j.job.id)).toBe('completed');
    a.close();
    b.close();
  });

  it('answers bad input with rc=-1 and an errmsg', async () => {
    const j = await fx.job(2);
    const c = await WireClient.connect(fx.port);
    expect(await c.cmd2('cmd=kvs-put;key=a;value=b;')).toMatchObject({
      cmd: 'kvs-put-response',
      rc: '-1',
      errmsg: expect.stringContaining('no PMI_ID'),
    });
    expect(await c.cmd2(`cmd=fullinit;pmirank=${j.pmiIds[0]};`)).toMatchObject({ rc: '0' });
    expect(await c.cmd2('cmd=warp-drive;')).toMatchObject({
      cmd: 'warp-drive-response',
      rc: '-1',
      errmsg: 'unknown PMI-2 command warp-drive',
    });
    expect(await c.cmd2('cmd=kvs-get;jobid=someone-else;key=k;')).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining('wrong kvsname'),
    });
    expect(await c.cmd2('cmd=kvs-put;key=PMI_x;value=1;')).toMatchObject({
      rc: '-1',
      errmsg: expect.stringContaining('reserved'),
    });
    expect(await c.cmd2('cmd=job-connect;jobid=x;')).toMatchObject({ rc: '-1' });
    expect(
      await c.cmd2('cmd=spawn;ncmds=1;preputcount=0;subcmd=/bin/true;maxprocs=1;argc=0;infokeycount=0;'),
    ).toMatchObject({
      cmd: 'spawn-response',
      rc: '-1',
      errmsg: expect.stringContaining('not supported'),
    });
    c.send('000000');
    expect(parse2(await c.frame())).toMatchObject({ cmd: 'error-response', rc: '-1', errmsg: 'empty PMI-2 command' });
    // A waiting node-attribute get fails when the job does.
    c.send(frame2('cmd=info-getnodeattr;key=never;wait=TRUE;'));
    const other = await member2(j, 1);
    other.close();
    expect(parse2(await c.frame())).toMatchObject({
      cmd: 'info-getnodeattr-response',
      rc: '-1',
      errmsg: expect.stringContaining('failed'),
    });
    c.close();
  });
});

describe("limits: a hostile client gets errors, not the sidecar's memory, and other jobs are untouched", () => {
  let lx: PmiRmFixture;
  beforeAll(async () => {
    lx = await PmiRmFixture.start({
      limits: { kvEntries: 4, kvBytes: 64, puts: 8 },
      bindTimeoutMs: 300,
      maxUnbound: 3,
    });
  });
  afterAll(() => lx.stop());

  const bound = (j: FixtureJob, rank: number) => lx.bound(j, rank);

  it('bounds keys, bytes and puts per job, each with a clear error', async () => {
    const [j, other] = [await lx.job(2), await lx.job(1)];
    const kvs = j.job.namespace;
    const [a, b] = [await bound(j, 0), await bound(j, 1)];
    const put = (c: WireClient, k: string, v: string) => c.cmd1(`cmd=put kvsname=${kvs} key=${k} value=${v}`);
    expect(await put(a, 'k1', 'v')).toMatchObject({ rc: '0' });
    expect(await put(a, 'k2', 'v')).toMatchObject({ rc: '0' });
    expect(await put(b, 'k1', 'v')).toMatchObject({ rc: '0' });
    expect(await put(b, 'k3', 'v')).toMatchObject({ rc: '0' });
    // Four keys held (two ranks staged k1): a fifth is refused, an overwrite is not.
    expect(await put(b, 'k4', 'v')).toMatchObject({ rc: '-1', msg: expect.stringContaining('limit_of_4_keys') });
    expect(await put(b, 'k3', 'w')).toMatchObject({ rc: '0' });
    // Committing merges the two k1: room for one more key, but not for 64 bytes more.
    await Promise.all([a.cmd1('cmd=barrier_in'), b.cmd1('cmd=barrier_in')]);
    expect(await put(a, 'k5', 'x'.repeat(60))).toMatchObject({ rc: '-1', msg: expect.stringContaining('64_bytes') });
    expect(await put(a, 'k5', 'v')).toMatchObject({ rc: '0' });
    // Eight puts in the job's life, overwrites included (refused ones do not count).
    expect(await put(a, 'k5', 'w')).toMatchObject({ rc: '0' });
    expect(await put(a, 'k5', 'u')).toMatchObject({ rc: '0' });
    expect(await put(a, 'k5', 't')).toMatchObject({ rc: '-1', msg: expect.stringContaining('limit_of_8_puts') });
    // What was stored is intact, and the connection goes on.
    expect(await b.cmd1(`cmd=get kvsname=${kvs} key=k2`)).toMatchObject({ rc: '0', value: 'v' });
    // Another job has its own budget.
    const o = await bound(other, 0);
    expect(await o.cmd1(`cmd=put kvsname=${other.job.namespace} key=k1 value=v`)).toMatchObject({ rc: '0' });
    for (const c of [a, b, o]) expect(await c.cmd1('cmd=finalize')).toMatchObject({ rc: '0' });
    expect(lx.state(j.job.id)).toBe('completed');
    for (const c of [a, b, o]) c.close();
  });

  it('closes connections that never bind, and keeps at most maxUnbound of them waiting', async () => {
    const idle = await WireClient.connect(lx.port);
    await idle.closed;
    const flood = await Promise.all([1, 2, 3, 4, 5].map(() => WireClient.connect(lx.port)));
    // The two oldest go at once; the others at their bind timeout.
    await Promise.all([flood[0]!.closed, flood[1]!.closed]);
    expect(flood.slice(2).map((c) => c.isClosed)).toEqual([false, false, false]);
    await Promise.all(flood.map((c) => c.closed));
    // A member that binds stays.
    const j = await lx.job(1);
    const m = await bound(j, 0);
    await new Promise((r) => setTimeout(r, 500));
    expect(m.isClosed).toBe(false);
    expect(await m.cmd1('cmd=finalize')).toMatchObject({ rc: '0' });
    m.close();
  });
});
