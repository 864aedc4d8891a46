// The PMIx server's TCP port against connections that would jam it: one that sends
// nothing, a client of another uid, connections of this uid's that bypass the gate (libpmix's own
// listener is a UNIX socket only this uid reaches), and a libpmix wedged on purpose, which health
// must report and SIGTERM must still end.
import { spawn } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServe } from '../../bench/lib/sidecar.js';
import { encodeHandshake, nativeCredential, PeerFlag } from '../../src/pmix/handshake.js';
import { Status } from '../../src/pmix/index.js';
import { bin } from '../helpers/build-clients.js';
import { restClient, SERVE_START_MS, until } from '../helpers/http.js';
import { cleanEnv, describeRanks, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';
import { openmpiJob } from '../helpers/sidecar-jobs.js';

const HOST = hostname();
const NOBODY = 65534;

function openSilent(where: number | string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s =
      typeof where === 'string' ? connect(where, () => resolve(s)) : connect(where, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

const closed = (s: Socket) => new Promise<void>((r) => (s.destroyed ? r() : s.on('close', () => r())));

/** A client handshake as libpmix 5.0.11's client writes it, claiming `uid`. */
function clientHandshake(nspace: string, rank: number, uid: number, gid: number): Buffer {
  return encodeHandshake({
    psec: 'native',
    credential: nativeCredential(uid, gid),
    flag: PeerFlag.SIMPLE_CLIENT,
    proc: { nspace, rank },
    version: '5.0.11',
    bfrops: 'v41',
    bufferType: 1,
    gds: 'hash',
    blob: Buffer.alloc(0),
  });
}

describe('the PMIx listener against connections that jammed it', () => {
  let fx: SidecarFixture;

  beforeAll(async () => {
    fx = await SidecarFixture.start('listener', {
      releaseGraceMs: 1000,
      pmixHandshakeTimeoutMs: 120_000,
      pmixFirstByteMs: 120_000,
    });
  });
  afterAll(() => fx?.stop());

  const job = (n: number) => openmpiJob(fx.api, n, HOST);

  async function runOpenMpiJob(n: number): Promise<void> {
    const j = await job(n);
    const ranks = j.envs.map((env) => startRank(bin('mpi_job_ompi5'), ['world'], env, 60_000));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    expect(codes, describeRanks(ranks)).toEqual(ranks.map(() => 0));
    await until(
      async () => (await fx.api('GET', `/v1/jobs/${j.id}`)).body.state === 'completed',
      20_000,
      `job ${j.id} completed`,
    );
  }

  it('creates and runs an Open MPI job while a connection that sends nothing is held open', async () => {
    const port = Number(/:(\d+)$/.exec(fx.sidecar.pmix.uri)![1]);
    const silent = await openSilent(port);
    try {
      await runOpenMpiJob(2);
      expect(silent.destroyed, 'the silent connection is still open').toBe(false);
      expect((await fx.api('GET', '/v1/health')).body).toMatchObject({ status: 'ok' });
    } finally {
      silent.destroy();
    }
  });

  it('closes a connection straight to libpmix that sends nothing, and goes on serving', async () => {
    const silent = await openSilent(fx.sidecar.pmix.libpmixSocket);
    const gone = closed(silent);
    const t0 = Date.now();
    const j = await job(1);
    expect(Date.now() - t0, 'job creation waited for the stranger to be closed').toBeLessThan(15_000);
    await gone;
    const r = startRank(bin('pmix_client'), ['fence'], j.envs[0]!, 30_000);
    expect(await r.exited, describeRanks([r])).toBe(0);
  });

  it('refuses a client of another uid with a status, and the others of its job and later jobs work', async () => {
    const j = await job(2);
    const refusedBefore = fx.sidecar.pmix.gateStats.refused;
    // Rank 0 runs as another user than its worker was registered with.
    const child = spawn(bin('pmix_client'), ['fence'], {
      env: cleanEnv(j.envs[0]!),
      uid: NOBODY,
      gid: NOBODY,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
    // libpmix's PMIx_Init reports every refused connection as PMIX_ERR_UNREACH; the gate said why.
    expect(code, out).toBe(2);
    expect(JSON.parse(out.trim().split('\n')[0]!)).toMatchObject({ error: 'init', status: Status.ERR_UNREACH });
    expect(fx.sidecar.pmix.gateStats.refused).toBe(refusedBefore + 1);
    // Its peer of the same namespace connecting next is what wedged libpmix before.
    const peer = startRank(bin('pmix_client'), ['hang'], j.envs[1]!, 30_000);
    await peer.waitFor((l) => l.init === true, 20_000);
    peer.kill();
    await peer.exited;
    expect((await fx.api('DELETE', `/v1/jobs/${j.id}`)).status).toBeLessThan(300);
    await runOpenMpiJob(2);
    expect((await fx.api('GET', '/v1/health')).body).toMatchObject({ status: 'ok' });
  });
});

describe('a sidecar whose libpmix is wedged', () => {
  it('reports it in /v1/health and still ends on SIGTERM', async () => {
    const serve = await startServe({
      viaBin: true,
      logLevel: 'info',
      args: ['--no-pmi'],
      token: 'tok',
      stderr: 'pipe',
      startMs: SERVE_START_MS,
    });
    const { child, url } = serve;
    // 'close', not 'exit': what it logged last must have been read.
    const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
    const sockets: Socket[] = [];
    try {
      const libpmixSocket = /"libpmixSocket":"([^"]+)"/.exec(serve.out)?.[1] ?? '';
      expect(libpmixSocket).toMatch(/dask-pmix-pmix-/);
      const api = restClient(url, 'tok');
      expect(
        (
          await api('POST', '/v1/workers', {
            id: 'w0',
            host: HOST,
            pid: process.pid,
            uid: process.getuid!(),
            gid: process.getgid!(),
          })
        ).status,
      ).toBe(201);
      const job = (await api('POST', '/v1/jobs', { impl: 'openmpi', members: ['w0'] })).body;

      // Straight to libpmix, past the gate (only this uid can): a client of the wrong uid (libpmix
      // 5.0.11 frees the rank's record while it is still listed), then the right one, which wedges
      // its progress thread.
      for (const uid of [4242, process.getuid!()]) {
        const s = await openSilent(libpmixSocket);
        sockets.push(s);
        s.on('error', () => undefined);
        s.write(clientHandshake(job.namespace, 0, uid, process.getgid!()));
        await new Promise((r) => setTimeout(r, 300));
      }
      const health = await until(
        async () => {
          const h = await api('GET', '/v1/health');
          return h.status === 503 ? h : undefined;
        },
        30_000,
        'health to report the stall',
      );
      expect(health.body).toMatchObject({ status: 'pmix-stalled' });
      expect(health.body.pmixStalledSeconds).toBeGreaterThan(1);

      child.kill('SIGTERM');
      const code = await Promise.race([exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 60_000))]);
      const said = `stdout: ${serve.out.slice(-3000)}\nstderr: ${serve.err.slice(-2000)}`;
      expect(code, said).not.toBe('hung');
      expect(code, said).toBe(1);
      expect(serve.out, said).toMatch(/stopping did not finish in time/);
    } finally {
      for (const s of sockets) s.destroy();
      child.kill('SIGKILL');
    }
  }, 120_000);
});
