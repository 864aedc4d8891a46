// pset-group: MPI_Group_from_session_pset on custom names + MPI_Comm_create_from_group, with two
// disjoint psets of one job building their communicators at the same time.
import {
  allPassed,
  createJob,
  type Feature,
  failed,
  outputOf,
  psetsUnsupported,
  release,
  startRanks,
  waitRanks,
} from './common.js';

export const psetGroup: Feature = {
  name: 'pset-group',
  async run(ctx) {
    const unsupported = psetsUnsupported(ctx);
    if (unsupported) return unsupported;
    const program = ctx.program('pset_group');
    if (!program) return { status: 'unsupported', reason: ctx.buildError('pset_group') };
    const members = ctx.agents.slice(0, 4);
    const suffix = Date.now().toString(36);
    const a = `compat-left-${suffix}`;
    const b = `compat-right-${suffix}`;
    const t0 = performance.now();
    await ctx.sidecar.request('POST', '/v1/psets', { name: a, members: members.slice(0, 2).map((x) => x.id) });
    await ctx.sidecar.request('POST', '/v1/psets', { name: b, members: members.slice(2).map((x) => x.id) });
    const job = await createJob(ctx, members);
    try {
      const runs = await startRanks(ctx, job, program, (rank) => [rank < 2 ? a : b]);
      const ended = await waitRanks(runs, job.id, 60_000);
      const seconds = (performance.now() - t0) / 1000;
      if (allPassed(runs, 'pset-group', ended, (l) => l.size === 2)) return { status: 'pass', seconds };
      const lines = runs.map((r) => outputOf(r, 'pset-group').find((l) => 'ok' in l));
      return failed(runs, 'pset-group', ended, seconds, `ranks reported ${JSON.stringify(lines)}`);
    } finally {
      await release(ctx, job);
      for (const n of [a, b]) await ctx.sidecar.request('DELETE', `/v1/psets/${n}`).catch(() => undefined);
    }
  },
};
