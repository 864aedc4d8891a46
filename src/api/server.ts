// The REST API: fastify with a JSON Schema on every route, bearer auth on the routes that change
// state, Prometheus metrics, an OpenAPI document and its browsable docs.
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type pino from 'pino';
import type { ResourceManager } from '../rm/manager.js';
import { bearerCheck } from './auth.js';
import { dashboardRoute } from './dashboard.js';
import { installErrorHandler } from './errors.js';
import { eventRoutes } from './events.js';
import { Metrics } from './metrics.js';
import { v1Routes } from './routes.js';

export interface ApiOptions {
  rm: ResourceManager;
  metrics?: Metrics;
  /** When set, mutating routes need `Authorization: Bearer <token>`. */
  token?: string;
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
      ? { loggerInstance: opts.logger.child({ mod: 'api' }, { level: opts.logger.levelVal > 40 ? opts.logger.level : 'warn' }) as FastifyBaseLogger }
      : { logger: false }),
    // Unknown fields are an error (400), not silently dropped.
    ajv: { customOptions: { removeAdditional: false, coerceTypes: 'array', allErrors: false } },
    bodyLimit: 1024 * 1024,
  });
  const metrics = opts.metrics ?? new Metrics(opts.rm);
  installErrorHandler(app);

  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'dask-pmix sidecar',
        version: opts.version,
        description: 'Turns running Dask workers into MPI jobs: workers, process sets, jobs, member environments, events. ' +
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
    reply.type('text/plain; version=0.0.4').send(metrics.render()),
  );

  const streams = new Set<() => void>();
  v1Routes(app, { rm: opts.rm, auth: bearerCheck(opts.token), version: opts.version, pmixVersion: opts.pmixVersion, startedAt: Date.now(), ...(opts.pmixProgress ? { pmixProgress: opts.pmixProgress } : {}) });
  eventRoutes(app, opts.rm, streams);
  dashboardRoute(app);
  await app.ready();
  return { app, metrics, closeStreams: () => { for (const c of [...streams]) c(); } };
}
