// The gate in front of libpmix: handshakes as libpmix 5.0.11's client and tool write them, and
// every kind of connection that would otherwise reach libpmix's own reading of them.
import { statSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { dirname } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { admit, ClientRegistry } from '../../src/pmix/admission.js';
import { PmixGate } from '../../src/pmix/gate.js';
import {
  encodeHandshake,
  type Handshake,
  HandshakeError,
  nativeCredential,
  nativeCredentialIds,
  PeerFlag,
  parseHandshake,
} from '../../src/pmix/handshake.js';
import { decodeInfoBlob } from '../../src/pmix/handshake-blob.js';
import { Status } from '../../src/pmix/index.js';
import { bin } from '../helpers/build-clients.js';
import { tcpListeningPorts } from '../helpers/listening.js';
import { PmixFixture } from '../helpers/pmix-fixture.js';
import { describeRanks, startRank } from '../helpers/ranks.js';

// Captured from test/clients/pmix_client.c and pmix_tool.c (libpmix 5.0.11) connecting as root.
const CLIENT_HANDSHAKE = Buffer.from(
  'ffffffffffffffff33000000000000006e617469766500000000080000000000000000006361706a6f620000000000352e302e31317263310076343100016861736800',
  'hex',
);
const TOOL_HANDSHAKE = Buffer.from(
  'ffffffffffffffffeb000000000000006e617469766500000000080000000000000000030000000000000000352e302e3131726331007634310001686173680002070e1c706d69782e737276722e7572690000034a706d69782d7365727665722e313b746370343a2f2f3132372e302e302e313a34363436350014706d69782e707069640000050ea8c90114706d69782e7275696400000e0014706d69782e6575696400000e0014706d69782e7267696400000e0014706d69782e6567696400000e001c706d69782e636d642e6c696e650000034c2f776f726b2f682d706d69782f746573742f2e776f726b2f62696e2f706d69785f746f6f6c00',
  'hex',
);

describe('the PMIx handshake', () => {
  it('reads a client handshake as libpmix writes it, and writes it back the same', () => {
    const h = parseHandshake(CLIENT_HANDSHAKE);
    expect(h).toMatchObject({
      psec: 'native',
      flag: PeerFlag.SIMPLE_CLIENT,
      proc: { nspace: 'capjob', rank: 0 },
      version: '5.0.11rc1',
      bfrops: 'v41',
      bufferType: 1,
      gds: 'hash',
    });
    expect(nativeCredentialIds(h)).toEqual({ uid: 0, gid: 0 });
    expect(h.blob.length).toBe(0);
    expect(encodeHandshake(h).equals(CLIENT_HANDSHAKE)).toBe(true);
  });

  it('reads a tool handshake and its info blob', () => {
    const h = parseHandshake(TOOL_HANDSHAKE);
    expect(h).toMatchObject({ flag: PeerFlag.TOOL_NEEDS_ID, uid: 0, gid: 0 });
    expect(encodeHandshake(h).equals(TOOL_HANDSHAKE)).toBe(true);
    const blob = decodeInfoBlob(h.blob);
    expect(blob.map((i) => i.key)).toEqual([
      'pmix.srvr.uri',
      'pmix.ppid',
      'pmix.ruid',
      'pmix.euid',
      'pmix.rgid',
      'pmix.egid',
      'pmix.cmd.line',
    ]);
    expect(blob.find((i) => i.key === 'pmix.ppid')).toMatchObject({ type: 5, value: 25768 });
    expect(blob.find((i) => i.key === 'pmix.euid')).toMatchObject({ type: 14, value: 0 });
  });

  it('refuses truncated, oversized and malformed handshakes with an error, never a guess', () => {
    expect(() => parseHandshake(CLIENT_HANDSHAKE.subarray(0, 40))).toThrow(HandshakeError);
    const long = Buffer.from(CLIENT_HANDSHAKE);
    long.writeUInt32LE(200_000, 8);
    expect(() => parseHandshake(long)).toThrow(/longer than libpmix accepts/);
    const flag = Buffer.from(CLIENT_HANDSHAKE);
    flag[16 + 7 + 4 + 8] = 42;
    expect(() => parseHandshake(flag)).toThrow(/unknown peer flag 42/);
    const tool = parseHandshake(TOOL_HANDSHAKE);
    // A count of infos beyond what the blob holds (libpmix 5.0.11 would try to allocate it).
    expect(() => decodeInfoBlob(Buffer.from([0x02, 0xff, 0xff, 0x03, 0xfe, 0xff, 0x07]))).toThrow(HandshakeError);
    expect(() => decodeInfoBlob(tool.blob.subarray(0, tool.blob.length - 3))).toThrow(HandshakeError);
  });
});

describe('admission', () => {
  it('refuses every tool under the refuse policy, and admits one of its own uid under same-uid', () => {
    const tool = parseHandshake(TOOL_HANDSHAKE);
    const self = { uid: 0, gid: 0 };
    expect(admit(tool, new ClientRegistry(), { tools: 'refuse', self })).toMatchObject({
      ok: false,
      status: Status.ERR_NOT_SUPPORTED,
    });
    expect(admit(tool, new ClientRegistry(), { tools: 'same-uid', self })).toEqual({ ok: true });
    expect(admit(tool, new ClientRegistry(), { tools: 'same-uid', self: { uid: 1000, gid: 1000 } })).toMatchObject({
      ok: false,
      status: Status.ERR_NO_PERMISSIONS,
    });
  });

  it('refuses a peer whose socket belongs to another uid than the one it claims, unless that is root', () => {
    const reg = new ClientRegistry();
    reg.add({ nspace: 'capjob', rank: 0 }, 0, 0);
    const h = parseHandshake(CLIENT_HANDSHAKE);
    const self = { uid: 0, gid: 0 };
    expect(admit(h, reg, { tools: 'same-uid', self, peerUid: 65534 })).toMatchObject({
      ok: false,
      status: Status.ERR_INVALID_CRED,
      reason: 'a connection of uid 65534 claims to be uid 0',
    });
    expect(admit(h, reg, { tools: 'same-uid', self, peerUid: 0 })).toEqual({ ok: true });
    const tool = parseHandshake(TOOL_HANDSHAKE);
    expect(admit(tool, reg, { tools: 'same-uid', self, peerUid: 1000 })).toMatchObject({
      ok: false,
      status: Status.ERR_INVALID_CRED,
    });
  });

  it('asks about a registered client of the right uid, and refuses it with the reason given', () => {
    const reg = new ClientRegistry();
    reg.add({ nspace: 'capjob', rank: 0 }, 0, 0);
    const h = parseHandshake(CLIENT_HANDSHAKE);
    expect(admit(h, reg, { tools: 'same-uid', self: { uid: 0, gid: 0 } })).toEqual({ ok: true });
    expect(admit(h, reg, { tools: 'same-uid', self: { uid: 0, gid: 0 }, client: () => 'job j1 is failed' })).toEqual({
      ok: false,
      status: Status.ERR_NO_PERMISSIONS,
      reason: 'capjob:0: job j1 is failed',
    });
    reg.removeNspace('capjob');
    expect(admit(h, reg, { tools: 'same-uid', self: { uid: 0, gid: 0 } })).toMatchObject({
      ok: false,
      status: Status.ERR_NOT_FOUND,
    });
  });
});

describe('the gate on its own (a stand-in takes the admitted sockets)', () => {
  /** A gate whose admitted sockets go to `taken`, each with the handshake it was handed with. */
  async function standIn(
    opts: {
      peerOf?: (s: Socket) => { key: string };
      maxPendingPerPeer?: number;
      maxPending?: number;
      firstByteMs?: number;
    } = {},
  ) {
    const taken: { fd: number; first: Buffer }[] = [];
    const refused: string[] = [];
    const gate = await PmixGate.listen({
      host: '127.0.0.1',
      admit: () => ({ ok: true }),
      handOver: (fd, first) => taken.push({ fd, first }),
      onRefused: (r) => refused.push(r),
      ...opts,
    });
    return { gate, taken, refused };
  }
  const open = (port: number) =>
    new Promise<Socket>((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => resolve(s));
      s.on('error', reject);
    });
  const closedOf = (s: Socket) => new Promise<void>((r) => (s.destroyed ? r() : s.on('close', () => r())));

  it('hands over an admitted socket with exactly its handshake, and refuses a peer that says more before its answer', async () => {
    const { gate, taken, refused } = await standIn();
    try {
      const a = await open(gate.port);
      a.write(CLIENT_HANDSHAKE);
      await closedOf(a);
      expect(taken.length).toBe(1);
      expect(taken[0]!.first.equals(CLIENT_HANDSHAKE)).toBe(true);
      expect(gate.stats.admitted).toBe(1);
      const b = await open(gate.port);
      const reply: Buffer[] = [];
      b.on('data', (d) => reply.push(d));
      b.write(Buffer.concat([CLIENT_HANDSHAKE, Buffer.from('more')]));
      await closedOf(b);
      expect(Buffer.concat(reply).readInt32BE(0)).toBe(Status.ERR_BAD_PARAM);
      expect(refused.at(-1)).toMatch(/more than its handshake/);
      expect(taken.length).toBe(1);
    } finally {
      await gate.close();
    }
  });

  it('makes room for a newcomer by closing the oldest silent connection of the same peer, and leaves other peers alone', async () => {
    // Two peers told apart by their source port's parity stand for two uids.
    const { gate, taken } = await standIn({
      peerOf: (s) => ({ key: `peer ${s.remotePort! % 2}` }),
      maxPendingPerPeer: 4,
      maxPending: 100,
    });
    try {
      const even: Socket[] = [];
      const odd: Socket[] = [];
      while (even.length < 8) {
        const s = await open(gate.port);
        (s.localPort! % 2 === 0 ? even : odd).push(s);
      }
      const silent = [...even, ...odd];
      await Promise.all(even.slice(0, 4).map(closedOf));
      expect(gate.stats.evicted).toBeGreaterThanOrEqual(4);
      // The other peer's connections (fewer than its bound) are all still open.
      expect(
        odd.slice(-4).every((s) => !s.destroyed),
        `${odd.length} of the other peer's`,
      ).toBe(true);
      // A client of the crowded peer that sends its handshake at once gets through.
      let c = await open(gate.port);
      while (c.localPort! % 2 !== 0) {
        c.destroy();
        c = await open(gate.port);
      }
      c.write(CLIENT_HANDSHAKE);
      await closedOf(c);
      expect(taken.length).toBe(1);
      for (const s of silent) s.destroy();
    } finally {
      await gate.close();
    }
  });

  it('closes a connection that sends no byte within the first-byte deadline, sooner than the handshake deadline', async () => {
    const { gate, refused } = await standIn({ firstByteMs: 200 });
    try {
      const t0 = Date.now();
      const s = await open(gate.port);
      await closedOf(s);
      expect(Date.now() - t0).toBeLessThan(5000);
      expect(refused).toEqual(['no byte of a handshake within the deadline']);
      expect(gate.stats.timedOut).toBe(1);
    } finally {
      await gate.close();
    }
  });
});

