// Ranks on other hosts, for real: two network namespaces on a bridge stand for two hosts, the
// sidecar listens on the bridge (PMIx remote connections, the PMI listener), and Open MPI and
// MPICH ranks started inside the namespaces join over TCP, sharing memory only within a host.
// Needs root and iproute2 (as CI has); skipped where network namespaces cannot be made.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeNetwork, removeNetwork } from '../../bench/lib/netns.js';
import { bin, pmiRank } from '../helpers/build-clients.js';
import { describeRanks, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';

const TAG = `dp${process.pid % 100000}`;
const SUBNET = `10.${100 + (process.pid % 100)}.7`;
const SERVER_IP = `${SUBNET}.1`;
const HOSTS = [
  { ns: `${TAG}a`, host: 'node-a', ip: `${SUBNET}.2` },
  { ns: `${TAG}b`, host: 'node-b', ip: `${SUBNET}.3` },
];
const NETWORK = { bridge: `br-${TAG}`, serverIp: SERVER_IP, hosts: HOSTS };

const available = makeNetwork(NETWORK);
let fx: SidecarFixture;
let nextWorker = 0;

beforeAll(async () => {
  if (!available) return;
  fx = await SidecarFixture.onBridge('netns', NETWORK);
});
afterAll(async () => {
  await fx?.stop();
  removeNetwork(NETWORK);
});

/** Two ranks on each host; returns what each rank saw. */
async function runAcrossHosts(
  impl: 'openmpi' | 'mpich',
  program: string,
  extraEnv: (h: (typeof HOSTS)[number]) => Record<string, string>,
) {
  const placement = [HOSTS[0]!, HOSTS[0]!, HOSTS[1]!, HOSTS[1]!];
  const ids: string[] = [];
  for (const h of placement) {
    const id = `tcp://${h.ip}:${4000 + nextWorker++}`;
    const r = await fx.api('POST', '/v1/workers', {
      id,
      host: h.host,
      pid: 1,
      uid: process.getuid!(),
      gid: process.getgid!(),
    });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    ids.push(id);
  }
  const created = await fx.api('POST', '/v1/jobs', { impl, members: ids });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const job = created.body as { id: string; members: { workerId: string; rank: number }[] };
  const ranks = [];
  for (const [i, m] of job.members.entries()) {
    const env = (await fx.api('GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(m.workerId)}`)).body.env as Record<
      string,
      string
    >;
    const h = placement[i]!;
    // The rank runs inside its host's namespace: it reaches the sidecar over the bridge only.
    // An MPICH rank's PMI connection is bound (dask-pmix exec's binder) from inside its host, as a worker there would.
    const cmd = impl === 'mpich' ? pmiRank(bin(program)).flat() : [bin(program)];
    ranks.push(startRank('ip', ['netns', 'exec', h.ns, ...cmd], { ...env, ...extraEnv(h) }, 60_000));
  }
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual([0, 0, 0, 0]);
  const state = (await fx.api('GET', `/v1/jobs/${job.id}`)).body;
  return { seen: ranks.map((r) => r.lines.find((l) => 'local_size' in l)), ranks, state };
}

describe.skipIf(!available)('ranks on two hosts (network namespaces), one sidecar', () => {
  it('Open MPI ranks connect over TCP, share memory within a host, and the job completes', async () => {
    const { seen, ranks, state } = await runAcrossHosts('openmpi', 'mpi_hosts_ompi5', () => ({}));
    expect(
      seen.map((l) => [l?.local_size, l?.sum, l?.ok]),
      describeRanks(ranks),
    ).toEqual([
      [2, 10, true],
      [2, 10, true],
      [2, 10, true],
      [2, 10, true],
    ]);
    expect(state.state).toBe('completed');
  });

  it('MPICH ranks reach the PMI listener on the bridge and share memory within a host', async () => {
    const { seen, ranks } = await runAcrossHosts('mpich', 'mpi_hosts_mpich5', () => ({ UCX_TLS: 'tcp,self,sm' }));
    expect(
      seen.map((l) => [l?.local_size, l?.sum, l?.ok]),
      describeRanks(ranks),
    ).toEqual([
      [2, 10, true],
      [2, 10, true],
      [2, 10, true],
      [2, 10, true],
    ]);
  });
});
