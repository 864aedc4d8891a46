// A PMI bind from this host is held to the uid its member's worker registered with (issue 31):
// another user holding a job's environment (its PMI_ID) is refused with the reason, over TCP (the
// kernel's socket table, the addon's peerUid, as the PMIx gate asks it) and on the UNIX socket
// (SO_PEERCRED). The refusal changes nothing: the rightful rank binds afterwards with the same
// credential and other jobs never notice. Root's connections are excepted, as in PMIx admission.
// A TCP peer whose socket is gone before its connection is accepted is refused too: the kernel
// reports a closed socket as uid 0 and forgets a reset one.
//
// The second uid: as root (the CI here), strangers and rightful ranks run as other users (spawn's
// uid); otherwise the member's worker is registered with a uid that is not ours, and our own
// connections are the stranger. Either way the uid comes from the kernel.
import { spawnSync } from 'node:child_process';
import { chmodSync, statSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PmiError } from '../../src/pmi/errors.js';
import { checkPeerUid, isThisHost, type PeerUid, peerUidOf, peerUidRefusal, tcpEnds } from '../../src/pmi/peer-uid.js';
import { PmiWorlds } from '../../src/service/pmi-worlds.js';
import { BINDER, ROOT } from '../helpers/paths.js';
import { runProgram } from '../helpers/run-program.js';
import { type FixtureJob, PmiRmFixture } from './helpers/rm-fixture.js';
import { frame2, parse1, WireClient } from './helpers/wire-client.js';

const SELF = process.getuid!();
const isRoot = SELF === 0;
const NOBODY = 65534;
/** The uid the members' workers are registered with in the root tests (no such user is needed). */
const WORKER_UID = 4242;
const HELPER = join(ROOT, 'test', 'pmi', 'helpers', 'bind-as.mjs');

const refusal = (peer: number, worker: number) =>
  `a connection of uid ${peer} may not bind this rank: its worker runs as uid ${worker}`;
const CLOSED =
  'the connection closed before the server accepted it, so whose it was cannot be told: a rank binds on a connection that waits for the reply';
/** PMI-1's form of a message: one token, spaces made `_`. */
const token = (msg: string) => msg.replace(/ /g, '_');

