// Bearer-token check. With a token configured, every route that changes state, the route that
// hands out a member's environment (it lets its holder join a job as a rank), and (unless reads
// are opened) the reads of workers, psets, jobs and events need `Authorization: Bearer <token>`.
// Health, metrics and the API's own description stay open for probes and scrapers.
// The check runs on request, before a body is read: an outsider's large body is never parsed.
import { timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { HttpError } from './errors.js';

export interface AuthOptions {
  /** Without one, every route is open (a library embedding or a test). */
  token?: string;
  /** Reads of workers, psets, jobs and events without the token. */
  openReads?: boolean;
}

type Check = (req: FastifyRequest) => Promise<void>;

export interface Auth {
  /** Changes state, or reveals what lets its holder join a job. */
  write: Check;
  /** Reads of workers, psets, jobs and events. */
  read: Check;
  /** The OpenAPI `security` of each kind of route (undefined: open by design). */
  security: { write: { bearer: never[] }[]; read?: { bearer: never[] }[] };
  /**
   * Whether the request may see what lets its holder join a job (a fork job's namespace): it
   * carries the token, or there is none. Opened reads leave that out for everyone else.
   */
  trusted(req: FastifyRequest): Promise<boolean>;
}

const open: Check = async () => undefined;

export function bearerCheck(token: string | undefined): Check {
  if (!token) return open;
  const want = Buffer.from(token);
  return async (req) => {
    const header = req.headers.authorization ?? '';
    const m = /^Bearer\s+(.+)$/i.exec(header);
    const got = m ? Buffer.from(m[1]!.trim()) : undefined;
    if (!got || got.length !== want.length || !timingSafeEqual(got, want)) {
      throw new HttpError(
        401,
        got ? 'the bearer token is not valid' : 'this route needs Authorization: Bearer <token>',
      );
    }
  };
}

export function makeAuth(opts: AuthOptions): Auth {
  const check = bearerCheck(opts.token);
  // The document states the contract of a deployment with a token.
  const bearer = [{ bearer: [] as never[] }];
  return {
    write: check,
    read: opts.openReads ? open : check,
    security: { write: bearer, ...(opts.openReads ? {} : { read: bearer }) },
    trusted: (req) =>
      check(req).then(
        () => true,
        () => false,
      ),
  };
}
