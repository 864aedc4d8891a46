// /v1/elastic: elastic jobs (dask_pmix.run_elastic), their members over time and the drain
// requests made of them. The scheduler plugin records the drains; the generations are jobs.
import type { FastifyPluginAsync } from 'fastify';
import type { DrainState } from '../../rm/types.js';
import { requests, responses } from '../schemas.js';
import { toJson } from '../wire.js';
import { type Body, errors, type Params, params, type RouteOptions } from './context.js';

export const elasticRoutes: FastifyPluginAsync<RouteOptions> = async (app, { rm, auth }) => {
  const write = { onRequest: auth.write };
  const read = { onRequest: auth.read };

  app.get(
    '/elastic',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'List elastic jobs, each with its generations and drain requests',
        tags: ['elastic'],
        response: { 200: responses.elasticJobList, ...errors(401) },
      },
    },
    async () => ({ elasticJobs: rm.elastic.list().map(toJson.elastic) }),
  );

  app.get<Params<{ id: string }>>(
    '/elastic/:id',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'Get an elastic job: its members over time (as far as the job history reaches) and its drain requests',
        tags: ['elastic'],
        params: params('id'),
        response: { 200: responses.elasticJob, ...errors(401, 404) },
      },
    },
    async (req) => toJson.elastic(rm.elastic.get(req.params.id)),
  );

  app.put<Params<{ id: string; workerId: string }> & Body<{ reason?: string; state: DrainState; generation?: number }>>(
    '/elastic/:id/drains/:workerId',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'Record a drain request of a worker in an elastic job, or how it ended (the scheduler plugin)',
        tags: ['elastic'],
        params: params('id', 'workerId'),
        body: requests.recordDrain,
        response: { 200: responses.drain, ...errors(400, 401, 409) },
      },
    },
    async (req) => {
      const b = req.body;
      return toJson.drain(rm.elastic.record(req.params.id, req.params.workerId, b.state, b.reason ?? '', b.generation));
    },
  );
};