describe('peerUidRefusal: the rule', () => {
  it.each<[PeerUid, number, string | undefined]>([
    [WORKER_UID, WORKER_UID, undefined],
    [0, WORKER_UID, undefined],
    [0, 0, undefined],
    ['remote', WORKER_UID, undefined],
    ['unknown', WORKER_UID, undefined],
    [NOBODY, WORKER_UID, refusal(NOBODY, WORKER_UID)],
    [WORKER_UID, 0, refusal(WORKER_UID, 0)],
    [WORKER_UID + 1, WORKER_UID, refusal(WORKER_UID + 1, WORKER_UID)],
    ['closed', WORKER_UID, CLOSED],
    ['closed', 0, CLOSED],
  ])('a peer %s binding a rank of uid %s: %s', (peer, uid, want) => {
    expect(peerUidRefusal(peer, uid)).toBe(want);
  });

  it('checkPeerUid throws the refusal as a PmiError with rc -1, and nothing when the bind may go on', () => {
    expect(() => checkPeerUid(WORKER_UID, WORKER_UID)).not.toThrow();
    let err: unknown;
    try {
      checkPeerUid(NOBODY, WORKER_UID);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(PmiError);
    expect(err).toMatchObject({ rc: -1, message: refusal(NOBODY, WORKER_UID) });
  });

  it("knows this host's addresses, loopback and IPv4-mapped included", () => {
    for (const a of ['127.0.0.1', '127.9.9.9', '::1', '::ffff:127.0.0.1']) expect(isThisHost(a), a).toBe(true);
    for (const list of Object.values(networkInterfaces()))
      for (const i of list ?? []) expect(isThisHost(i.address), i.address).toBe(true);
    for (const a of ['192.0.2.1', '2001:db8::1', '::ffff:192.0.2.1']) expect(isThisHost(a), a).toBe(false);
  });
});

describe("peerUidOf: the kernel's owner of the peer's socket", () => {
  let tcp: Server;
  let unix: Server;
  const path = join(tmpdir(), `dask-pmix-peer-uid-${process.pid}.sock`);
  const accepted: Socket[] = [];
  const listen = (s: Server, ...args: unknown[]) =>
    new Promise<void>((resolve) => (s.listen as (...a: unknown[]) => void)(...args, () => resolve()));
  beforeAll(async () => {
    // Paused: nothing is read, so the server's end stays open whatever the client does.
    tcp = createServer({ pauseOnConnect: true }, (s) => accepted.push(s));
    unix = createServer({ pauseOnConnect: true }, (s) => accepted.push(s));
    await listen(tcp, 0, '127.0.0.1');
    await listen(unix, path);
  });
  afterAll(() => {
    for (const s of accepted) s.destroy();
    tcp.close();
    unix.close();
  });

  /** A client connected to `to`, and the server's end of it. */
  async function pair(to: number | string): Promise<{ client: Socket; server: Socket }> {
    const before = accepted.length;
    const client = typeof to === 'number' ? connect(to, '127.0.0.1') : connect(to);
    client.on('error', () => {});
    await new Promise<void>((r) => client.once('connect', () => r()));
    await until(() => accepted.length > before || undefined, 2000, 'the accept');
    return { client, server: accepted[before]! };
  }
  const tcpPort = () => (tcp.address() as { port: number }).port;
  const fdOf = (s: Socket) => (s as unknown as { _handle?: { fd?: number } })._handle?.fd;

  it('over TCP: our own uid while the client holds its socket', async () => {
    const { client, server } = await pair(tcpPort());
    expect(peerUidOf({ via: 'tcp', ends: tcpEnds(server) })).toBe(SELF);
    client.destroy();
  });

  it.each(['close', 'reset'] as const)(
    'over TCP: closed once the client %ss (the kernel says uid 0, or nothing)',
    async (how) => {
      const { client, server } = await pair(tcpPort());
      const ends = tcpEnds(server);
      if (how === 'close') client.destroy();
      else client.resetAndDestroy();
      const seen = await until(
        () => {
          const p = peerUidOf({ via: 'tcp', ends });
          return p === SELF ? undefined : p;
        },
        2000,
        'the client to be gone',
      );
      expect(seen).toBe('closed');
    },
  );

  it('over TCP: closed when the socket was gone before it was accepted (no ends)', () => {
    expect(peerUidOf({ via: 'tcp', ends: undefined })).toBe('closed');
  });

  it('on a UNIX socket: the connecting process, also after it closed (SO_PEERCRED is taken at connect)', async () => {
    const { client, server } = await pair(path);
    expect(peerUidOf({ via: 'unix', fd: fdOf(server) })).toBe(SELF);
    client.destroy();
    await new Promise((r) => setTimeout(r, 50));
    expect(peerUidOf({ via: 'unix', fd: fdOf(server) })).toBe(SELF);
    expect(peerUidOf({ via: 'unix', fd: undefined })).toBe('closed');
  });
});

// ---- the PMI server, through the resource manager ----------------------------------------------

interface BindResult {
  uid: number;
  text: string;
  error?: string;
  timedOut: boolean;
}

function spawnAs(uid: number | undefined, cmd: string, args: readonly string[], env: Record<string, string>) {
  return runProgram([cmd, ...args], env, { cwd: '/tmp', ...(uid !== undefined ? { uid } : {}) });
}

/** One bind by the helper running as `uid`: see helpers/bind-as.mjs. */
async function bindAs(
  uid: number,
  plan: { port?: number; path?: string; payload: string; mode?: 'read' | 'close' | 'reset'; replyMs?: number },
): Promise<BindResult> {
  const r = await spawnAs(uid, process.execPath, [HELPER, JSON.stringify(plan)], {});
  expect(r.code, r.err).toBe(0);
  return JSON.parse(r.out) as BindResult;
}

/**
 * A rank through `dask-pmix exec` (the binder) as `uid`: PMI-1 barrier then finalize on the
 * PMI_FD it is handed, their replies printed.
 */
const RANK_SCRIPT =
  'printf "cmd=barrier_in\\n" >&"$PMI_FD"; read -r a <&"$PMI_FD"; ' +
  'printf "cmd=finalize\\n" >&"$PMI_FD"; read -r b <&"$PMI_FD"; echo "$a|$b"';
const rankAs = (uid: number | undefined, env: Record<string, string>) =>
  spawnAs(uid, BINDER, ['/bin/sh', '-c', RANK_SCRIPT], env);
const RANK_DONE = 'cmd=barrier_out rc=0|cmd=finalize_ack rc=0\n';

async function until<T>(f: () => T | undefined, ms: number, what: string): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = f();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const initack = (j: FixtureJob, rank: number) => `cmd=initack pmiid=${j.pmiIds[rank]}\n`;
const fullinit = (j: FixtureJob, rank: number) =>
  frame2(`cmd=fullinit;pmi-version=2;pmi-subversion=0;pmirank=${j.pmiIds[rank]};`);

describe.skipIf(!isRoot)('a stranger of another uid holding a job environment (run as other users)', () => {
  let fx: PmiRmFixture;
  beforeAll(async () => {
    fx = await PmiRmFixture.start({ traceOn: true });
  });
  afterAll(() => fx.stop());

  const memberStates = (j: FixtureJob) => fx.rm.getJob(j.job.id).members.map((m) => m.state);
  /** The replies the server wrote to binds (PMI-1 initack, PMI-2 fullinit), in order. */
  const bindReplies = () =>
    fx.trace
      .filter((e) => e.dir === 'out' && /^(cmd=initack |\s*\d+cmd=fullinit-response;)/.test(e.text))
      .map((e) => e.text);

  it('is refused over TCP, PMI-1 and PMI-2 and through dask-pmix exec, with the reason; the ranks then bind as their worker and the job completes; another job is untouched', async () => {
    const j = await fx.job(2, { uid: WORKER_UID });
    const other = await fx.job(1, { uid: WORKER_UID });
    const open = fx.backend.listener.connectionCount;

    expect(await bindAs(NOBODY, { port: fx.port, payload: initack(j, 0) })).toEqual({
      uid: NOBODY,
      text: `cmd=initack rc=-1 msg=${token(refusal(NOBODY, WORKER_UID))}\n`,
      timedOut: false,
    });
    expect(await bindAs(NOBODY, { port: fx.port, payload: fullinit(j, 1) })).toEqual({
      uid: NOBODY,
      text: frame2(`cmd=fullinit-response;rc=-1;errmsg=${refusal(NOBODY, WORKER_UID)};`),
      timedOut: false,
    });
    // The binder itself, as in the issue: it reports the server's reason and runs nothing.
    const exec = await spawnAs(NOBODY, BINDER, ['/bin/echo', 'ran'], j.envs[0]!);
    expect(exec.code).toBe(3);
    expect(exec.out).toBe('');
    expect(exec.err).toBe(
      `dask-pmix: the PMI server refused this rank: ${refusal(NOBODY, WORKER_UID).replace(/_/g, ' ')}\n`,
    );
    // The server closed each of them, and nothing of either job moved.
    await until(() => (fx.backend.listener.connectionCount === open ? true : undefined), 2000, 'the closes');
    expect(memberStates(j)).toEqual(['assigned', 'assigned']);
    expect(fx.state(j.job.id)).toBe('pending');
    expect(memberStates(other)).toEqual(['assigned']);
    expect(fx.state(other.job.id)).toBe('pending');

    // The same credentials bind from their worker's uid, through the binder (over TCP: the UNIX
    // socket's directory is the sidecar's, 0700), and the job runs to its end.
    const ranks = await Promise.all(j.envs.map((env) => rankAs(WORKER_UID, env)));
    for (const r of ranks) expect(r, r.err).toMatchObject({ code: 0, out: RANK_DONE });
    expect((await fx.waitFor(j.job.id, ['completed', 'failed'])).state).toBe('completed');
    expect(memberStates(other)).toEqual(['assigned']);
    expect(await rankAs(WORKER_UID, other.envs[0]!)).toMatchObject({ code: 0, out: RANK_DONE });
    expect((await fx.waitFor(other.job.id, ['completed', 'failed'])).state).toBe('completed');
    expect(fx.errors).toEqual([]);
  });

  it.each(['close', 'reset'] as const)(
    'is refused when it sent the credential and was gone (%s) before the server read it; the job does not fail',
    async (mode) => {
      const j = await fx.job(1, { uid: WORKER_UID });
      const before = bindReplies().length;
      // Synchronous: the server (this process) reads nothing until the stranger has exited. Its
      // socket is then closed (the kernel reports uid 0 for it: root, were that believed) or,
      // reset, no longer in the kernel's table at all (as a peer elsewhere would be).
      const plan = { port: fx.port, payload: initack(j, 0), mode };
      const r = spawnSync(process.execPath, [HELPER, JSON.stringify(plan)], {
        uid: NOBODY,
        gid: NOBODY,
        cwd: '/tmp',
        encoding: 'utf8',
        timeout: 20_000,
      });
      expect(r.status, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ uid: NOBODY, text: '' });
      expect(await until(() => bindReplies()[before], 5000, 'the reply to the bind')).toBe(
        `cmd=initack rc=-1 msg=${token(CLOSED)}\n`,
      );
      await new Promise((res) => setTimeout(res, 200));
      expect(memberStates(j)).toEqual(['assigned']);
      expect(fx.state(j.job.id)).toBe('pending');
      expect(await rankAs(WORKER_UID, j.envs[0]!)).toMatchObject({ code: 0, out: RANK_DONE });
      expect((await fx.waitFor(j.job.id, ['completed', 'failed'])).state).toBe('completed');
    },
  );

  it("is refused on the UNIX socket (SO_PEERCRED) once it can reach it; the worker's uid and root bind there", async () => {
    const path = fx.backend.listener.socketPath!;
    const dir = dirname(path);
    const modes = { dir: statSync(dir).mode & 0o777, sock: statSync(path).mode & 0o777 };
    // The directory (0700) keeps other users out; opened up here, the uid check stands alone.
    chmodSync(dir, 0o755);
    chmodSync(path, 0o777);
    try {
      const j = await fx.job(1, { uid: WORKER_UID });
      const first = fx.trace.length;
      expect(await bindAs(NOBODY, { path, payload: initack(j, 0) })).toEqual({
        uid: NOBODY,
        text: `cmd=initack rc=-1 msg=${token(refusal(NOBODY, WORKER_UID))}\n`,
        timedOut: false,
      });
      expect(fx.trace.slice(first).find((e) => e.dir === 'open')?.text).toBe('local socket');
      expect(memberStates(j)).toEqual(['assigned']);

      // Its worker's uid: the binder now reaches the socket and takes it.
      const opened = fx.trace.length;
      expect(await rankAs(WORKER_UID, j.envs[0]!)).toMatchObject({ code: 0, out: RANK_DONE });
      expect(fx.trace.slice(opened).find((e) => e.dir === 'open')?.text).toBe('local socket');
      expect((await fx.waitFor(j.job.id, ['completed', 'failed'])).state).toBe('completed');

      // Root's own connection binds a rank of another uid (root may start ranks as any user).
      const k = await fx.job(1, { uid: WORKER_UID });
      const c = await WireClient.connect(path);
      c.send(initack(k, 0));
      expect(parse1(await c.line())).toMatchObject({ cmd: 'initack', rc: '0' });
      c.close();
      await fx.rm.deleteJob(k.job.id);
    } finally {
      chmodSync(dir, modes.dir);
      chmodSync(path, modes.sock);
    }
  });

  it('lets root bind a rank of another uid over TCP too (as PMIx admission does)', async () => {
    const j = await fx.job(1, { uid: WORKER_UID });
    const c = await fx.bound(j, 0);
    expect(memberStates(j)).toEqual(['connected']);
    c.send('cmd=finalize\n');
    expect(parse1(await c.line())).toMatchObject({ cmd: 'finalize_ack', rc: '0' });
    expect((await fx.waitFor(j.job.id, ['completed', 'failed'])).state).toBe('completed');
    c.close();
  });

  it("holds an MPICH worker's in-process world to its uid as well", async () => {
    fx.rm.installWorlds(new PmiWorlds(fx.rm, fx.backend));
    fx.rm.registerWorker({ id: 'world-worker', host: 'localhost' });
    const { env } = await fx.rm.joinPool(
      'world-worker',
      { host: 'localhost', uid: WORKER_UID, gid: WORKER_UID },
      0,
      'mpich',
    );
    expect(await bindAs(NOBODY, { port: fx.port, payload: `cmd=initack pmiid=${env.PMI_ID}\n` })).toMatchObject({
      text: `cmd=initack rc=-1 msg=${token(refusal(NOBODY, WORKER_UID))}\n`,
    });
    expect(fx.rm.getWorker('world-worker').pool?.state).toBe('joining');
    const finalize = 'printf "cmd=finalize\\n" >&"$PMI_FD"; read -r b <&"$PMI_FD"; echo "$b"';
    expect(await spawnAs(WORKER_UID, BINDER, ['/bin/sh', '-c', finalize], env)).toMatchObject({
      code: 0,
      out: 'cmd=finalize_ack rc=0\n',
    });
    expect(fx.rm.getWorker('world-worker').pool?.state).toBe('retired');
  });
});

