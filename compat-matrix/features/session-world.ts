// session-world: MPI_Session_init + mpi://WORLD + MPI_Comm_create_from_group + Allreduce.
import { type Feature, simpleJob } from './common.js';

export const sessionWorld: Feature = {
  name: 'session-world',
  run: (ctx) =>
    ctx.row.sessions
      ? simpleJob(ctx, 'session-world', 'session_world', ctx.agents.slice(0, 4))
      : Promise.resolve({ status: 'unsupported', reason: `${ctx.row.label} implements MPI 3.1: no MPI_Session_init` }),
};
