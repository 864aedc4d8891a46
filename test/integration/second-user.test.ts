// Another local user against a running sidecar: every TCP port the sidecar's process
// listens on (from the kernel's tables, not from what it says) gets silent connections, PMIx
// handshakes naming a registered rank's and the pool's namespace (with the stranger's own uid and
// lying about it), a tool's, a PMI command and an HTTP request; its UNIX sockets get a connect.
// Each is refused or harmless, and a real Open MPI job runs through the gate meanwhile and after.
// Needs root (to run the stranger as nobody).
import { type ChildProcess, spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServe } from '../../bench/lib/sidecar.js';
import { encodeHandshake, type Handshake, nativeCredential, PeerFlag } from '../../src/pmix/handshake.js';
import { Status } from '../../src/pmix/index.js';
import { bin } from '../helpers/build-clients.js';
import { restClient, SERVE_START_MS, until } from '../helpers/http.js';
import { listeningSockets } from '../helpers/listening.js';
import { ROOT, VENV } from '../helpers/paths.js';
import { describeRanks, startRank } from '../helpers/ranks.js';
import { openmpiJob } from '../helpers/sidecar-jobs.js';

const NOBODY = 65534;
const HOST = hostname();
const isRoot = process.getuid?.() === 0;

interface Exchange {
  error?: string;
  bytes: number;
  head: string;
  text: string;
  status: number | null;
}
interface StrangerReport {
  uid: number;
  ports: Record<string, Record<string, Exchange>>;
  paths: Record<string, Exchange>;
  silentStillOpen: number;
}

const handshake = (over: Partial<Handshake>): string =>
  encodeHandshake({
    psec: 'native',
    credential: nativeCredential(NOBODY, NOBODY),
    flag: PeerFlag.SIMPLE_CLIENT,
    proc: { nspace: 'x', rank: 0 },
    version: '5.0.11',
    bfrops: 'v41',
    bufferType: 1,
    gds: 'hash',
    blob: Buffer.alloc(0),
    ...over,
  }).toString('hex');

