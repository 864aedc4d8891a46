// The REST API: fastify with a JSON Schema on every route, each family of routes an
// encapsulated plugin under /v1, bearer auth, Prometheus metrics, an OpenAPI document and its
// browsable docs.
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type pino from 'pino';
import type { ResourceManager } from '../rm/manager.js';
import { makeAuth } from './auth.js';
import { dashboardRoute } from './dashboard.js';
import { installErrorHandler } from './errors.js';
import { installJsonBody } from './json-body.js';
import { DEFAULT_STREAM_LIMITS, REQUEST_LIMITS, type StreamLimits } from './limits.js';
import { Metrics } from './metrics.js';
import { dashboardRoutes } from './routes/dashboard.js';
import { elasticRoutes } from './routes/elastic.js';
import { eventRoutes } from './routes/events.js';
import { healthRoutes } from './routes/health.js';
import { jobRoutes } from './routes/jobs.js';
import { psetRoutes } from './routes/psets.js';
import { workerRoutes } from './routes/workers.js';

export interface ApiOptions {
  rm: ResourceManager;
  metrics?: Metrics;
  /** When set, routes that change state (and, unless `openReads`, reads) need `Authorization: Bearer <token>`. */
  token?: string;
  /** Reads of workers, psets, jobs and events without the token. */
  openReads?: boolean;
  streams?: Partial<StreamLimits>;
  version: string;
  pmixVersion: string;
  /** Whether the embedded PMIx server still progresses (health reports it). */
  pmixProgress?: () => { stalled: boolean; stalledMs: number };
  /** A pino logger; requests are not logged without one. */
  logger?: pino.Logger;
}

export interface Api {
  app: FastifyInstance;
  metrics: Metrics;
  /** Ends the open event streams (they would otherwise keep close() waiting). */
  closeStreams(): void;
}

export async function buildApi(opts: ApiOptions): Promise<Api> {
  const app = Fastify({
    // Per-request lines are info; the API logs warnings and errors only.
    ...(opts.logger
      ? {
          loggerInstance: opts.logger.child(
            { mod: 'api' },
            { level: opts.logger.levelVal > 40 ? opts.logger.level : 'warn' },
          ) as FastifyBaseLogger,
        }
      : { logger: false }),
    // Unknown fields are an error (400), not silently dropped.
    ajv: { customOptions: { removeAdditional: false, coerceTypes: 'array', allErrors: false } },
    bodyLimit: REQUEST_LIMITS.bodyBytes,
  });
  const metrics = opts.metrics ?? new Metrics(opts.rm);
  const auth = makeAuth({
    ...(opts.token ? { token: opts.token } : {}),
    ...(opts.openReads ? { openReads: true } : {}),
  });
  installErrorHandler(app);
  installJsonBody(app);

  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'dask-pmix sidecar',
        version: opts.version,
        description:
          'Turns running Dask workers into MPI jobs: workers, process sets, jobs, member environments, events. ' +
          'JSON bodies are the protobuf JSON mapping of proto/dask_pmix.proto.',
      },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
    },
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());

  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.url ?? 'unknown';
    metrics.httpRequests.inc({ method: req.method, route, code: String(reply.statusCode) });
    metrics.httpSeconds.observe({ route }, reply.elapsedTime / 1000);
  });

  app.get('/metrics', { schema: { summary: 'Prometheus metrics', tags: ['service'] } }, async (_req, reply) =>
    reply.type(metrics.contentType).send(await metrics.render()),
  );

  const streams = new Set<() => void>();
  const common = { rm: opts.rm, auth };
  await app.register(
    async (v1) => {
      await v1.register(healthRoutes, {
        ...common,
        version: opts.version,
        pmixVersion: opts.pmixVersion,
        startedAt: Date.now(),
        ...(opts.pmixProgress ? { pmixProgress: opts.pmixProgress } : {}),
      });
      await v1.register(workerRoutes, common);
      await v1.register(psetRoutes, common);
      await v1.register(jobRoutes, common);
      await v1.register(elasticRoutes, common);
      await v1.register(eventRoutes, {
        ...common,
        metrics,
        open: streams,
        limits: { ...DEFAULT_STREAM_LIMITS, ...opts.streams },
      });
      await v1.register(dashboardRoutes, {
        ...common,
        version: opts.version,
        pmixVersion: opts.pmixVersion,
        ...(opts.pmixProgress ? { pmixProgress: opts.pmixProgress } : {}),
      });
    },
    { prefix: '/v1' },
  );
  dashboardRoute(app);
  await app.ready();
  return {
    app,
    metrics,
    closeStreams: () => {
      for (const c of [...streams]) c();
    },
  };
}
