// pset-names: MPI_Session_get_num_psets / get_nth_pset list the psets the sidecar defined for
// the job (the job is created from a pset; a second, overlapping pset is defined as well).
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

export const psetNames: Feature = {
  name: 'pset-names',
  async run(ctx) {
    const unsupported = psetsUnsupported(ctx);
    if (unsupported) return unsupported;
    const program = ctx.program('pset_names');
    if (!program) return { status: 'unsupported', reason: ctx.buildError('pset_names') };
    const members = ctx.agents.slice(0, 2);
    const suffix = Date.now().toString(36);
    const names = [`compat-a-${suffix}`, `compat-b-${suffix}`];
    const t0 = performance.now();
    await ctx.sidecar.request('POST', '/v1/psets', { name: names[0], members: members.map((a) => a.id) });
    await ctx.sidecar.request('POST', '/v1/psets', { name: names[1], members: [members[0]!.id] });
    const job = await createJob(ctx, members, { pset: names[0] });
    try {
      const runs = await startRanks(ctx, job, program);
      const ended = await waitRanks(runs, job.id, 60_000);
      const seconds = (performance.now() - t0) / 1000;
      // Each rank resolved mpi://WORLD to a group of the job's size and ended cleanly.
      if (!allPassed(runs, 'pset-names', ended, (l) => l.size === members.length)) {
        return failed(runs, 'pset-names', ended, seconds, 'a rank did not report a usable session');
      }
      const seen = runs.map(
        (r) => outputOf(r, 'pset-names').find((l) => Array.isArray(l.names))?.names as string[] | undefined,
      );
      const missing = seen.flatMap((s, rank) =>
        s
          ? names.filter((n) => !s.includes(n)).map((n) => `rank ${rank} lacks ${n}`)
          : [`rank ${rank} printed no names`],
      );
      if (missing.length === 0) return { status: 'pass', seconds };
      return { status: 'fail', seconds, reason: `${missing.join('; ')}; saw ${JSON.stringify(seen[0] ?? [])}` };
    } finally {
      await release(ctx, job);
      for (const n of names) await ctx.sidecar.request('DELETE', `/v1/psets/${n}`).catch(() => undefined);
    }
  },
};
