// `dask-pmix exec`: a plain MPICH program started with a member's environment joins its job
// through the binder (native/exec); a wrong credential is refused with the server's reason; with
// no PMI environment the program just runs. Both launchers: bin/dask-pmix (straight to the
// binder) and the Node.js CLI.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bin } from '../helpers/build-clients.js';
import { ROOT } from '../helpers/paths.js';
import { runProgram } from '../helpers/run-program.js';
import { PmiRmFixture } from './helpers/rm-fixture.js';

let fx: PmiRmFixture;
beforeAll(async () => {
  fx = await PmiRmFixture.start();
});
afterAll(() => fx.stop());

const LAUNCHERS = {
  'bin/dask-pmix': [join(ROOT, 'bin', 'dask-pmix')],
  'node main.js': [process.execPath, join(ROOT, 'dist', 'src', 'cli', 'main.js')],
} as const;

function run(cmd: readonly string[], env: Record<string, string>) {
  return runProgram(cmd, env, { timeoutMs: 30_000 });
}

describe.each(Object.entries(LAUNCHERS))('dask-pmix exec through %s', (_name, launcher) => {
  it('runs MPI_Init + Allreduce + Finalize of a plain MPICH 5 program in its job', async () => {
    const j = await fx.job(2);
    const ranks = await Promise.all(
      j.envs.map((env) => run([...launcher, 'exec', '--', bin('mpi_job_mpich5'), 'world'], env)),
    );
    for (const r of ranks) expect(r, r.err).toMatchObject({ code: 0 });
    const lines = ranks.map((r) => JSON.parse(r.out.trim()) as { rank: number; size: number; ok: boolean });
    expect(lines.map((l) => [l.rank, l.size, l.ok]).sort()).toEqual([
      [0, 2, true],
      [1, 2, true],
    ]);
    expect((await fx.waitFor(j.job.id, ['completed', 'failed'])).state).toBe('completed');
  });

  it('refuses a credential the server does not know, with its reason, and runs nothing', async () => {
    const j = await fx.job(1);
    const r = await run([...launcher, 'exec', '/bin/echo', 'ran'], { ...j.envs[0]!, PMI_ID: 'f'.repeat(32) });
    expect(r.code).toBe(3);
    expect(r.out).toBe('');
    expect(r.err).toContain('the PMI server refused this rank: unknown PMI ID');
    await fx.rm.deleteJob(j.job.id);
  });

  it('refuses half a PMI environment, saying which variable is missing, and runs nothing', async () => {
    const j = await fx.job(1);
    const { PMI_ID: _id, ...withoutId } = j.envs[0]!;
    const r = await run([...launcher, 'exec', '/bin/echo', 'ran'], withoutId);
    expect(r).toMatchObject({ code: 3, out: '' });
    expect(r.err).toContain('dask-pmix: PMI_PORT is set but PMI_ID is not');
    const { PMI_PORT: _port, ...withoutPort } = j.envs[0]!;
    const s = await run([...launcher, 'exec', '/bin/echo', 'ran'], withoutPort);
    expect(s).toMatchObject({ code: 3, out: '' });
    expect(s.err).toContain('dask-pmix: PMI_ID is set but PMI_PORT is not');
    await fx.rm.deleteJob(j.job.id);
  });

  it('just runs the program when there is no PMI environment, passing its exit status on', async () => {
    expect(await run([...launcher, 'exec', '/bin/sh', '-c', 'echo plain; exit 7'], {})).toMatchObject({
      code: 7,
      out: 'plain\n',
    });
    expect((await run([...launcher, 'exec'], {})).code).toBe(2);
    expect(await run([...launcher, 'exec', '/no/such/program'], {})).toMatchObject({ code: 127 });
  });
});