describe.skipIf(isRoot)('a connection of our own uid binding a rank registered as another (no second uid here)', () => {
  let fx: PmiRmFixture;
  beforeAll(async () => {
    fx = await PmiRmFixture.start();
  });
  afterAll(() => fx.stop());

  it.each(['TCP', 'the UNIX socket'] as const)('is refused over %s, and a job of our uid binds', async (over) => {
    const theirs = await fx.job(1, { uid: SELF + 1 });
    const ours = await fx.job(1);
    const to = over === 'TCP' ? fx.port : fx.backend.listener.socketPath!;
    const c = await WireClient.connect(to);
    c.send(initack(theirs, 0));
    expect(await c.line()).toBe(`cmd=initack rc=-1 msg=${token(refusal(SELF, SELF + 1))}`);
    await c.closed;
    expect(fx.rm.getJob(theirs.job.id).members.map((m) => m.state)).toEqual(['assigned']);
    expect(fx.state(theirs.job.id)).toBe('pending');
    expect(await rankAs(undefined, ours.envs[0]!)).toMatchObject({ code: 0, out: RANK_DONE });
    expect((await fx.waitFor(ours.job.id, ['completed', 'failed'])).state).toBe('completed');
    await fx.rm.deleteJob(theirs.job.id);
  });
});
