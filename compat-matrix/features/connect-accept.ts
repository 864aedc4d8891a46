// connect-accept: two jobs of two ranks joined with MPI_Open_port / MPI_Comm_accept /
// MPI_Comm_connect (the port travels through the sidecar's name service).
import { allPassed, createJob, type Feature, failed, release, startRanks, waitRanks } from './common.js';

export const connectAccept: Feature = {
  name: 'connect-accept',
  async run(ctx) {
    const program = ctx.program('connect_accept');
    if (!program) return { status: 'unsupported', reason: ctx.buildError('connect_accept') };
    const service = `compat-ca-${Date.now().toString(36)}`;
    const t0 = performance.now();
    const acceptors = await createJob(ctx, ctx.agents.slice(0, 2));
    const connectors = await createJob(ctx, ctx.agents.slice(2, 4));
    try {
      const [ra, rc] = await Promise.all([
        startRanks(ctx, acceptors, program, () => ['accept', service], undefined, ctx.row.connectEnv),
        startRanks(ctx, connectors, program, () => ['connect', service], undefined, ctx.row.connectEnv),
      ]);
      const [ea, ec] = await Promise.all([waitRanks(ra, acceptors.id, 60_000), waitRanks(rc, connectors.id, 60_000)]);
      const seconds = (performance.now() - t0) / 1000;
      const all = [...ra, ...rc];
      if (allPassed(all, 'connect-accept', ea && ec, (l) => l.merged_size === 4)) return { status: 'pass', seconds };
      return failed(all, 'connect-accept', ea && ec, seconds, 'no merged communicator of 4');
    } finally {
      await release(ctx, acceptors);
      await release(ctx, connectors);
    }
  },
};
