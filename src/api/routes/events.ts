// GET /v1/events: the core's events as they happen. Server-sent events (through @fastify/sse,
// which waits for the socket to drain) carrying the JSON mapping of dask_pmix.v1.Event by
// default; with `Accept: application/x-protobuf`, a stream of length-delimited Event messages.
// `?since=<seq>` or a Last-Event-ID header replays what the history still holds after it (0: from
// the start). When the history no longer holds everything after it (or it names an earlier run
// of the sidecar), the stream starts with a `resync` event: the reader must re-read its state.
// A reader that falls too far behind gets an `overflow` event and the stream ends.
import sseModule, { type fastifySSE } from '@fastify/sse';
import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import type { SequencedEvent } from '../../rm/events.js';
import { HttpError } from '../errors.js';
import { EventFeed } from '../event-feed.js';
import type { StreamLimits } from '../limits.js';
import type { Metrics } from '../metrics.js';
import { eventMsg, eventWithoutNamespace, pb, toJson } from '../wire.js';
import { errors, type RouteOptions } from './context.js';

// The package is CommonJS: its module.exports (Node's default import) is the plugin wrapped
// with fastify-plugin, so that its route hook sees the routes declared here.
const sse = sseModule as unknown as typeof fastifySSE;

// A reader tells a silent sidecar (stopped, or its host gone) from a quiet one by this heartbeat:
// the scheduler plugin takes a stream silent for several of them as the sidecar gone.
const HEARTBEAT_MS = 2_000;
const OVERFLOW_GRACE_MS = 1000;

export interface EventRouteOptions extends RouteOptions {
  limits: StreamLimits;
  metrics: Metrics;
  /** Closers of the open streams (the server ends them before it closes). */
  open: Set<() => void>;
}

/**
 * Each event is turned into JSON once per kind of reader: one with the token, and one without it
 * (opened reads), who does not see a fork job's namespace, its ranks' credential.
 */
const jsonText = { trusted: new WeakMap<SequencedEvent, Sse>(), untrusted: new WeakMap<SequencedEvent, Sse>() };
type Sse = { kind: string; text: string };
function asJson(e: SequencedEvent, trusted: boolean): Sse {
  const cache = trusted ? jsonText.trusted : jsonText.untrusted;
  let j = cache.get(e);
  if (!j) {
    const obj = trusted ? toJson.event(e) : eventWithoutNamespace(e);
    cache.set(e, (j = { kind: String(obj.kind), text: JSON.stringify(obj) }));
  }
  return j;
}

export const eventRoutes: FastifyPluginAsync<EventRouteOptions> = async (app, { rm, auth, limits, metrics, open }) => {
  await app.register(sse, { heartbeatInterval: HEARTBEAT_MS, serializer: (d: unknown) => String(d) });
  let subscribers = 0;

  app.get<{ Querystring: { since?: number } }>(
    '/events',
    {
      onRequest: auth.read,
      sse: 'manual',
      schema: {
        security: auth.security.read,
        summary: 'Stream events (SSE with JSON, or length-delimited protobuf frames)',
        tags: ['events'],
        querystring: {
          type: 'object',
          properties: { since: { type: 'integer', minimum: 0 } },
          additionalProperties: false,
        },
        response: {
          200: {
            description: 'text/event-stream of Event as JSON, or application/x-protobuf delimited Event frames',
            type: 'string',
          },
          ...errors(400, 401, 429),
        },
      },
    },
    async (req, reply) => {
      const binary = (req.headers.accept ?? '').includes('application/x-protobuf');
      const header = req.headers['last-event-id'];
      const lastId = typeof header === 'string' && /^\d+$/.test(header.trim()) ? Number(header) : undefined;
      const since = req.query.since ?? lastId;
      if (since !== undefined && since > rm.events.lastSeq) {
        throw new HttpError(400, `since=${since} is ahead of the last event (${rm.events.lastSeq})`);
      }
      if (subscribers >= limits.subscribers) {
        throw new HttpError(429, `too many open event streams (at most ${limits.subscribers})`);
      }
      // since=0 asks for everything: only a trimmed history is a gap. Any other number below the
      // oldest held names an event that is gone, or one of an earlier run of the sidecar.
      const gap =
        since !== undefined &&
        (since === 0 ? rm.events.oldestSeq > rm.events.firstSeq : since < rm.events.oldestSeq - 1);
      // A reader that stopped reading altogether leaves the writer waiting for a drain that does
      // not come: a second after it overflows, its connection is cut.
      let done = false;
      const feed = new EventFeed(rm.events, since, limits.queuedEvents, () => {
        setTimeout(() => {
          if (!done) reply.raw.destroy();
        }, OVERFLOW_GRACE_MS).unref();
      });
      const close = () => feed.close();
      subscribers++;
      metrics.eventSubscribers.inc();
      open.add(close);
      req.raw.once('close', close);
      try {
        const trusted = await auth.trusted(req);
        if (binary) await streamFrames(reply, feed, trusted);
        else await streamSse(reply, feed, gap ? { since: since!, oldestSeq: rm.events.oldestSeq } : undefined, trusted);
      } finally {
        done = true;
        feed.close();
        open.delete(close);
        subscribers--;
        metrics.eventSubscribers.dec();
        if (feed.overflowed) metrics.eventStreamsDropped.inc();
      }
    },
  );
};

