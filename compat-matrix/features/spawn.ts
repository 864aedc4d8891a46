// spawn: MPI_Comm_spawn of two children. The sidecar has no spawn policy that starts processes
// (it would be a launcher, which a Dask cluster already has): it answers with a clear error,
// which the cell records as unsupported with the library's message.
import {
  allPassed,
  brief,
  createJob,
  type Feature,
  failed,
  outputOf,
  release,
  startRanks,
  waitRanks,
} from './common.js';

export const spawnFeature: Feature = {
  name: 'spawn',
  async run(ctx) {
    const program = ctx.program('spawn');
    if (!program) return { status: 'unsupported', reason: ctx.buildError('spawn') };
    const t0 = performance.now();
    const job = await createJob(ctx, ctx.agents.slice(0, 2));
    try {
      const runs = await startRanks(ctx, job, program);
      const ended = await waitRanks(runs, job.id, 30_000);
      const seconds = (performance.now() - t0) / 1000;
      const lines = runs.flatMap((r) => outputOf(r, 'spawn'));
      if (allPassed(runs, 'spawn', ended)) return { status: 'pass', seconds };
      const err = lines.find((l) => l.error === 'MPI_Comm_spawn');
      if (err) {
        return {
          status: 'unsupported',
          seconds,
          reason: `MPI_Comm_spawn answered an error (${brief(String(err.message ?? ''))})`,
        };
      }
      return failed(runs, 'spawn', ended, seconds, 'no result');
    } finally {
      await release(ctx, job);
    }
  },
};
