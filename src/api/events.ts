// GET /v1/events: the core's events as they happen. Server-sent events carrying the JSON mapping
// of dask_pmix.v1.Event by default; with `Accept: application/x-protobuf`, a stream of
// length-delimited Event messages (varint length, then the message). `?since=<seq>` or a
// Last-Event-ID header replays what the history still holds after that sequence number.
import type { FastifyInstance } from 'fastify';
import type { ResourceManager } from '../rm/manager.js';
import type { SequencedEvent } from '../rm/events.js';
import { HttpError } from './errors.js';
import { eventMsg, pb, toJson } from './wire.js';

const HEARTBEAT_MS = 15_000;

export function eventRoutes(app: FastifyInstance, rm: ResourceManager, open: Set<() => void>): void {
  app.get<{ Querystring: { since?: number } }>('/v1/events', {
    schema: {
      summary: 'Stream events (SSE with JSON, or length-delimited protobuf frames)',
      tags: ['events'],
      querystring: { type: 'object', properties: { since: { type: 'integer', minimum: 0 } }, additionalProperties: false },
      response: { 200: { description: 'text/event-stream of Event as JSON, or application/x-protobuf delimited Event frames', type: 'string' } },
    },
  }, (req, reply) => {
    const binary = (req.headers.accept ?? '').includes('application/x-protobuf');
    const lastId = Number(req.headers['last-event-id']);
    const since = req.query.since ?? (Number.isInteger(lastId) && lastId >= 0 ? lastId : undefined);
    if (since !== undefined && since > rm.events.lastSeq) throw new HttpError(400, `since=${since} is ahead of the last event (${rm.events.lastSeq})`);

    const raw = reply.raw;
    raw.writeHead(200, {
      'content-type': binary ? 'application/x-protobuf' : 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    const write = (e: SequencedEvent) => {
      if (binary) {
        raw.write(pb.Event.encodeDelimited(eventMsg(e)).finish());
      } else {
        const json = toJson.event(e);
        raw.write(`id: ${e.seq}\nevent: ${String(json.kind)}\ndata: ${JSON.stringify(json)}\n\n`);
      }
    };
    if (binary) raw.flushHeaders();
    else raw.write(': dask-pmix events\n\n');
    if (since !== undefined) for (const e of rm.events.since(since)) write(e);
    const unsubscribe = rm.events.subscribe(write);
    const heartbeat = setInterval(() => { if (!binary) raw.write(': ping\n\n'); }, HEARTBEAT_MS);
    heartbeat.unref();
    const close = () => {
      clearInterval(heartbeat);
      unsubscribe();
      open.delete(close);
      raw.end();
    };
    open.add(close);
    req.raw.on('close', close);
    reply.hijack();
  });
}
