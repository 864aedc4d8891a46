// The error contract: every failure is an ApiError {statusCode, error, message}. Schema
// violations are 400, unknown ids 404, conflicts with the current state 409, references that
// cannot be resolved or selectors that cannot be met 422, a configured bound reached 429, a
// stopping sidecar 503.

import { STATUS_CODES } from 'node:http';
import type { FastifyError, FastifyInstance } from 'fastify';
import { RmError, type RmErrorKind } from '../rm/errors.js';

const STATUS: Record<RmErrorKind, number> = {
  bad_request: 400,
  not_found: 404,
  conflict: 409,
  unprocessable: 422,
  unavailable: 503,
  limit: 429,
  timeout: 504,
  aborted: 409,
};

export class HttpError extends Error {
  constructor(
    readonly statusCode: number,
    message: string,
  ) {
    super(message);
  }
}

export function errorBody(statusCode: number, message: string) {
  return { statusCode, error: STATUS_CODES[statusCode] ?? 'Error', message };
}

export function installErrorHandler(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | RmError | HttpError | Error, req, reply) => {
    let status = 500;
    let message = err.message;
    if (err instanceof RmError) status = STATUS[err.kind];
    else if (err instanceof HttpError) status = err.statusCode;
    else if ('validation' in err && err.validation) {
      status = 400;
      message = `invalid request: ${withAllowed(err)}`;
    } else if (
      'statusCode' in err &&
      typeof err.statusCode === 'number' &&
      err.statusCode >= 400 &&
      err.statusCode < 500
    ) {
      status = err.statusCode;
    }
    if (status >= 500) req.log.error({ err }, 'request failed');
    void reply.code(status).type('application/json').send(errorBody(status, message));
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.code(404).send(errorBody(404, `no route ${req.method} ${req.url}`));
  });
}

/** Fastify's message for a schema violation, with the values an enum allows named. */
function withAllowed(err: FastifyError): string {
  const v = err.validation ?? [];
  if (!v.some((e) => e.keyword === 'enum')) return err.message;
  const where = err.validationContext ?? 'body';
  return v
    .map((e) => {
      const allowed = e.keyword === 'enum' ? (e.params as { allowedValues?: unknown[] }).allowedValues : undefined;
      const text = `${where}${e.instancePath} ${e.message ?? 'is invalid'}`;
      return allowed ? `${text}: ${allowed.map((a) => JSON.stringify(a)).join(', ')}` : text;
    })
    .join(', ');
}
