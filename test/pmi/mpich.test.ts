// Real MPICH (Debian 4.0.2, the 5.0.2 wheel), Slurm's PMI-2 client and, when installed,
// Intel MPI, joining jobs of the real resource manager through the PMI listener. Each rank is
// a separate process whose environment holds only what the sidecar handed out.
import { existsSync, mkdirSync, mkdtempSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bin, pmiRank } from '../helpers/build-clients.js';
import { ROOT } from '../helpers/paths.js';
import { describeRanks, type RankProcess, startRank } from '../helpers/ranks.js';
import { type FixtureJob, PmiRmFixture } from './helpers/rm-fixture.js';

let fx: PmiRmFixture;
beforeAll(async () => {
  fx = await PmiRmFixture.start({ releaseGraceMs: 2000 });
});
afterAll(() => fx.stop());

function launch(
  j: FixtureJob,
  program: string,
  args: string[],
  extra: Record<string, string> = {},
  timeoutMs = 30_000,
): RankProcess[] {
  return j.envs.map((env) => startRank(...pmiRank(bin(program), args), { ...env, ...extra }, timeoutMs));
}

/** Runs `program` as every rank of a new job and checks all ranks pass and the job completes. */
async function runJob(n: number, program: string, args: string[], extra: Record<string, string> = {}) {
  const j = await fx.job(n);
  const ranks = launch(j, program, args, extra);
  const codes = await Promise.all(ranks.map((r) => r.exited));
  expect(codes, describeRanks(ranks)).toEqual(Array(n).fill(0));
  expect((await fx.waitFor(j.job.id, ['completed', 'failed', 'aborted'])).state, describeRanks(ranks)).toBe(
    'completed',
  );
  return { j, ranks };
}

function expectAllreduce(ranks: RankProcess[], mode: string) {
  const n = ranks.length;
  ranks.forEach((r, rank) => {
    expect(
      r.lines.find((l) => 'sum' in l),
      describeRanks(ranks),
    ).toMatchObject({ mode, rank, size: n, sum: (n * (n + 1)) / 2, ok: true });
  });
}

describe.each([
  ['MPICH 4.0.2 (Debian)', 'mpich4'],
  ['MPICH 5.0.2 (wheel)', 'mpich5'],
])('%s over PMI-1', (_name, flavour) => {
  it('runs MPI_Init + Allreduce + Finalize', async () => {
    const { ranks } = await runJob(2, `mpi_job_${flavour}`, ['world']);
    expectAllreduce(ranks, 'world');
  });

  it('runs MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce', async () => {
    const { ranks } = await runJob(2, `mpi_job_${flavour}`, ['session']);
    expectAllreduce(ranks, 'session');
  });

  it('refuses MPI that sends PMI_ID itself (an int, not the credential): the rank fails, the job is untouched', async () => {
    const j = await fx.job(2);
    const ranks = j.envs.map((env) => startRank(bin(`mpi_job_${flavour}`), ['world'], env, 20_000));
    const codes = await Promise.all(ranks.map((r) => r.exited));
    for (const c of codes) expect(c, describeRanks(ranks)).not.toBe(0);
    expect(codes, describeRanks(ranks)).not.toContain('SIGKILL');
    expect(fx.state(j.job.id)).toBe('pending');
    await fx.rm.deleteJob(j.job.id);
  });

  it('publishes, looks up and unpublishes a name', async () => {
    const { ranks } = await runJob(2, `publish_lookup_${flavour}`, [`svc-${flavour}`]);
    for (const r of ranks)
      expect(r.lines.at(-1), describeRanks(ranks)).toMatchObject({
        feature: 'publish-lookup',
        ok: true,
        unpublished: true,
      });
  });

  it('fails the job when a rank exits before finalize, and the other rank gets an error instead of hanging', async () => {
    const j = await fx.job(2);
    const ranks = launch(j, `mpich_probe_${flavour}`, ['die', '1'], {}, 20_000);
    const [survivor, victim] = await Promise.all(ranks.map((r) => r.exited));
    expect(victim).toBe(3);
    // MPI_Finalize's PMI barrier fails: MPICH aborts the rank (its fatal error handler, exit 15).
    expect(survivor, describeRanks(ranks)).not.toBe(0);
    expect(survivor, describeRanks(ranks)).not.toBe('SIGKILL');
    expect(ranks[0]!.stderr()).toContain('PMI_Barrier returned -1');
    const job = fx.rm.getJob(j.job.id);
    expect(job.state).toBe('failed');
    expect(job.error).toContain('rank 1 (worker');
    expect(job.error).toContain('PMI connection closed before PMI finalize');
  });

  it('aborts the job on MPI_Abort with its exit code', async () => {
    const j = await fx.job(2);
    const ranks = launch(j, `abort_${flavour}`, [], {}, 20_000);
    const job = await fx.waitFor(j.job.id, ['aborted', 'failed'], 20_000);
    expect(job.state, describeRanks(ranks)).toBe('aborted');
    expect(job.error).toMatch(/^rank 1 aborted the job with status 7/);
    // Neither rank ends by itself: MPICH's MPI_Abort waits for its process manager to kill it
    // (4.0.2 blocks reading a reply to `abort`, 5.0.x returns into the program), and rank 0
    // waits in MPI_Recv from rank 1. Stopping them is the worker's part, as hydra's is.
    await new Promise((r) => setTimeout(r, 200));
    expect(ranks.map((r) => r.child.exitCode)).toEqual([null, null]);
    for (const r of ranks) r.kill();
    await Promise.all(ranks.map((r) => r.exited));
  });
});

