// Bearer-token check. With a token configured, every route that changes state, and the route
// that hands out a member's environment (it lets its holder join a job as a rank), need
// `Authorization: Bearer <token>`. Reads stay open so that dashboards and probes need no secret.
import { timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { HttpError } from './errors.js';

export function bearerCheck(token: string | undefined): (req: FastifyRequest) => Promise<void> {
  const want = token ? Buffer.from(token) : undefined;
  return async (req) => {
    if (!want) return;
    const header = req.headers.authorization ?? '';
    const m = /^Bearer\s+(.+)$/i.exec(header);
    const got = m ? Buffer.from(m[1]!.trim()) : undefined;
    if (!got || got.length !== want.length || !timingSafeEqual(got, want)) {
      throw new HttpError(401, got ? 'the bearer token is not valid' : 'this route needs Authorization: Bearer <token>');
    }
  };
}