describe.skipIf(!isRoot)('a second local user against every port of the sidecar', () => {
  let child: ChildProcess;
  let api: ReturnType<typeof restClient>;
  const ports = { rest: 0, gate: 0, pmi: 0 };
  let libpmixSocket = '';

  beforeAll(async () => {
    const serve = await startServe({
      viaBin: true,
      logLevel: 'info',
      args: ['--pool-size', '8'],
      token: 'tok',
      stderr: 'pipe',
      startMs: SERVE_START_MS,
    });
    child = serve.child;
    const { url, out } = serve;
    ports.rest = Number(/:(\d+)$/.exec(url)![1]);
    ports.gate = Number(/"pmix":"tcp4:\/\/[^"]*:(\d+)"/.exec(out)![1]);
    ports.pmi = Number(/"pmiPort":"[^"]*:(\d+)"/.exec(out)![1]);
    libpmixSocket = /"libpmixSocket":"([^"]+)"/.exec(out)![1]!;
    api = restClient(url, 'tok');
  });
  afterAll(() => {
    child?.kill('SIGKILL');
  });

  async function runJob(n: number): Promise<void> {
    const j = await openmpiJob(api, n, HOST);
    const ranks = j.envs.map((env) => startRank(bin('mpi_job_ompi5'), ['world'], env, 60_000));
    expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual(ranks.map(() => 0));
    await until(
      async () => (await api('GET', `/v1/jobs/${j.id}`)).body.state === 'completed',
      30_000,
      `job ${j.id} completed`,
    );
  }

  it('listens on its REST, gate and PMI ports only: libpmix has no port of its own', () => {
    const listening = listeningSockets(child.pid!)
      .map((s) => s.port)
      .sort((a, b) => a - b);
    expect(listening).toEqual([ports.rest, ports.gate, ports.pmi].sort((a, b) => a - b));
  });

  it('refuses or shrugs off everything the stranger sends, and jobs run meanwhile and after', async () => {
    // A registered rank's namespace (a job's) and the pool's, as a stranger would learn them.
    const job = await openmpiJob(api, 1, HOST);
    const w = (await api('GET', '/v1/workers')).body.workers.find((x: { pool?: { namespace: string } }) => x.pool);
    const pool = w.pool as { namespace: string; rank: number };
    const payloads: Record<string, string> = {
      clientOwnUid: handshake({ proc: { nspace: job.namespace, rank: 0 } }),
      clientLyingUid: handshake({ proc: { nspace: job.namespace, rank: 0 }, credential: nativeCredential(0, 0) }),
      poolRankLyingUid: handshake({
        proc: { nspace: pool.namespace, rank: pool.rank },
        credential: nativeCredential(0, 0),
      }),
      toolOwnUid: handshake({ flag: PeerFlag.TOOL_NEEDS_ID, proc: undefined, uid: NOBODY, gid: NOBODY }),
      toolLyingNamingPool: handshake({
        flag: PeerFlag.TOOL_GIVEN_ID,
        proc: { nspace: pool.namespace, rank: 0 },
        uid: 0,
        gid: 0,
        credential: nativeCredential(0, 0),
      }),
      pmi1: Buffer.from(`cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_my_kvsname\ncmd=barrier_in\n`).toString(
        'hex',
      ),
      http: Buffer.from(`GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n`).toString('hex'),
      junk: Buffer.alloc(4096, 0xab).toString('hex'),
    };
    const plan = {
      ports: Object.values(ports),
      payloads,
      paths: [libpmixSocket],
      silent: 50,
      holdMs: 8000,
      replyMs: 3000,
    };
    const stranger = spawn('node', [join(ROOT, 'test', 'helpers', 'stranger.mjs'), JSON.stringify(plan)], {
      uid: NOBODY,
      gid: NOBODY,
      cwd: '/tmp',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let sout = '';
    let serr = '';
    stranger.stdout!.on('data', (d: Buffer) => (sout += d.toString()));
    stranger.stderr!.on('data', (d: Buffer) => (serr += d.toString()));
    const exited = new Promise<number | null>((r) => stranger.on('close', (c) => r(c)));
    const report = await until(
      () => {
        const line = sout.split('\n')[0];
        return line?.startsWith('{') ? (JSON.parse(line) as StrangerReport) : undefined;
      },
      60_000,
      `the stranger's report (stderr: ${serr})`,
    );
    expect(report.uid).toBe(NOBODY);

    // While the stranger still holds its silent connections: a real job through the gate.
    await runJob(2);

    const gate = report.ports[ports.gate]!;
    for (const k of ['clientOwnUid', 'clientLyingUid', 'poolRankLyingUid'])
      expect(gate[k]!.status, k).toBe(Status.ERR_INVALID_CRED);
    for (const k of ['toolOwnUid', 'toolLyingNamingPool'])
      expect([Status.ERR_INVALID_CRED, Status.ERR_NO_PERMISSIONS], k).toContain(gate[k]!.status);
    for (const k of ['pmi1', 'http', 'junk']) expect(gate[k]!.status, k).toBe(Status.ERR_BAD_PARAM);
    // The REST port answers the stranger 401 without the token.
    expect(Buffer.from(report.ports[ports.rest]!.http!.head, 'hex').toString()).toMatch(/^HTTP\/1\.1 401/);
    // The PMI listener serves nothing but init without a member's credential.
    const pmi = report.ports[ports.pmi]!;
    expect(pmi.pmi1!.text).toMatch(/cmd=my_kvsname rc=-1 msg=no_PMI_ID/);
    for (const k of ['clientOwnUid', 'http', 'junk']) expect(pmi[k]!.text, k).toMatch(/^cmd=error rc=-1/);
    // libpmix's own socket: not even a connection.
    expect(report.paths[libpmixSocket]!.error).toBe('EACCES');

    expect(await exited, serr).toBe(0);
    // After the stranger: the sidecar is healthy, a job of the pool's rank's namespace kind runs.
    expect((await api('GET', '/v1/health')).body).toMatchObject({ status: 'ok' });
    await runJob(2);
    expect(child.exitCode).toBeNull();
    await api('DELETE', `/v1/jobs/${job.id}`);
  }, 180_000);

  it('lets a worker join the pool while the stranger holds 300 silent connections on the gate, and jobs run', async () => {
    const plan = { ports: [ports.gate], payloads: {}, paths: [], silent: 300, holdMs: 20_000 };
    const stranger = spawn('node', [join(ROOT, 'test', 'helpers', 'stranger.mjs'), JSON.stringify(plan)], {
      uid: NOBODY,
      gid: NOBODY,
      cwd: '/tmp',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let sout = '';
    stranger.stdout!.on('data', (d: Buffer) => (sout += d.toString()));
    const exited = new Promise<number | null>((r) => stranger.on('close', (c) => r(c)));
    try {
      await until(() => sout.includes('silentStillOpen'), 30_000, 'the stranger to open its connections');
      // A worker process starts meanwhile and joins the pool: its MPI session's PMIx client
      // comes through the gate among the stranger's connections.
      const id = 'tcp://10.250.9.9:1';
      expect((await api('POST', '/v1/workers', { id, host: HOST, pid: process.pid, uid: 0, gid: 0 })).status).toBe(201);
      const answer = await api('POST', `/v1/workers/${encodeURIComponent(id)}/pool`, {
        host: HOST,
        pid: process.pid,
        uid: 0,
        gid: 0,
      });
      expect(answer.status, JSON.stringify(answer.body)).toBe(200);
      const joiner = startRank(
        join(VENV, 'bin', 'python'),
        [join(ROOT, 'test', 'helpers', 'pool_join.py'), JSON.stringify(answer.body)],
        {},
        120_000,
      );
      expect(await joiner.exited, describeRanks([joiner])).toBe(0);
      const seen = joiner.lines.find((l) => 'state' in l) as { state: string; rank: number } | undefined;
      expect(seen, describeRanks([joiner])).toMatchObject({ state: 'ready', rank: answer.body.pool.rank });
      // And a fork job, through the same flood.
      await runJob(2);
    } finally {
      stranger.kill();
      await exited;
    }
    await runJob(1);
  }, 180_000);
});
