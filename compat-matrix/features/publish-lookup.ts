// publish-lookup: MPI_Publish_name / MPI_Lookup_name / MPI_Unpublish_name across ranks.
import { type Feature, simpleJob } from './common.js';

export const publishLookup: Feature = {
  name: 'publish-lookup',
  run(ctx) {
    const service = `compat-svc-${Date.now().toString(36)}`;
    return simpleJob(ctx, 'publish-lookup', 'publish_lookup', ctx.agents.slice(0, 3), { args: () => [service] });
  },
};
