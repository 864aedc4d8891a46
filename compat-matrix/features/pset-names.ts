// pset-names: MPI_Session_get_num_psets / get_nth_pset list the psets the sidecar defined for
// the job (the job is created from a pset; a second, overlapping pset is defined as well).
import { allPassed, type Feature, failed, outputOf, psetJob } from './common.js';

export const psetNames: Feature = {
  name: 'pset-names',
  run(ctx) {
    const members = ctx.agents.slice(0, 2);
    const suffix = Date.now().toString(36);
    const names = [`compat-a-${suffix}`, `compat-b-${suffix}`];
    return psetJob(ctx, 'pset_names', {
      psets: [
        { name: names[0]!, members },
        { name: names[1]!, members: [members[0]!] },
      ],
      members,
      jobExtra: { pset: names[0] },
      judge(runs, ended, seconds) {
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
      },
    });
  },
};
