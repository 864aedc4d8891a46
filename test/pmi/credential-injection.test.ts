// A PMI_ID that carries commands of its own (issue 31): `<credential>\ncmd=finalize` sent as is
// would bind rank 0 and finalize it in one write, before MPI starts. The binders refuse such a
// PMI_ID before connecting; the server refuses a bind with anything behind it in what arrived,
// before parsing it; and a job still wiring fails at its wiring timeout whatever a client sends.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BINDER, ROOT, VENV } from '../helpers/paths.js';
import { runProgram } from '../helpers/run-program.js';
import { PmiRmFixture } from './helpers/rm-fixture.js';
import { frame2, parse1, WireClient } from './helpers/wire-client.js';

let fx: PmiRmFixture;
beforeAll(async () => {
  fx = await PmiRmFixture.start();
});
afterAll(() => fx.stop());

const run = (cmd: readonly string[], env: Record<string, string>) => runProgram(cmd, env);

function memberStates(jobId: string): string[] {
  return fx.rm.getJob(jobId).members.map((m) => m.state);
}

describe('a PMI_ID with commands in it', () => {
  it('is refused by the server before the commands are read; no rank finalizes and the real rank 0 binds', async () => {
    const j = await fx.job(2);
    const c = await WireClient.connect(fx.port);
    c.send(`cmd=initack pmiid=${j.pmiIds[0]}\ncmd=finalize\n`);
    const reply = parse1(await c.line());
    expect(reply).toMatchObject({ cmd: 'initack', rc: '-1' });
    expect(reply.msg).toContain('PMI_ID_must_be_exactly_the_32_hex_digits');
    await c.closed;
    expect(memberStates(j.job.id)).toEqual(['assigned', 'assigned']);
    expect(fx.state(j.job.id)).toBe('pending');

    const real = await fx.bound(j, 0);
    expect(memberStates(j.job.id)[0]).toBe('connected');
    real.close();
    await fx.rm.deleteJob(j.job.id);
  });

  it('is refused in a PMI-2 fullinit too', async () => {
    const j = await fx.job(1);
    const c = await WireClient.connect(fx.port);
    c.send(`${frame2(`cmd=fullinit;pmi-version=2;pmi-subversion=0;pmiid=${j.pmiIds[0]};`)}${frame2('cmd=finalize;')}`);
    expect(await c.frame()).toMatch(/^cmd=fullinit-response;rc=-1;errmsg=.*PMI_ID must be exactly/);
    await c.closed;
    expect(memberStates(j.job.id)).toEqual(['assigned']);
    await fx.rm.deleteJob(j.job.id);
  });

  const BINDERS = {
    'dask-pmix exec (native/exec)': [BINDER, '/bin/true'],
    'python -m dask_pmix.pmi_connect': [join(VENV, 'bin', 'python'), '-m', 'dask_pmix.pmi_connect', '/bin/true'],
  } as const;
  it.each(Object.entries(BINDERS))('is refused by %s before it connects, saying what is wrong', async (_n, cmd) => {
    const j = await fx.job(1);
    const env = { ...j.envs[0]!, PYTHONPATH: join(ROOT, 'python') };
    const r = await run(cmd, { ...env, PMI_ID: `${j.pmiIds[0]}\ncmd=finalize` });
    expect(r.code).toBe(3);
    expect(r.err).toContain('PMI_ID is not a dask-pmix credential: character 33 is a newline');
    const short = await run(cmd, { ...env, PMI_ID: '1234' });
    expect(short.code).toBe(3);
    expect(short.err).toContain('4 hex digits, not 32');
    expect(memberStates(j.job.id)).toEqual(['assigned']);
    expect(fx.state(j.job.id)).toBe('pending');
    // The real one still binds.
    expect((await run(cmd, env)).code).toBe(0);
    await fx.rm.deleteJob(j.job.id);
  });
  it.each(Object.entries(BINDERS))('is refused by %s when half of it is missing, saying which', async (_n, cmd) => {
    const j = await fx.job(1);
    const env: Record<string, string> = { ...j.envs[0]!, PYTHONPATH: join(ROOT, 'python') };
    const { PMI_ID: _id, ...noId } = env;
    const r = await run(cmd, noId);
    expect(r.code).toBe(3);
    expect(r.err).toContain('PMI_PORT is set but PMI_ID is not: a rank needs the whole environment of its member');
    const { PMI_PORT: _port, ...noPort } = env;
    const s = await run(cmd, noPort);
    expect(s.code).toBe(3);
    expect(s.err).toContain('PMI_ID is set but PMI_PORT is not');
    expect(fx.state(j.job.id)).toBe('pending');
    await fx.rm.deleteJob(j.job.id);
  });
});

describe('the wiring timeout', () => {
  it('holds when a rank finalizes before every member connected', async () => {
    const j = await fx.job(2, { wiringTimeoutSeconds: 1 });
    const r0 = await fx.bound(j, 0);
    // Bound properly, then finalize while rank 1 has not connected.
    expect(await r0.cmd1('cmd=finalize')).toMatchObject({ cmd: 'finalize_ack', rc: '0' });
    const r1 = await fx.bound(j, 1);
    expect(fx.state(j.job.id)).toBe('wiring');
    const t0 = Date.now();
    const end = await fx.waitFor(j.job.id, ['running', 'failed', 'completed'], 5000);
    expect(end.state).toBe('failed');
    expect(end.error).toBe('wiring timeout: rank 0 finalized before every member had connected within 1 s');
    expect(Date.now() - t0).toBeLessThan(2000);
    // Rank 1's barrier is answered with the job's end, not left waiting.
    expect(await r1.cmd1('cmd=barrier_in')).toMatchObject({ cmd: 'barrier_out', rc: '-1' });
    r0.close();
    r1.close();
  });
});
