// The REST routes under /v1: workers, process sets, jobs and each member's environment.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ResourceManager } from '../rm/manager.js';
import { HttpError } from './errors.js';
import { requests, responses, type JsonSchema } from './schemas.js';
import { jobSpec, psetSpec, toJson, workerSpec } from './wire.js';

export interface RouteContext {
  rm: ResourceManager;
  auth: (req: FastifyRequest) => Promise<void>;
  version: string;
  pmixVersion: string;
  startedAt: number;
  pmixProgress?: () => { stalled: boolean; stalledMs: number };
}

/** Marks a route as needing the bearer token (when one is configured) in the OpenAPI document. */
const BEARER = [{ bearer: [] }];
const errors = (...codes: number[]) => Object.fromEntries(codes.map((c) => [c, responses.error]));
const params = (...names: string[]): JsonSchema => ({
  type: 'object',
  properties: Object.fromEntries(names.map((n) => [n, { type: 'string', minLength: 1, maxLength: 256 }])),
  required: names,
});

type Body<T> = { Body: T };
type P<T> = { Params: T };

export function v1Routes(app: FastifyInstance, ctx: RouteContext): void {
  const { rm, auth } = ctx;
  const guarded = { preHandler: auth };

  app.get('/v1/health', {
    schema: { summary: 'Liveness and versions; 503 while the PMIx server does not progress', tags: ['service'], response: { 200: responses.health, 503: responses.health } },
  }, async (_req, reply) => {
    const pmix = ctx.pmixProgress?.() ?? { stalled: false, stalledMs: 0 };
    if (pmix.stalled) reply.code(503);
    return toJson.health({
      status: rm.isStopping ? 'stopping' : pmix.stalled ? 'pmix-stalled' : 'ok',
      version: ctx.version,
      pmixVersion: ctx.pmixVersion,
      uptimeSeconds: (Date.now() - ctx.startedAt) / 1000,
      impls: rm.impls,
      pmixStalledSeconds: pmix.stalledMs / 1000,
    });
  });

  // ---- workers -------------------------------------------------------------------------------
  app.post<Body<Parameters<typeof workerSpec>[0]>>('/v1/workers', {
    ...guarded,
    schema: { security: BEARER, summary: 'Register a Dask worker', tags: ['workers'], body: requests.registerWorker, response: { 201: responses.worker, ...errors(400, 401, 409) } },
  }, async (req, reply) => reply.code(201).send(toJson.worker(rm.registerWorker(workerSpec(req.body)))));

  app.get('/v1/workers', {
    schema: { summary: 'List workers', tags: ['workers'], response: { 200: responses.workerList } },
  }, async () => ({ workers: rm.listWorkers().map(toJson.worker) }));

  app.get<P<{ id: string }>>('/v1/workers/:id', {
    schema: { summary: 'Get a worker', tags: ['workers'], params: params('id'), response: { 200: responses.worker, ...errors(404) } },
  }, async (req) => toJson.worker(rm.getWorker(req.params.id)));

  app.delete<P<{ id: string }> & { Querystring: { reason?: string } }>('/v1/workers/:id', {
    ...guarded,
    schema: { security: BEARER,
      summary: 'Remove a worker (it left the cluster); its job, if any, fails',
      tags: ['workers'],
      params: params('id'),
      querystring: { type: 'object', properties: { reason: { type: 'string', maxLength: 1024 } }, additionalProperties: false },
      response: { 200: responses.worker, ...errors(401, 404) },
    },
  }, async (req) => toJson.worker(rm.removeWorker(req.params.id, req.query.reason || 'removed over REST')));

  // ---- the in-process pool -------------------------------------------------------------------
  app.post<P<{ id: string }> & Body<{ host?: string; pid?: number; uid?: number; gid?: number }>>('/v1/workers/:id/pool', {
    ...guarded,
    schema: { security: BEARER,
      summary: "The worker process joins the in-process pool: it says who it is and gets its rank's environment",
      tags: ['workers'],
      params: params('id'),
      body: requests.joinPool,
      response: { 200: responses.poolEnv, ...errors(400, 401, 404, 409, 422, 503) },
    },
  }, async (req) => {
    const b = req.body ?? {};
    const { worker, seat, env } = await rm.joinPool(req.params.id, {
      ...(b.host ? { host: b.host } : {}),
      ...(b.pid ? { pid: b.pid } : {}),
      ...(b.uid !== undefined ? { uid: b.uid } : {}),
      ...(b.gid !== undefined ? { gid: b.gid } : {}),
    });
    return toJson.poolEnv(worker.id, seat, env);
  });

  app.post<P<{ id: string }> & Body<{ reason?: string }>>('/v1/workers/:id/pool/leave', {
    ...guarded,
    schema: { security: BEARER,
      summary: "The worker gives up its pool rank (its MPI session failed to start); its jobs run in fork mode",
      tags: ['workers'],
      params: params('id'),
      body: requests.leavePool,
      response: { 200: responses.worker, ...errors(400, 401, 404, 422) },
    },
  }, async (req) => toJson.worker(rm.leavePool(req.params.id, req.body?.reason || 'left the pool')));

  // ---- process sets --------------------------------------------------------------------------
  type PsetBody = { name: string } & Parameters<typeof psetSpec>[1];
  app.post<Body<PsetBody>>('/v1/psets', {
    ...guarded,
    schema: { security: BEARER, summary: 'Define a process set (explicit members or a selector)', tags: ['psets'], body: requests.definePset, response: { 201: responses.pset, ...errors(400, 401, 409, 422) } },
  }, async (req, reply) => reply.code(201).send(toJson.pset(rm.definePset(psetSpec(req.body.name, req.body)))));

  app.get('/v1/psets', {
    schema: { summary: 'List process sets', tags: ['psets'], response: { 200: responses.psetList } },
  }, async () => ({ psets: rm.listPsets().map(toJson.pset) }));

  app.get<P<{ name: string }>>('/v1/psets/:name', {
    schema: { summary: 'Get a process set', tags: ['psets'], params: params('name'), response: { 200: responses.pset, ...errors(404) } },
  }, async (req) => toJson.pset(rm.getPset(req.params.name)));

  app.put<P<{ name: string }> & Body<PsetBody>>('/v1/psets/:name', {
    ...guarded,
    schema: { security: BEARER, summary: 'Redefine a process set no active job uses', tags: ['psets'], params: params('name'), body: requests.redefinePset, response: { 200: responses.pset, ...errors(400, 401, 404, 409, 422) } },
  }, async (req) => {
    if (req.body.name !== undefined && req.body.name !== req.params.name) {
      throw new HttpError(400, `the body names pset '${req.body.name}' but the path names '${req.params.name}'`);
    }
    return toJson.pset(rm.redefinePset(psetSpec(req.params.name, req.body)));
  });

  app.delete<P<{ name: string }>>('/v1/psets/:name', {
    ...guarded,
    schema: { security: BEARER, summary: 'Delete a process set no active job uses', tags: ['psets'], params: params('name'), response: { 200: responses.pset, ...errors(401, 404, 409) } },
  }, async (req) => toJson.pset(rm.deletePset(req.params.name)));

  // ---- jobs ----------------------------------------------------------------------------------
  app.post<Body<Parameters<typeof jobSpec>[0]>>('/v1/jobs', {
    ...guarded,
    schema: { security: BEARER,
      summary: 'Create an MPI job from a pset, an explicit member list or a selector',
      tags: ['jobs'],
      body: requests.createJob,
      response: { 201: responses.job, ...errors(400, 401, 409, 422, 503) },
    },
  }, async (req, reply) => reply.code(201).send(toJson.job(await rm.createJob(jobSpec(req.body)))));

  app.get<{ Querystring: { state?: string } }>('/v1/jobs', {
    schema: {
      summary: 'List jobs',
      tags: ['jobs'],
      querystring: { type: 'object', properties: { state: (responses.job.properties as Record<string, JsonSchema>).state! }, additionalProperties: false },
      response: { 200: responses.jobList },
    },
  }, async (req) => ({ jobs: rm.listJobs().filter((j) => !req.query.state || j.state === req.query.state).map(toJson.job) }));

  app.get<P<{ id: string }>>('/v1/jobs/:id', {
    schema: { summary: 'Get a job', tags: ['jobs'], params: params('id'), response: { 200: responses.job, ...errors(404) } },
  }, async (req) => toJson.job(rm.getJob(req.params.id)));

  app.delete<P<{ id: string }>>('/v1/jobs/:id', {
    ...guarded,
    schema: { security: BEARER, summary: 'Abort the job if active, release its members, forget it', tags: ['jobs'], params: params('id'), response: { 200: responses.job, ...errors(401, 404) } },
  }, async (req) => toJson.job(await rm.deleteJob(req.params.id)));

  app.get<P<{ id: string; workerId: string }>>('/v1/jobs/:id/env/:workerId', {
    ...guarded,
    schema: { security: BEARER,
      summary: 'The complete environment a member must set to join the job as its rank',
      tags: ['jobs'],
      params: params('id', 'workerId'),
      response: { 200: responses.memberEnv, ...errors(401, 404, 409) },
    },
  }, async (req) => {
    const { job, member, env } = rm.memberEnv(req.params.id, req.params.workerId);
    return toJson.memberEnv({ jobId: job.id, workerId: member.workerId, rank: member.rank, size: job.members.length, impl: job.impl, env });
  });

  app.post<P<{ id: string; workerId: string }> & Body<{ reason?: string }>>('/v1/jobs/:id/members/:workerId/lost', {
    ...guarded,
    schema: { security: BEARER,
      summary: "Report that a member's process died (as its worker saw it); the job fails",
      tags: ['jobs'],
      params: params('id', 'workerId'),
      body: requests.reportMemberLost,
      response: { 200: responses.job, ...errors(400, 401, 404) },
    },
  }, async (req) => toJson.job(rm.reportMemberLost(req.params.id, req.params.workerId, req.body?.reason || 'reported lost by its worker')));

  app.post<P<{ id: string; workerId: string }> & Body<{ waitSeconds?: number }>>('/v1/jobs/:id/members/:workerId/join', {
    ...guarded,
    schema: { security: BEARER,
      summary: 'In-process jobs: the member is there; answers when every member is (ready) or after waitSeconds',
      tags: ['jobs'],
      params: params('id', 'workerId'),
      body: requests.joinJob,
      response: { 200: responses.joinJob, ...errors(400, 401, 404, 409) },
    },
  }, async (req) => toJson.joinJob(await rm.joinJob(req.params.id, req.params.workerId, (req.body?.waitSeconds ?? 10) * 1000)));

  app.post<P<{ id: string; workerId: string }> & Body<{ ok: boolean; reason?: string; failedRanks?: number[] }>>('/v1/jobs/:id/members/:workerId/leave', {
    ...guarded,
    schema: { security: BEARER,
      summary: 'In-process jobs: the member is done (ok), or failed (the job fails)',
      tags: ['jobs'],
      params: params('id', 'workerId'),
      body: requests.leaveJob,
      response: { 200: responses.job, ...errors(400, 401, 404, 409) },
    },
  }, async (req) => toJson.job(rm.leaveJob(req.params.id, req.params.workerId, req.body.ok, req.body.reason || 'its function failed', req.body.failedRanks ?? [])));
}
