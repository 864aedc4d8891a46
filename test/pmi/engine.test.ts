// What the native PMI engine adds at the wire: a bound connection is handed over with whatever
// the client sent along, PMI-1 replies stay in order across the engine and JavaScript, node
// attributes wait across ranks, and the core's collective model (deadlines, observers) holds
// for the fences the engine runs.
import { spawnSync } from 'node:child_process';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BINDER, ROOT } from '../helpers/paths.js';
import { type FixtureJob, PmiRmFixture } from './helpers/rm-fixture.js';
import { frame2, parse1, parse2, WireClient } from './helpers/wire-client.js';

const fences: [string, number, string][] = [];
let fx: PmiRmFixture;
beforeAll(async () => {
  fx = await PmiRmFixture.start({
    releaseGraceMs: 5000,
    collectiveTimeoutMs: 400,
    onCollective: (n, s, o) => fences.push([n, s, o]),
  });
});
afterAll(() => fx.stop());

const bound = (j: FixtureJob, rank: number) => fx.bound(j, rank);

describe('the native PMI engine', () => {
  it('serves what a client sends in one write after its bind, in order, whoever answers each line', async () => {
    const j = await fx.job(1);
    const kvs = j.job.namespace;
    const c = await WireClient.connect(fx.port);
    // The bind alone (anything sent along with it is refused: credential-injection.test.ts), then
    // one write of lines for the engine and for JavaScript, interleaved.
    c.send(`cmd=initack pmiid=${j.pmiIds[0]}\n`);
    const got = [];
    for (let i = 0; i < 4; i++) got.push(parse1(await c.line()));
    c.send(
      [
        'cmd=get_maxes',
        'cmd=publish_name service=engine-order port=p1',
        `cmd=put kvsname=${kvs} key=k value=v`,
        'cmd=frobnicate',
        `cmd=get kvsname=${kvs} key=k`,
        'cmd=lookup_name service=engine-order',
        'cmd=barrier_in',
        'cmd=unpublish_name service=engine-order',
        'cmd=get_appnum',
      ]
        .map((l) => `${l}\n`)
        .join(''),
    );
    for (let i = 0; i < 9; i++) got.push(parse1(await c.line()));
    expect(got.map((r) => [r.cmd, r.rc ?? r.size ?? r.rank ?? r.debug])).toEqual([
      ['initack', '0'],
      ['set', '1'],
      ['set', '0'],
      ['set', '0'],
      ['maxes', '0'],
      ['publish_result', '0'],
      ['put_result', '0'],
      ['error', '-1'],
      ['get_result', '0'],
      ['lookup_result', '0'],
      ['barrier_out', '0'],
      ['unpublish_result', '0'],
      ['appnum', '0'],
    ]);
    expect(got[8]!.value).toBe('v');
    expect(got[9]!.port).toBe('p1');
    expect(await c.cmd1('cmd=finalize')).toEqual({ cmd: 'finalize_ack', rc: '0' });
    await fx.waitFor(j.job.id, ['completed']);
    c.close();
  });

  it('answers a waiting info-getnodeattr when a rank of the same node puts the key, and fails it when the job ends', async () => {
    const j = await fx.job(3, { hosts: ['localhost', 'localhost', 'node-b'] });
    const [a, b, far] = [await bound(j, 0), await bound(j, 1), await bound(j, 2)];
    a.send(frame2('cmd=info-getnodeattr;key=shm;wait=TRUE;thrid=0x1;'));
    far.send(frame2('cmd=info-getnodeattr;key=shm;wait=TRUE;'));
    expect(await a.silent(50)).toBe(true);
    expect(await b.cmd2('cmd=info-putnodeattr;key=shm;value=/dev/shm/seg;')).toMatchObject({ rc: '0' });
    expect(parse2(await a.frame())).toMatchObject({
      cmd: 'info-getnodeattr-response',
      thrid: '0x1',
      rc: '0',
      found: 'TRUE',
      value: '/dev/shm/seg',
    });
    // Another node's attribute is not this node's.
    expect(await far.silent(50)).toBe(true);
    b.close();
    expect(parse2(await far.frame())).toMatchObject({
      cmd: 'info-getnodeattr-response',
      rc: '-1',
      errmsg: expect.stringContaining('rank 1'),
    });
    a.close();
    far.close();
  });

  it("fails a barrier at the core's collective deadline, naming the ranks that did not come, and reports each fence", async () => {
    const j = await fx.job(3);
    const [a, b, c] = [await bound(j, 0), await bound(j, 1), await bound(j, 2)];
    fences.length = 0;
    for (const m of [a, b, c]) m.send('cmd=barrier_in\n');
    for (const m of [a, b, c]) expect(parse1(await m.line())).toMatchObject({ cmd: 'barrier_out', rc: '0' });
    a.send('cmd=barrier_in\n');
    const t0 = Date.now();
    const out = parse1(await a.line());
    expect(Date.now() - t0).toBeGreaterThanOrEqual(350);
    expect(out).toMatchObject({
      cmd: 'barrier_out',
      rc: '-1',
      msg: expect.stringContaining('timed_out_after_400_ms_waiting_for_ranks_1,2'),
    });
    // The fence reports reach the core's observer with the next event of the engine.
    for (const m of [a, b, c]) m.close();
    await fx.waitFor(j.job.id, ['failed']);
    await new Promise((r) => setTimeout(r, 50));
    expect(fences.filter(([n]) => n === 'fence').map(([, , o]) => o)).toEqual(['ok', 'timeout']);
  });

  it('takes over a PMI-2 client mid-frame after the initack', async () => {
    const j = await fx.job(1);
    const c = await WireClient.connect(fx.port);
    const body = frame2('cmd=fullinit;pmirank=0;threaded=FALSE;');
    c.send(`cmd=initack pmiid=${j.pmiIds[0]}\n`);
    for (let i = 0; i < 4; i++) await c.line();
    c.send(`cmd=init pmi_version=2 pmi_subversion=0\n${body.slice(0, 9)}`);
    expect(parse1(await c.line())).toMatchObject({ cmd: 'response_to_init', rc: '0', pmi_version: '2' });
    c.send(body.slice(9));
    expect(parse2(await c.frame())).toMatchObject({
      cmd: 'fullinit-response',
      rc: '0',
      rank: '0',
      size: '1',
      'pmi-version': '2',
      pmiverbose: 'FALSE',
    });
    expect(await c.cmd2('cmd=kvs-put;key=a;value=x;;y;')).toMatchObject({ rc: '0' });
    expect(await c.cmd2('cmd=kvs-fence;')).toMatchObject({ rc: '0' });
    // An older (escaping) client gets its ';' back escaped.
    c.send(frame2('cmd=kvs-get;key=a;'));
    expect(await c.frame()).toBe('cmd=kvs-get-response;rc=0;found=TRUE;value=x;;y;');
    expect(await c.cmd2('cmd=finalize;')).toMatchObject({ rc: '0' });
    await fx.waitFor(j.job.id, ['completed']);
    c.close();
  });

  it('loses the member of a client that resets its connection right after its bind, with no internal error', async () => {
    // Whether the reset comes before or after the hand-over to the engine, it is the member's end.
    // A reset that beats the server's accept leaves no owner to check the bind against: the bind
    // is refused and the job fails at its wiring timeout instead (src/pmi/peer-uid.ts), so that
    // bound is short enough for either order to end the job well within the wait below.
    for (let round = 0; round < 20; round++) {
      const j = await fx.job(1, { wiringTimeoutSeconds: 1 });
      const c = await WireClient.connect(fx.port);
      // The bind alone: a command sent along with it would be refused with the bind.
      c.send(`cmd=initack pmiid=${j.pmiIds[0]}\n`);
      if (round % 2) await new Promise((res) => setImmediate(res));
      // A reset, as a client that exits with replies unread sends: Node destroys the server's
      // socket at once and says 'close' only later.
      (c as unknown as { socket: Socket }).socket.resetAndDestroy();
      const ended = await fx.waitFor(j.job.id, ['failed', 'aborted', 'completed'], 5000);
      expect(ended.state, `round ${round}`).toBe('failed');
      await fx.released(j.job.id);
    }
    expect(fx.errors).toEqual([]);
  });

  it('keeps the process alive while it holds connections, as their sockets would', () => {
    // The listener's close hangs up on a rank the engine serves and waits to hear it closed:
    // nothing else keeps this process alive meanwhile.
    const script = `
      import { ResourceManager } from ${JSON.stringify(join(ROOT, 'dist/src/rm/index.js'))};
      import { defaultPolicy } from ${JSON.stringify(join(ROOT, 'dist/src/policy/index.js'))};
      import { PmiBackend } from ${JSON.stringify(join(ROOT, 'dist/src/service/pmi-backend.js'))};
      import { spawn } from 'node:child_process';
      const rm = new ResourceManager({ policy: defaultPolicy({ releaseGraceMs: 100 }) });
      const backend = await PmiBackend.start({ rm, topology: false });
      rm.addBackend(backend);
      rm.registerWorker({ id: 'w', host: 'localhost' });
      const job = await rm.createJob({ impl: 'mpich', members: ['w'] });
      const running = new Promise((resolve) => rm.events.subscribe(({ event: e }) => e.kind === 'jobStateChanged' && e.to === 'running' && resolve()));
      const rank = spawn(${JSON.stringify(BINDER)}, ['sleep', '5'], { env: rm.memberEnv(job.id, 'w').env, stdio: 'ignore' });
      rank.unref();
      await running;
      await backend.close();
      console.log(rm.getJob(job.id).state, rm.getJob(job.id).error);
      rank.kill();
    `;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('failed rank 0 (worker w) was lost: its PMI connection closed before PMI finalize');
  });
});