describe('MPICH 5.0.2 (wheel) across jobs', () => {
  it('connects two jobs with MPI_Open_port / Publish_name / Lookup_name / Comm_accept / Comm_connect', async () => {
    const [a, b] = [await fx.job(2), await fx.job(2)];
    const service = `ca-${a.job.id}`;
    // With every UCX transport in its address the port name outgrows its buffer ("no space for
    // port_name tag" in MPI_Open_port, under hydra as well): limit UCX to tcp (or use ofi).
    const env = { UCX_TLS: 'tcp,self' };
    const ranks = [
      ...launch(a, 'connect_accept_mpich5', ['accept', service], env),
      ...launch(b, 'connect_accept_mpich5', ['connect', service], env),
    ];
    expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual([0, 0, 0, 0]);
    for (const r of ranks)
      expect(r.lines.at(-1), describeRanks(ranks)).toMatchObject({
        feature: 'connect-accept',
        ok: true,
        merged_size: 4,
      });
  });
});

describe('MPICH 5.0.2 (wheel): one process, one job after another', () => {
  it('joins a second job with MPI_Session_init after MPI_Session_finalize of the first (process mode)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-repeat-'));
    const dirs = [0, 1].map((r) => {
      const d = join(dir, `rank${r}`);
      mkdirSync(d);
      return d;
    });
    /**
     * Hands round k's env to each process, as a Dask worker would set os.environ. Whole or not at
     * all (written aside, then renamed): a rank polling for the file must never read half of it.
     */
    const handOut = (k: number, envs: Record<string, string>[]) =>
      envs.forEach((e, r) => {
        const file = join(dirs[r]!, `round${k}.env`);
        writeFileSync(
          `${file}.part`,
          Object.entries(e)
            .map(([n, v]) => `${n}=${v}\n`)
            .join(''),
        );
        renameSync(`${file}.part`, file);
      });
    const first = await fx.job(2);
    handOut(1, first.envs);
    const ranks = dirs.map((d) => startRank(bin('mpich_probe_mpich5'), ['repeat', d, '2'], {}, 30_000));
    await Promise.all(ranks.map((r) => r.waitFor((l) => l.round === 1 && l.finalized === true, 20_000)));
    // MPICH 5 defers PMI finalize to process exit, so the first job is still running: the
    // worker, not PMI, knows the ranks are done (MPI_Session_finalize's barrier was their last
    // PMI call). Here the test ends it, as the sidecar would when the worker reports back.
    expect(fx.state(first.job.id)).toBe('running');
    await fx.rm.deleteJob(first.job.id, 'round 1 done');
    const second = await fx.rm.createJob({ impl: 'mpich', members: first.workers });
    handOut(
      2,
      first.workers.map((w) => fx.rm.memberEnv(second.id, w).env),
    );
    expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual([0, 0]);
    for (const r of ranks) {
      expect(
        r.lines.filter((l) => l.ok === true).map((l) => l.round),
        describeRanks(ranks),
      ).toEqual([1, 2]);
    }
    // The exit-time PMI finalize goes over the second job's connection: that job completes.
    expect((await fx.waitFor(second.id, ['completed', 'failed', 'aborted'])).state).toBe('completed');
  });
});

