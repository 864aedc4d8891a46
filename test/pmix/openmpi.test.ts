// Open MPI 5 (the PyPI wheel) ranks started as independent processes, with the environment
// from setup_fork as their only way in.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bin } from '../helpers/build-clients.js';
import { PmixFixture } from '../helpers/pmix-fixture.js';
import { describeRanks, startRank } from '../helpers/ranks.js';

let fx: PmixFixture;
beforeAll(async () => {
  fx = await PmixFixture.start();
});
afterAll(() => fx?.stop());

// The wheel's libfabric transport costs about a second per init on a machine without a fabric.
const OMPI_ENV = { OMPI_MCA_btl: '^ofi' };

async function runJob(nspace: string, size: number, mode: 'world' | 'session') {
  const envs = await fx.job(nspace, size);
  const ranks = envs.map((e) => startRank(bin('mpi_job_ompi5'), [mode], { ...e, ...OMPI_ENV }, 60_000));
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual(Array(size).fill(0));
  const results = ranks.map((r) => r.lines.find((l) => 'sum' in l));
  for (const [rank, res] of results.entries()) {
    expect(res, describeRanks(ranks)).toMatchObject({ mode, rank, size, sum: (size * (size + 1)) / 2, ok: true });
  }
  await Promise.all(envs.map((_, rank) => fx.server.deregisterClient({ nspace, rank })));
  await fx.server.deregisterNspace(nspace);
}

describe('Open MPI 5 through our PMIx server', () => {
  it('runs MPI_Init + Allreduce + Finalize over 4 ranks', () => runJob('ompi-world', 4, 'world'));

  it('runs MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce over 4 ranks', async () => {
    await runJob('ompi-session', 4, 'session');
    const construct = fx.recorded.groups.find((g) => g.op === 'construct' && g.procs[0]?.nspace === 'ompi-session');
    expect(construct?.contextId).toBeDefined();
    expect(construct?.procs).toHaveLength(4);
  });
});
