// GET /v1/health: liveness and versions, open to probes.
import type { FastifyPluginAsync } from 'fastify';
import { responses } from '../schemas.js';
import { toJson } from '../wire.js';
import type { RouteOptions } from './context.js';

export interface HealthOptions extends RouteOptions {
  version: string;
  pmixVersion: string;
  startedAt: number;
  /** Whether the embedded PMIx server still progresses. */
  pmixProgress?: () => { stalled: boolean; stalledMs: number };
}

export const healthRoutes: FastifyPluginAsync<HealthOptions> = async (
  app,
  { rm, version, pmixVersion, startedAt, pmixProgress },
) => {
  app.get(
    '/health',
    {
      schema: {
        summary: 'Liveness and versions; 503 while the PMIx server does not progress',
        tags: ['service'],
        response: { 200: responses.health, 503: responses.health },
      },
    },
    async (_req, reply) => {
      const pmix = pmixProgress?.() ?? { stalled: false, stalledMs: 0 };
      if (pmix.stalled) reply.code(503);
      return toJson.health({
        status: rm.isStopping ? 'stopping' : pmix.stalled ? 'pmix-stalled' : 'ok',
        version,
        pmixVersion,
        uptimeSeconds: (Date.now() - startedAt) / 1000,
        impls: rm.impls,
        pmixStalledSeconds: pmix.stalledMs / 1000,
      });
    },
  );
};
