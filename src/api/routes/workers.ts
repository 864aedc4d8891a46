// /v1/workers: the Dask workers the scheduler plugin registers (it holds the token and knows
// each worker's real pid, uid and gid), and their removal when they leave the cluster.
import type { FastifyPluginAsync } from 'fastify';
import type { Impl } from '../../rm/index.js';
import { requests, responses } from '../schemas.js';
import { toJson, workerSpec } from '../wire.js';
import { type Body, errors, type Params, params, type RouteOptions } from './context.js';

export const workerRoutes: FastifyPluginAsync<RouteOptions> = async (app, { rm, auth }) => {
  const write = { onRequest: auth.write };
  const read = { onRequest: auth.read };

  app.post<Body<Parameters<typeof workerSpec>[0]>>(
    '/workers',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'Register a Dask worker (the scheduler plugin does, with the uid and gid its processes run as)',
        tags: ['workers'],
        body: requests.registerWorker,
        response: { 201: responses.worker, ...errors(400, 401, 409, 429) },
      },
    },
    async (req, reply) => reply.code(201).send(toJson.worker(rm.registerWorker(workerSpec(req.body)))),
  );

  app.get(
    '/workers',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'List workers',
        tags: ['workers'],
        response: { 200: responses.workerList, ...errors(401) },
      },
    },
    async () => ({ workers: rm.listWorkers().map(toJson.worker) }),
  );

  app.get<Params<{ id: string }>>(
    '/workers/:id',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'Get a worker',
        tags: ['workers'],
        params: params('id'),
        response: { 200: responses.worker, ...errors(401, 404) },
      },
    },
    async (req) => toJson.worker(rm.getWorker(req.params.id)),
  );

  app.delete<Params<{ id: string }> & { Querystring: { reason?: string; returning?: boolean } }>(
    '/workers/:id',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary:
          'Remove a worker (it left the cluster); its job, if any, fails. With returning=true it is expected back ' +
          '(its nanny restarts it): a job request short of workers meanwhile waits for it, within its wiring timeout',
        tags: ['workers'],
        params: params('id'),
        querystring: {
          type: 'object',
          properties: { reason: { type: 'string', maxLength: 1024 }, returning: { type: 'boolean' } },
          additionalProperties: false,
        },
        response: { 200: responses.worker, ...errors(401, 404) },
      },
    },
    async (req) =>
      toJson.worker(
        rm.removeWorker(req.params.id, req.query.reason || 'removed over REST', { returning: !!req.query.returning }),
      ),
  );

  // ---- the in-process pool -------------------------------------------------------------------
  app.post<Params<{ id: string }> & Body<{ host?: string; pid?: number; uid?: number; gid?: number; impl?: Impl }>>(
    '/workers/:id/pool',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: "The worker process joins the in-process pool: it says who it is and gets its rank's environment",
        tags: ['workers'],
        params: params('id'),
        body: requests.joinPool,
        response: { 200: responses.poolEnv, ...errors(400, 401, 404, 409, 422, 503) },
      },
    },
    async (req) => {
      const b = req.body ?? {};
      const { worker, seat, env, secret } = await rm.joinPool(
        req.params.id,
        {
          ...(b.host ? { host: b.host } : {}),
          ...(b.pid ? { pid: b.pid } : {}),
          ...(b.uid !== undefined ? { uid: b.uid } : {}),
          ...(b.gid !== undefined ? { gid: b.gid } : {}),
        },
        undefined,
        b.impl ?? 'openmpi',
      );
      return toJson.poolEnv(worker.id, seat, env, secret);
    },
  );

  app.post<Params<{ id: string }> & Body<{ reason?: string }>>(
    '/workers/:id/pool/leave',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'The worker gives up its pool rank (its MPI session failed to start); its jobs run in fork mode',
        tags: ['workers'],
        params: params('id'),
        body: requests.leavePool,
        response: { 200: responses.worker, ...errors(400, 401, 404, 422) },
      },
    },
    async (req) => toJson.worker(rm.leavePool(req.params.id, req.body?.reason || 'left the pool')),
  );
};
