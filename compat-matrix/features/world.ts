// world: MPI_Init + Allreduce + Finalize over 3 members, the last joining 2 s after the others.
import { type Feature, simpleJob } from './common.js';

export const world: Feature = {
  name: 'world',
  run: (ctx) =>
    simpleJob(ctx, 'world', 'world', ctx.agents.slice(0, 3), { delayMs: (rank) => (rank === 2 ? 2000 : 0) }),
};