async function streamSse(
  reply: FastifyReply,
  feed: EventFeed,
  gap: { since: number; oldestSeq: number } | undefined,
  trusted: boolean,
): Promise<void> {
  const out = reply.sse;
  out.keepAlive();
  out.onClose(() => feed.close());
  out.sendHeaders(200);
  reply.raw.write(': dask-pmix events\n\n');
  // A write waits for the socket to drain; a socket destroyed meanwhile never drains. Each
  // write races a wake of its own: racing one promise for the stream's life left a reaction on
  // it per event, held until the reader went (the plugin's stream lives as long as the sidecar:
  // about 8 KB per job).
  let closed = false;
  let wake: (() => void) | undefined;
  reply.raw.once('close', () => {
    closed = true;
    wake?.();
  });
  const send = async (m: { id?: string; event: string; data: string }) => {
    if (closed) return;
    const closing = new Promise<void>((resolve) => (wake = resolve));
    try {
      await Promise.race([out.send(m), closing]);
    } finally {
      wake = undefined;
    }
  };
  try {
    if (gap) {
      const message = `events after ${gap.since} are no longer held (the oldest is ${gap.oldestSeq}): re-read the state`;
      await send({ event: 'resync', data: JSON.stringify({ resync: { ...gap, message } }) });
    }
    for (let e = await feed.next(); e && out.isConnected && !reply.raw.destroyed; e = await feed.next()) {
      const j = asJson(e, trusted);
      await send({ id: String(e.seq), event: j.kind, data: j.text });
    }
    if (feed.overflowed && out.isConnected && !reply.raw.destroyed) {
      const message = `this reader fell more than the stream's queue behind; reconnect with Last-Event-ID ${feed.lastSeq}`;
      await send({ event: 'overflow', data: JSON.stringify({ overflow: { lastSeq: feed.lastSeq, message } }) });
    }
  } catch {
    // The reader went away mid-write.
  }
  out.close();
}

async function streamFrames(reply: FastifyReply, feed: EventFeed, trusted: boolean): Promise<void> {
  reply.hijack();
  const raw = reply.raw;
  raw.writeHead(200, {
    'content-type': 'application/x-protobuf',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  raw.flushHeaders();
  for (let e = await feed.next(); e && !raw.destroyed; e = await feed.next()) {
    const msg = eventMsg(e);
    if (!trusted && msg.jobStateChanged?.job) msg.jobStateChanged.job.namespace = '';
    if (!raw.write(pb.Event.encodeDelimited(msg).finish())) await drainedOrClosed(raw);
  }
  raw.end();
}

/** Resolves on 'drain' or 'close', whichever comes first, and leaves neither listener behind. */
function drainedOrClosed(raw: NodeJS.EventEmitter): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      raw.off('drain', done);
      raw.off('close', done);
      resolve();
    };
    raw.on('drain', done);
    raw.on('close', done);
  });
}
