// Ranks on different hosts are described truthfully: workers registered on two hosts get one
// namespace whose per-host maps tell Open MPI which ranks share a host, so it builds its
// shared-memory communicators per host (and talks TCP between hosts). The hosts are names here;
// the ranks all run on this machine, which is what lets a test check what Open MPI was told.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { bin, pmiRank } from '../helpers/build-clients.js';
import { describeRanks, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';

let fx: SidecarFixture;

beforeAll(async () => {
  fx = await SidecarFixture.start('hosts');
});
afterAll(() => fx?.stop());

let nextWorker = 0;

/** Registers workers on the given hosts, creates a job of them, and runs mpi_hosts as each rank. */
async function runOnHosts(
  impl: 'openmpi' | 'mpich',
  program: string,
  hosts: string[],
  extraEnv: Record<string, string>,
) {
  const ids = hosts.map(() => `tcp://10.0.0.${++nextWorker}:4000`);
  for (const [i, id] of ids.entries()) {
    const r = await fx.api('POST', '/v1/workers', {
      id,
      host: hosts[i],
      pid: process.pid,
      uid: process.getuid!(),
      gid: process.getgid!(),
    });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
  }
  const created = await fx.api('POST', '/v1/jobs', { impl, members: ids });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const job = created.body as {
    id: string;
    members: { workerId: string; rank: number; host: string; nodeId: number; localRank: number }[];
  };
  const ranks = [];
  for (const m of job.members) {
    const env = (await fx.api('GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(m.workerId)}`)).body.env as Record<
      string,
      string
    >;
    if (impl === 'openmpi') expect(env.PMIX_HOSTNAME).toBe(m.host);
    // An MPICH rank is started the way a worker starts it: its PMI connection bound first.
    ranks.push(
      startRank(
        ...(impl === 'mpich' ? pmiRank(bin(program)) : ([bin(program), []] as [string, string[]])),
        { ...env, ...extraEnv },
        60_000,
      ),
    );
  }
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual(hosts.map(() => 0));
  const seen = ranks.map((r) => r.lines.find((l) => 'local_size' in l));
  return { job, seen: seen.map((l) => [l?.rank, l?.local_size, l?.local_rank, l?.ok]), ranks };
}

const HOSTS = ['node-a', 'node-b', 'node-a', 'node-b', 'node-b'];
// An explicit member list keeps its order as the rank order, so the hosts interleave.
const EXPECTED = [
  [0, 2, 0, true],
  [1, 3, 0, true],
  [2, 2, 1, true],
  [3, 3, 1, true],
  [4, 3, 2, true],
];

it('Open MPI: ranks on two hosts get per-host shared-memory communicators (PMIx node maps)', async () => {
  // Between "hosts" Open MPI uses TCP, which by default avoids the loopback interface.
  const { job, seen, ranks } = await runOnHosts('openmpi', 'mpi_hosts_ompi5', HOSTS, {
    OMPI_MCA_btl_tcp_if_include: 'lo',
  });
  expect(job.members.map((m) => [m.host, m.nodeId, m.localRank])).toEqual([
    ['node-a', 0, 0],
    ['node-b', 1, 0],
    ['node-a', 0, 1],
    ['node-b', 1, 1],
    ['node-b', 1, 2],
  ]);
  expect(seen, describeRanks(ranks)).toEqual(EXPECTED);
});

it('MPICH: ranks on two hosts get per-host shared-memory communicators (PMI_process_mapping)', async () => {
  const { seen, ranks } = await runOnHosts('mpich', 'mpi_hosts_mpich5', HOSTS, { UCX_TLS: 'tcp,self' });
  expect(seen, describeRanks(ranks)).toEqual(EXPECTED);
});