describe('the gate', () => {
  let fx: PmixFixture;
  const refusals: string[] = [];
  beforeAll(async () => {
    fx = await PmixFixture.start({ handshakeTimeoutMs: 500, onRefused: (reason) => refusals.push(reason) });
  });
  afterAll(() => fx?.stop());

  const gatePort = () => Number(/:(\d+)$/.exec(fx.server.uri)![1]);

  /** Sends `bytes` and resolves with what the gate answered before closing. */
  function exchange(bytes: Buffer | undefined): Promise<{ reply: Buffer; ms: number }> {
    return new Promise((resolve, reject) => {
      const t0 = Date.now();
      const chunks: Buffer[] = [];
      const s: Socket = connect(gatePort(), '127.0.0.1', () => bytes && s.write(bytes));
      s.on('data', (d) => chunks.push(d));
      s.on('error', reject);
      s.on('close', () => resolve({ reply: Buffer.concat(chunks), ms: Date.now() - t0 }));
    });
  }
  const status = (b: Buffer) => (b.length >= 4 ? b.readInt32BE(0) : undefined);
  const client = (over: Partial<Handshake> = {}): Handshake => ({
    psec: 'native',
    credential: nativeCredential(process.getuid!(), process.getgid!()),
    flag: PeerFlag.SIMPLE_CLIENT,
    proc: { nspace: 'gatejob', rank: 0 },
    version: '5.0.11',
    bfrops: 'v41',
    bufferType: 1,
    gds: 'hash',
    blob: Buffer.alloc(0),
    ...over,
  });

  it('closes a connection that sends nothing at the handshake deadline', async () => {
    const before = fx.server.gateStats.timedOut;
    const { reply, ms } = await exchange(undefined);
    expect(reply.length).toBe(0);
    expect(ms).toBeGreaterThanOrEqual(400);
    expect(fx.server.gateStats.timedOut).toBe(before + 1);
  });

  it('closes a connection that sends part of a handshake at the deadline', async () => {
    const { reply } = await exchange(CLIENT_HANDSHAKE.subarray(0, 20));
    expect(reply.length).toBe(0);
  });

  it('answers a status to handshakes libpmix must not read', async () => {
    await fx.job('gatejob', 2);
    const uid = process.getuid!();
    const gid = process.getgid!();
    const cases: [string, Buffer, number][] = [
      [
        'oversized',
        (() => {
          const b = Buffer.from(CLIENT_HANDSHAKE);
          b.writeUInt32LE(200_000, 8);
          return b.subarray(0, 16);
        })(),
        Status.ERR_BAD_PARAM,
      ],
      ['garbage', Buffer.concat([CLIENT_HANDSHAKE.subarray(0, 16), Buffer.alloc(0x33, 0xff)]), Status.ERR_BAD_PARAM],
      ['unregistered', encodeHandshake(client({ proc: { nspace: 'nobody-knows', rank: 0 } })), Status.ERR_NOT_FOUND],
      ['other uid', encodeHandshake(client({ credential: nativeCredential(4242, gid) })), Status.ERR_INVALID_CRED],
      ['other gid', encodeHandshake(client({ credential: nativeCredential(uid, 4242) })), Status.ERR_INVALID_CRED],
      [
        'no credential',
        encodeHandshake(client({ psec: 'none', credential: Buffer.alloc(0) })),
        Status.ERR_INVALID_CRED,
      ],
      ['unknown bfrops', encodeHandshake(client({ bfrops: 'v99' })), Status.ERR_NOT_SUPPORTED],
      ['unknown gds', encodeHandshake(client({ gds: 'nosuch' })), Status.ERR_NOT_SUPPORTED],
      [
        'launcher',
        encodeHandshake(client({ flag: PeerFlag.LAUNCHER_NEEDS_ID, uid, gid, proc: undefined })),
        Status.ERR_NOT_SUPPORTED,
      ],
      ['singleton', encodeHandshake(client({ flag: PeerFlag.SINGLETON_CLIENT, uid, gid })), Status.ERR_NOT_SUPPORTED],
      [
        'tool of another uid',
        encodeHandshake(client({ flag: PeerFlag.TOOL_NEEDS_ID, uid: 4242, gid, proc: undefined })),
        Status.ERR_NO_PERMISSIONS,
      ],
      [
        'tool claiming a job',
        encodeHandshake(client({ flag: PeerFlag.TOOL_GIVEN_ID, uid, gid })),
        Status.ERR_NO_PERMISSIONS,
      ],
      [
        'lying blob',
        encodeHandshake(
          client({
            blob: Buffer.from([0x02, 0x01, 0x02, 0x14, ...Buffer.from('pmix.euid\0'), 0x00, 0x0e, 0x92, 0x21]),
          }),
        ),
        Status.ERR_INVALID_CRED,
      ],
    ];
    for (const [what, bytes, want] of cases) {
      const { reply } = await exchange(bytes);
      expect(status(reply), what).toBe(want);
    }
    expect(refusals.some((r) => /runs as uid 4242/.test(r))).toBe(true);
  });

  it('lets a real client through while 300 connections that send nothing are held open', async () => {
    const silent: Socket[] = [];
    try {
      for (let i = 0; i < 300; i++) {
        const s = connect(gatePort(), '127.0.0.1');
        s.on('error', () => undefined);
        silent.push(s);
      }
      await new Promise((r) => setTimeout(r, 200));
      const envs = await fx.job('gatecrowd', 2);
      const ranks = envs.map((e) => startRank(bin('pmix_client'), ['put-get'], e, 30_000));
      expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual([0, 0]);
      expect(fx.server.gateStats.evicted).toBeGreaterThan(0);
    } finally {
      for (const s of silent) s.destroy();
    }
  });

  it("asks a client to retry while the server is busy, and libpmix's client connects again as often as its environment says", async () => {
    const [env] = await fx.job('gateretry', 1);
    let attempts = 0;
    const busy = await PmixGate.listen({
      host: '127.0.0.1',
      admit: () => {
        attempts++;
        return { ok: true };
      },
      handOver: () => undefined,
      busy: () => 'a test says so',
      retryPauseMs: 100,
    });
    try {
      const uri = (v: string) => v.replace(/tcp4:\/\/127\.0\.0\.1:\d+/, `tcp4://127.0.0.1:${busy.port}`);
      const redirected = Object.fromEntries(
        Object.entries(env!).map(([k, v]) => [k, k.startsWith('PMIX_SERVER_URI') ? uri(v) : v]),
      );
      expect(redirected.PMIX_MCA_ptl_base_handshake_max_retries).toBe('60');
      const r = startRank(
        bin('pmix_client'),
        ['fence'],
        { ...redirected, PMIX_MCA_ptl_base_handshake_max_retries: '3' },
        30_000,
      );
      expect(await r.exited, describeRanks([r])).not.toBe(0);
      // max_retries counts attempts: the first one and two more.
      expect(attempts).toBe(3);
      expect(busy.stats.retried).toBe(3);
    } finally {
      await busy.close();
    }
  });

  it('lets a real client through after all of that, handing its socket to libpmix', async () => {
    const before = fx.server.gateStats;
    const envs = await fx.job('gateok', 2);
    const ranks = envs.map((e) => startRank(bin('pmix_client'), ['put-get'], e, 30_000));
    expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual([0, 0]);
    const after = fx.server.gateStats;
    expect(after.handedOff - before.handedOff).toBe(2);
    expect(after.relayed).toBe(0);
  });

  it("leaves libpmix no TCP listener: only a UNIX socket in a directory of this uid's", async () => {
    const path = fx.server.libpmixSocket;
    const dir = statSync(dirname(path));
    expect(dir.mode & 0o077).toBe(0);
    expect(dir.uid).toBe(process.getuid!());
    expect(statSync(path).isSocket()).toBe(true);
    // The loopback port libpmix listened on at init is closed: the gate is this process's only one.
    const listening = tcpListeningPorts();
    expect(listening).toContain(gatePort());
    expect(listening.length, `this process listens on ${listening.join(', ')}`).toBe(1);
  });
});
