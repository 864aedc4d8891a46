// The dashboard page at `/`, for a standalone sidecar: the same page the Dask dashboard shows at
// /dask-pmix/ (built from src/dashboard/index.html into the Python package, which both serve). It
// reads v1/dashboard beside it with a relative URL, so it needs nothing of its own; a token, if
// the sidecar wants one, is asked for.
import { readFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import { pythonPackageFile } from '../pmix/native.js';

export function dashboardRoute(app: FastifyInstance): void {
  let page: Buffer | undefined;
  app.get('/', { schema: { hide: true } }, async (_req, reply) => {
    page ??= readFileSync(pythonPackageFile('dashboard', 'index.html'));
    return reply.type('text/html; charset=utf-8').header('cache-control', 'no-store').send(page);
  });
}
