// pset-group: MPI_Group_from_session_pset on custom names + MPI_Comm_create_from_group, with two
// disjoint psets of one job building their communicators at the same time.
import { allPassed, type Feature, failed, outputOf, psetJob } from './common.js';

export const psetGroup: Feature = {
  name: 'pset-group',
  run(ctx) {
    const members = ctx.agents.slice(0, 4);
    const suffix = Date.now().toString(36);
    const a = `compat-left-${suffix}`;
    const b = `compat-right-${suffix}`;
    return psetJob(ctx, 'pset_group', {
      psets: [
        { name: a, members: members.slice(0, 2) },
        { name: b, members: members.slice(2) },
      ],
      members,
      args: (rank) => [rank < 2 ? a : b],
      judge(runs, ended, seconds) {
        if (allPassed(runs, 'pset-group', ended, (l) => l.size === 2)) return { status: 'pass', seconds };
        const lines = runs.map((r) => outputOf(r, 'pset-group').find((l) => 'ok' in l));
        return failed(runs, 'pset-group', ended, seconds, `ranks reported ${JSON.stringify(lines)}`);
      },
    });
  },
};
