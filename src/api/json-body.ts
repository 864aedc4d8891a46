// The JSON body parser: strict UTF-8 (an invalid byte would otherwise become U+FFFD, and two
// different ids could collide), no lone surrogates in strings (they cannot be stored or sent as
// UTF-8 either), and an empty body is no body (a DELETE sent with Content-Type: application/json
// and nothing after it is fine; a route that needs a body says so through its schema).
import type { FastifyInstance } from 'fastify';
import { HttpError } from './errors.js';

const utf8 = new TextDecoder('utf-8', { fatal: true });
/** A UTF-16 surrogate escape (\uD800-\uDFFF) in JSON text; only then is a full check needed. */
const SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/;

export function installJsonBody(app: FastifyInstance): void {
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body: Buffer, done) => {
    if (body.length === 0) {
      done(null, undefined);
      return;
    }
    let text: string;
    try {
      text = utf8.decode(body);
    } catch {
      done(new HttpError(400, 'the request body is not valid UTF-8'), undefined);
      return;
    }
    parseJson(req, text, (err, value) => {
      if (err) return done(err, undefined);
      if (SURROGATE_ESCAPE.test(text) && !wellFormed(value)) {
        return done(new HttpError(400, 'the request body has a string with an unpaired UTF-16 surrogate'), undefined);
      }
      done(null, value);
    });
  });
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const isWellFormed = (s: string) => !LONE_SURROGATE.test(s);

function wellFormed(v: unknown): boolean {
  if (typeof v === 'string') return isWellFormed(v);
  if (Array.isArray(v)) return v.every(wellFormed);
  if (v && typeof v === 'object') return Object.entries(v).every(([k, x]) => isWellFormed(k) && wellFormed(x));
  return true;
}
