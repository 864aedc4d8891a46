// /v1/jobs: MPI jobs over sets of workers, each member's environment, and a member's loss as
// its worker saw it.
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import { type JsonSchema, requests, responses } from '../schemas.js';
import { jobSpec, toJson, withoutNamespace } from '../wire.js';
import { type Body, errors, type Params, params, type RouteOptions } from './context.js';

/** The request header that asks POST /jobs?wait= for a 102 once the request waits in line. */
export const QUEUED_HEADER = 'x-dask-pmix-queued';

export const jobRoutes: FastifyPluginAsync<RouteOptions> = async (app, { rm, auth }) => {
  const write = { onRequest: auth.write };
  const read = { onRequest: auth.read };
  // A reader without the token (opened reads) does not see namespaces: a fork job's is its ranks' credential.
  const jobView = async (req: FastifyRequest) => ((await auth.trusted(req)) ? toJson.job : withoutNamespace);

  app.post<Body<Parameters<typeof jobSpec>[0]> & { Querystring: { wait?: number } }>(
    '/jobs',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary:
          'Create an MPI job from a pset, an explicit member list or a selector; with wait=<seconds>, ' +
          'a request whose members are busy (or that finds every job slot taken) waits in line for up to that long',
        tags: ['jobs'],
        body: requests.createJob,
        querystring: {
          type: 'object',
          properties: { wait: { type: 'number', minimum: 0, maximum: 3600 } },
          additionalProperties: false,
        },
        response: { 201: responses.job, ...errors(400, 401, 409, 422, 429, 503) },
      },
    },
    async (req, reply) => {
      // A requester that sends its requests one after another, in their order (the scheduler
      // plugin, for its clients' queued jobs), asks for an interim 102 once this one waits in
      // line: its place is fixed then, and the next may go.
      const notify = req.headers[QUEUED_HEADER] === 'notify';
      // A requester that goes away (closes the connection) takes its request out of the line.
      const gone = new AbortController();
      const onClose = () => {
        if (!reply.raw.writableEnded) gone.abort();
      };
      reply.raw.on('close', onClose);
      let job: Awaited<ReturnType<typeof rm.createJob>>;
      try {
        job = await rm.createJob(jobSpec(req.body), {
          waitMs: (req.query.wait ?? 0) * 1000,
          signal: gone.signal,
          onQueued: notify ? () => reply.raw.writeProcessing() : undefined,
        });
      } finally {
        reply.raw.off('close', onClose);
      }
      if (gone.signal.aborted) {
        // Admitted as its requester left: nobody runs it, so its members go back now (not at
        // the wiring timeout).
        await rm.deleteJob(job.id, 'its request was withdrawn as it was admitted');
      }
      return reply.code(201).send(toJson.job(job));
    },
  );

  app.get<{ Querystring: { state?: string } }>(
    '/jobs',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'List jobs',
        tags: ['jobs'],
        querystring: {
          type: 'object',
          properties: { state: (responses.job.properties as Record<string, JsonSchema>).state! },
          additionalProperties: false,
        },
        response: { 200: responses.jobList, ...errors(401) },
      },
    },
    async (req) => {
      const view = await jobView(req);
      return {
        jobs: rm
          .listJobs()
          .filter((j) => !req.query.state || j.state === req.query.state)
          .map(view),
      };
    },
  );

  app.get<Params<{ id: string }>>(
    '/jobs/:id',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'Get a job',
        tags: ['jobs'],
        params: params('id'),
        response: { 200: responses.job, ...errors(401, 404) },
      },
    },
    async (req) => (await jobView(req))(rm.getJob(req.params.id)),
  );

  app.delete<Params<{ id: string }> & { Querystring: { reason?: string } }>(
    '/jobs/:id',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary:
          'Abort the job if active, release its members, forget it; reason=<text> is the error an active job ends with',
        tags: ['jobs'],
        params: params('id'),
        querystring: {
          type: 'object',
          properties: { reason: { type: 'string', minLength: 1, maxLength: 500 } },
          additionalProperties: false,
        },
        response: { 200: responses.job, ...errors(400, 401, 404) },
      },
    },
    async (req) => toJson.job(await rm.deleteJob(req.params.id, req.query.reason)),
  );

  // Always behind the token: the environment lets its holder join the job as that rank.
  app.get<Params<{ id: string; workerId: string }>>(
    '/jobs/:id/env/:workerId',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'The complete environment a member must set to join the job as its rank',
        tags: ['jobs'],
        params: params('id', 'workerId'),
        response: { 200: responses.memberEnv, ...errors(401, 404, 409) },
      },
    },
    async (req) => {
      const { job, member, env } = rm.memberEnv(req.params.id, req.params.workerId);
      return toJson.memberEnv({
        jobId: job.id,
        workerId: member.workerId,
        rank: member.rank,
        size: job.members.length,
        impl: job.impl,
        env,
      });
    },
  );

  app.post<Params<{ id: string; workerId: string }> & Body<{ reason?: string }>>(
    '/jobs/:id/members/:workerId/lost',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: "Report that a member's process died (as its worker saw it); the job fails",
        tags: ['jobs'],
        params: params('id', 'workerId'),
        body: requests.reportMemberLost,
        response: { 200: responses.job, ...errors(400, 401, 404) },
      },
    },
    async (req) =>
      toJson.job(
        rm.reportMemberLost(req.params.id, req.params.workerId, req.body?.reason || 'reported lost by its worker'),
      ),
  );

  app.post<Params<{ id: string; workerId: string }> & Body<{ waitSeconds?: number; ports?: Record<string, string> }>>(
    '/jobs/:id/members/:workerId/join',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'In-process jobs: the member is there; answers when every member is (ready) or after waitSeconds',
        tags: ['jobs'],
        params: params('id', 'workerId'),
        body: requests.joinJob,
        response: { 200: responses.joinJob, ...errors(400, 401, 404, 409) },
      },
    },
    async (req) =>
      toJson.joinJob(
        await rm.joinJob(req.params.id, req.params.workerId, (req.body?.waitSeconds ?? 10) * 1000, req.body?.ports),
      ),
  );

  app.post<Params<{ id: string }>>(
    '/jobs/:id/complete',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary:
          "In-process jobs: every member's function returned (the scheduler saw each rank's task finish); they all leave at once",
        tags: ['jobs'],
        params: params('id'),
        response: { 200: responses.job, ...errors(401, 404, 409) },
      },
    },
    async (req) => toJson.job(rm.completeJob(req.params.id)),
  );

  app.post<Params<{ id: string }> & { Querystring: { from?: string } }>(
    '/jobs/:id/reused',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary:
          'In-process jobs: every member is there and derives its communicator from the one kept since job from=<id> (a Dup or a create_group: no group construct reaches the server): the job runs',
        tags: ['jobs'],
        params: params('id'),
        querystring: {
          type: 'object',
          properties: { from: { type: 'string', minLength: 1, maxLength: 128 } },
          additionalProperties: false,
        },
        response: { 200: responses.job, ...errors(400, 401, 404, 409) },
      },
    },
    async (req) => toJson.job(rm.reusedJob(req.params.id, req.query.from ?? 'an earlier job')),
  );

  app.post<Params<{ id: string; workerId: string }> & Body<{ ok: boolean; reason?: string; failedRanks?: number[] }>>(
    '/jobs/:id/members/:workerId/leave',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'In-process jobs: the member is done (ok), or failed (the job fails)',
        tags: ['jobs'],
        params: params('id', 'workerId'),
        body: requests.leaveJob,
        response: { 200: responses.job, ...errors(400, 401, 404, 409) },
      },
    },
    async (req) =>
      toJson.job(
        rm.leaveJob(
          req.params.id,
          req.params.workerId,
          req.body.ok,
          req.body.reason || 'its function failed',
          req.body.failedRanks ?? [],
        ),
      ),
  );
};