describe('PMI-2', () => {
  it('serves a real PMI-2 client (Slurm libpmi2): put/fence/get, job and node attributes, name service', async () => {
    const { ranks } = await runJob(3, 'pmi2_probe', []);
    for (const r of ranks) {
      expect(r.lines[0], describeRanks(ranks)).toMatchObject({
        ok: true,
        size: 3,
        mapping: '(vector,(0,1,3))',
        kvs_ok: 1,
        node_attr: '/dev/shm/probe',
      });
    }
  });
});

describe('several jobs on one listener', () => {
  it('runs MPICH 4.0.2, MPICH 5.0.2 and PMI-2 jobs at the same time', async () => {
    const jobs = [await fx.job(2), await fx.job(2), await fx.job(2)];
    const runs = [
      launch(jobs[0]!, 'mpi_job_mpich4', ['world']),
      launch(jobs[1]!, 'mpi_job_mpich5', ['world']),
      launch(jobs[2]!, 'pmi2_probe', []),
    ];
    for (const [i, ranks] of runs.entries()) {
      expect(await Promise.all(ranks.map((r) => r.exited)), describeRanks(ranks)).toEqual([0, 0]);
      expect((await fx.waitFor(jobs[i]!.job.id, ['completed', 'failed'])).state).toBe('completed');
    }
    expectAllreduce(runs[0]!, 'world');
    expectAllreduce(runs[1]!, 'world');
  });

  it('a job that fails leaves a concurrent job running to completion', async () => {
    const bad = await fx.job(2);
    const good = await fx.job(2);
    const dying = launch(bad, 'mpich_probe_mpich5', ['die', '1'], {}, 20_000);
    const fine = launch(good, 'mpi_job_mpich5', ['world']);
    await Promise.all(dying.map((r) => r.exited));
    expect(await Promise.all(fine.map((r) => r.exited)), describeRanks(fine)).toEqual([0, 0]);
    expect(fx.rm.getJob(bad.job.id).state).toBe('failed');
    expect((await fx.waitFor(good.job.id, ['completed', 'failed'])).state).toBe('completed');
  });
});

// Intel MPI (PyPI impi-rt): setup installs it in .venv-impi; DASK_PMIX_IMPI_LIB points elsewhere.
// (Skipped when absent.)
const IMPI_LIB = process.env.DASK_PMIX_IMPI_LIB ?? join(ROOT, '.venv-impi', 'lib');
describe.skipIf(!IMPI_LIB || !existsSync(`${IMPI_LIB}/libmpi.so.12`))('Intel MPI (impi-rt, MPICH ABI)', () => {
  // The 5.0.2-built program runs on Intel's libmpi.so.12 through LD_LIBRARY_PATH (same ABI).
  const env = { LD_LIBRARY_PATH: IMPI_LIB, I_MPI_FABRICS: 'shm' };
  it('joins over PMI-1 (its built-in client)', async () => {
    const { ranks } = await runJob(2, 'mpi_job_mpich5', ['world'], { ...env, I_MPI_PMI: 'pmi1' });
    expectAllreduce(ranks, 'world');
  });
  it('joins over PMI-2 (I_MPI_PMI_LIBRARY = Slurm libpmi2)', async () => {
    const { ranks } = await runJob(2, 'mpi_job_mpich5', ['world'], {
      ...env,
      I_MPI_PMI: 'pmi2',
      I_MPI_PMI_LIBRARY: '/usr/lib/x86_64-linux-gnu/libpmi2.so.0',
    });
    expectAllreduce(ranks, 'world');
  });
});
