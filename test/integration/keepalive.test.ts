// A host that goes away without a FIN: its members' connections to the sidecar are
// noticed dead by TCP keepalive with a user timeout, and the job fails as for any lost member;
// and a job's namespace whose clients stay connected after it ended is torn down after
// pmixDrainTimeoutMs. A network namespace on a bridge stands for the host; its link is taken
// down under a PMIx client (handed to libpmix by the gate) and a PMI member, which are then
// killed: nothing they send reaches the sidecar. Needs root and iproute2 (skipped otherwise).
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeNetwork, removeNetwork } from '../../bench/lib/netns.js';
import { bin } from '../helpers/build-clients.js';
import { until } from '../helpers/http.js';
import { cleanEnv, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';

const TAG = `dpka${process.pid % 10000}`;
const SUBNET = `10.${150 + (process.pid % 50)}.9`;
const SERVER_IP = `${SUBNET}.1`;
const HOST = { ns: `${TAG}a`, host: 'node-ka', ip: `${SUBNET}.2` };
const NETWORK = { bridge: `br-${TAG}`, serverIp: SERVER_IP, hosts: [HOST] };
// Noticed within a few seconds: 1 s of silence, then 2 probes 1 s apart; 3 s for data unacknowledged.
const KEEPALIVE = { idleMs: 1000, intervalMs: 1000, count: 2, userTimeoutMs: 3000 };

const available = makeNetwork(NETWORK);
let fx: SidecarFixture;
let nextWorker = 0;
const children: ChildProcess[] = [];

beforeAll(async () => {
  if (!available) return;
  fx = await SidecarFixture.onBridge('keepalive', NETWORK, { keepAlive: KEEPALIVE, pmixDrainTimeoutMs: 1500 });
});
afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  await fx?.stop();
  removeNetwork(NETWORK);
});

const link = (state: 'up' | 'down') =>
  execFileSync('ip', ['netns', 'exec', HOST.ns, 'ip', 'link', 'set', 'eth0', state], { stdio: 'pipe' });

async function jobOn(impl: 'openmpi' | 'mpich', host: string): Promise<{ id: string; env: Record<string, string> }> {
  const id = `tcp://${HOST.ip}:${5000 + nextWorker++}`;
  expect(
    (await fx.api('POST', '/v1/workers', { id, host, pid: 1, uid: process.getuid!(), gid: process.getgid!() })).status,
  ).toBe(201);
  const created = await fx.api('POST', '/v1/jobs', { impl, members: [id] });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const env = (await fx.api('GET', `/v1/jobs/${created.body.id}/env/${encodeURIComponent(id)}`)).body.env as Record<
    string,
    string
  >;
  return { id: created.body.id, env };
}

async function failsWithin(jobId: string, ms: number): Promise<{ state: string; error: string; seconds: number }> {
  const t0 = Date.now();
  const job = await until(
    async () => {
      const j = (await fx.api('GET', `/v1/jobs/${jobId}`)).body;
      return j.state === 'running' || j.state === 'created' || j.state === 'wiring' ? undefined : j;
    },
    ms,
    `job ${jobId} to end`,
  );
  return { state: job.state, error: String(job.error ?? ''), seconds: (Date.now() - t0) / 1000 };
}

describe.skipIf(!available)('a host lost without a FIN', () => {
  it('fails the job of a PMIx client whose host vanished, once keepalive gives up on its connection', async () => {
    link('up');
    const { id, env } = await jobOn('openmpi', HOST.host);
    const rank = startRank('ip', ['netns', 'exec', HOST.ns, bin('pmix_client'), 'hang'], env, 60_000);
    await rank.waitFor((l) => l.init === true, 30_000);
    link('down');
    rank.kill();
    await rank.exited;
    const ended = await failsWithin(id, 30_000);
    expect(ended.state, JSON.stringify(ended)).toBe('failed');
    expect(ended.error).toMatch(/lost|connection/i);
    expect(fx.sidecar.pmix.gateStats.handedOff).toBeGreaterThan(0);
  });

  it('fails the job of a PMI member whose host vanished, once keepalive gives up on its connection', async () => {
    link('up');
    const { id, env } = await jobOn('mpich', HOST.host);
    const [host, port] = env.PMI_PORT!.split(':') as [string, string];
    // The member's starter binds its connection with the credential and holds it, as MPI would.
    const script = [
      'import socket, sys, time',
      `s = socket.create_connection((${JSON.stringify(host)}, ${port}))`,
      `s.sendall(b"cmd=initack pmiid=${env.PMI_ID}\\n")`,
      'print(s.recv(4096).decode().strip(), flush=True)',
      'time.sleep(600)',
    ].join('\n');
    const member = spawn('ip', ['netns', 'exec', HOST.ns, '/usr/bin/python3', '-c', script], {
      env: cleanEnv({}),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(member);
    let out = '';
    member.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await until(() => /initack/.test(out), 30_000, `the member's bind (${out})`);
    expect(out).toMatch(/rc=0/);
    link('down');
    member.kill('SIGKILL');
    const ended = await failsWithin(id, 30_000);
    expect(ended.state, JSON.stringify(ended)).toBe('failed');
  });
});

describe.skipIf(!available)('a job whose clients stay connected after it ended', () => {
  it('has its namespace torn down after the drain deadline, its clients disconnected', async () => {
    link('up');
    const { id, env } = await jobOn('openmpi', hostname());
    const rank = startRank(bin('pmix_client'), ['hang'], env, 60_000);
    try {
      await rank.waitFor((l) => l.init === true, 30_000);
      expect((await fx.api('DELETE', `/v1/jobs/${id}`)).status).toBeLessThan(300);
      const lingering = async () =>
        Number(
          /^dask_pmix_pmix_lingering_namespaces (\d+)/m.exec(String((await fx.api('GET', '/metrics')).body))?.[1] ??
            NaN,
        );
      await until(async () => (await lingering()) === 1, 5_000, 'the namespace to linger');
      // 1.5 s after the job ended its client is disconnected, libpmix finds it gone, the namespace goes.
      await until(async () => (await lingering()) === 0, 15_000, 'the namespace to be torn down');
    } finally {
      rank.kill();
    }
  });
});
