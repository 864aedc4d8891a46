// GET /v1/events over real HTTP: server-sent JSON events, protobuf frames, and replay.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import protobuf from 'protobufjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dask_pmix } from '../../src/proto/dask_pmix.js';
import { until } from '../helpers/http.js';
import { type ApiFixture, apiFixture, worker } from './fixture.js';

let fx: ApiFixture;
beforeAll(async () => {
  fx = await apiFixture({ token: '' });
});
afterAll(() => fx.close());

/** Reads a streaming response body into a growing buffer until aborted. */
function stream(path: string, accept: string) {
  const ctl = new AbortController();
  const chunks: Buffer[] = [];
  const ready = fetch(fx.url + path, { headers: { accept }, signal: ctl.signal }).then(async (res) => {
    const reader = res.body!.getReader();
    void (async () => {
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          chunks.push(Buffer.from(value));
        }
      } catch {
        /* aborted */
      }
    })();
    return res;
  });
  return { ready, data: () => Buffer.concat(chunks), stop: () => ctl.abort() };
}

function sseEvents(text: string): { id: string; event: string; data: any }[] {
  return text
    .split('\n\n')
    .filter((b) => b.includes('data: '))
    .map((block) => {
      const field = (name: string) =>
        block
          .split('\n')
          .find((l) => l.startsWith(`${name}: `))
          ?.slice(name.length + 2) ?? '';
      return { id: field('id'), event: field('event'), data: JSON.parse(field('data')) };
    });
}

describe('GET /v1/events', () => {
  it('streams server-sent events as the JSON mapping of Event', async () => {
    const s = stream('/v1/events', 'text/event-stream');
    const res = await s.ready;
    expect(res.headers.get('content-type')).toMatch(/text\/event-stream/);
    await fx.call('POST', '/v1/workers', worker('e1', 'h'));
    const job = (await fx.call('POST', '/v1/jobs', { impl: 'openmpi', members: ['e1'] })).body;
    fx.rm.memberConnected(job.namespace, 0);
    const evs = await until(
      () => {
        const e = sseEvents(s.data().toString());
        return e.length >= 6 ? e : undefined;
      },
      5000,
      'six events',
    );
    s.stop();
    expect(evs.map((e) => e.event)).toEqual([
      'workerJoined',
      'workerStateChanged',
      'jobStateChanged',
      'memberStateChanged',
      'jobStateChanged',
      'jobStateChanged',
    ]);
    expect(evs[0]!.data).toMatchObject({
      kind: 'workerJoined',
      workerJoined: { worker: { id: 'e1', host: 'h', state: 'available' } },
    });
    expect(evs[1]!.data.workerStateChanged).toEqual({ workerId: 'e1', from: 'available', to: 'frozen', jobId: job.id });
    expect(evs[2]!.data.jobStateChanged).toMatchObject({
      jobId: job.id,
      from: 'JOB_STATE_UNSPECIFIED',
      to: 'pending',
      job: { id: job.id, state: 'pending' },
    });
    expect(evs[3]!.data.memberStateChanged).toMatchObject({
      jobId: job.id,
      workerId: 'e1',
      rank: 0,
      from: 'assigned',
      to: 'connected',
    });
    expect(evs[4]!.data.jobStateChanged).toMatchObject({ from: 'pending', to: 'wiring' });
    expect(evs[5]!.data.jobStateChanged).toMatchObject({
      from: 'wiring',
      to: 'running',
      reason: 'every member connected',
    });
    expect(Number(evs[4]!.id)).toBe(evs[4]!.data.seq);
    await fx.call('DELETE', `/v1/jobs/${job.id}`);
  });

  it('replays the history after ?since= and Last-Event-ID', async () => {
    const last = fx.rm.events.lastSeq;
    await fx.call('POST', '/v1/psets', { name: 'replayed', members: ['e1'] });
    const s = stream(`/v1/events?since=${last}`, 'text/event-stream');
    await s.ready;
    const evs = await until(
      () => {
        const e = sseEvents(s.data().toString());
        return e.length >= 1 ? e : undefined;
      },
      5000,
      'the replayed event',
    );
    s.stop();
    expect(evs[0]!.data).toMatchObject({ seq: last + 1, psetDefined: { pset: { name: 'replayed', members: ['e1'] } } });
    const ctl = new AbortController();
    const r2 = await fetch(`${fx.url}/v1/events`, { headers: { 'last-event-id': String(last) }, signal: ctl.signal });
    const reader = r2.body!.getReader();
    let text = '';
    while (!text.includes('"replayed"')) text += Buffer.from((await reader.read()).value!).toString();
    ctl.abort();
    expect(sseEvents(text)[0]!.data.seq).toBe(last + 1);
    const res = await fetch(`${fx.url}/v1/events?since=${last + 1000}`);
    expect(res.status).toBe(400);
  });

  it('streams length-delimited protobuf Event frames when asked for application/x-protobuf', async () => {
    const s = stream('/v1/events', 'application/x-protobuf');
    const res = await s.ready;
    expect(res.headers.get('content-type')).toBe('application/x-protobuf');
    await fx.call('POST', '/v1/workers', worker('pb1', 'h', { tags: ['x'] }));
    await fx.call('DELETE', '/v1/workers/pb1?reason=test');
    const frames = await until(
      () => {
        const reader = protobuf.Reader.create(s.data());
        const out: dask_pmix.v1.Event[] = [];
        try {
          while (reader.pos < reader.len) out.push(dask_pmix.v1.Event.decodeDelimited(reader));
        } catch {
          /* a partial frame: wait for more */
        }
        return out.length >= 2 ? out : undefined;
      },
      5000,
      'two frames',
    );
    s.stop();
    expect(frames[0]!.workerJoined?.worker?.id).toBe('pb1');
    expect(frames[0]!.workerJoined?.worker?.tags).toEqual(['x']);
    expect(frames[1]!.workerLeft).toMatchObject({ workerId: 'pb1', reason: 'test' });
    expect(Number(frames[1]!.seq)).toBe(Number(frames[0]!.seq) + 1);
  });

  it('holds no memory per event for a stream that stays open', async () => {
    // The plugin keeps one stream open for the sidecar's life: what a stream holds per event it
    // sent must be freed as it goes (a race against one promise per stream kept a reaction per
    // event, 0.3 KB and more each: about 8 KB per job).
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const ctl = new AbortController();
    const res = await fetch(`${fx.url}/v1/events`, { headers: { accept: 'text/event-stream' }, signal: ctl.signal });
    const reader = res.body!.getReader();
    let received = 0;
    const reading = (async () => {
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          for (const b of value) if (b === 0x0a) received++; // the chunks are dropped: this process is the sidecar too
        }
      } catch {
        /* aborted */
      }
    })();
    const emit = async (n: number) => {
      for (let i = 0; i < n; i += 200) {
        const target = received + 2 * 200; // at least two lines per event
        for (let j = 0; j < 200; j++) fx.rm.events.emit({ kind: 'psetDeleted', name: `leak-check-${i + j}` });
        await until(() => received >= target || undefined, 10_000, 'the events read');
      }
    };
    const heap = () => {
      gc();
      gc();
      return process.memoryUsage().heapUsed;
    };
    await emit(4000); // past the event history's capacity, so that it holds as much at both ends
    const before = heap();
    await emit(30_000); // a promise reaction kept per event would hold about 10 MB here
    const grown = heap() - before;
    ctl.abort();
    await reading;
    expect(grown).toBeLessThan(3 * 1024 * 1024);
  }, 60_000);
});
