// /v1/dashboard: everything the dashboard page shows, in one read, and nothing it does not: no
// namespaces, pids, uids, gids or tags, which let a reader impersonate a rank or a worker. The
// scheduler's relay forwards this route alone, so the page works at the Dask dashboard without
// exposing the rest of the API. PUT /v1/traffic records the bytes each worker's comm backend moved
// per transport (the scheduler plugin reports them in one request), for the page's traffic view.
import type { FastifyPluginAsync } from 'fastify';
import { CHANGE_LABEL, ELASTIC_LABEL, GENERATION_LABEL } from '../../rm/elastic-jobs.js';
import type { RmEvent } from '../../rm/events.js';
import type { Job } from '../../rm/types.js';
import { REQUEST_LIMITS } from '../limits.js';
import type { JsonSchema } from '../schemas.js';
import { type Body, errors, type RouteOptions } from './context.js';

export interface DashboardOptions extends RouteOptions {
  version: string;
  pmixVersion: string;
  pmixProgress?: () => { stalled: boolean; stalledMs: number };
  /** Jobs shown, most recent first. */
  maxJobs?: number;
}

export interface Traffic {
  tcp: { bytesSent: number; bytesReceived: number };
  mpi: { bytesSent: number; bytesReceived: number };
  /** Copied by the receiver out of the sender's memory (workers outside their host's cohort). */
  cma?: { bytesSent: number; bytesReceived: number };
}

const count: JsonSchema = { type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER };
const pair: JsonSchema = {
  type: 'object',
  properties: { bytesSent: count, bytesReceived: count },
  required: ['bytesSent', 'bytesReceived'],
  additionalProperties: false,
};
const trafficSchema: JsonSchema = {
  type: 'object',
  properties: {
    workers: {
      type: 'array',
      maxItems: REQUEST_LIMITS.trafficWorkers,
      items: {
        type: 'object',
        properties: {
          id: { type: 'string', minLength: 1, maxLength: REQUEST_LIMITS.idLength },
          tcp: pair,
          mpi: pair,
          cma: pair,
        },
        required: ['id', 'tcp', 'mpi'],
        additionalProperties: false,
      },
    },
  },
  required: ['workers'],
  additionalProperties: false,
};

/** Names a rank could be impersonated with, and process ids, taken out of free text. */
export function redact(text: string): string {
  return text.replace(/dask-pmix\.[A-Za-z0-9._-]+/g, '<namespace>').replace(/\bpid[ =:]?\d+/gi, 'pid');
}

/**
 * Which attempt of a family a job is (run_mpi's retries label each attempt's job: the client's
 * dask_pmix/client/retries.py), or undefined for a job that is no attempt.
 */
export function attemptOf(labels: Readonly<Record<string, string>> | undefined) {
  const family = labels?.['dask-pmix.family'];
  const number = Number(labels?.['dask-pmix.attempt']);
  const of = Number(labels?.['dask-pmix.attempts']);
  if (!family || !Number.isInteger(number) || number < 1) return undefined;
  return { family: redact(family), number, ...(Number.isInteger(of) && of >= number ? { of } : {}) };
}

/** Which generation of an elastic job a job is (run_elastic labels each one), and what changed at its start. */
export function generationOf(labels: Readonly<Record<string, string>> | undefined) {
  const id = labels?.[ELASTIC_LABEL];
  const generation = Number(labels?.[GENERATION_LABEL]);
  if (!id || !Number.isInteger(generation) || generation < 0) return undefined;
  return { id: redact(id), generation, change: redact(labels?.[CHANGE_LABEL] ?? '') };
}

function jobView(j: Readonly<Job>) {
  const attempt = attemptOf(j.labels);
  const elastic = generationOf(j.labels);
  return {
    id: j.id,
    ...(attempt ? { attempt } : {}),
    ...(elastic ? { elastic } : {}),
    impl: j.impl,
    mode: j.mode,
    ...(j.modeReason ? { modeReason: redact(j.modeReason) } : {}),
    state: j.state,
    createdAt: j.createdAt,
    ...(j.startedAt ? { startedAt: j.startedAt } : {}),
    ...(j.endedAt ? { endedAt: j.endedAt } : {}),
    ...(j.error ? { error: redact(j.error) } : {}),
    ...(j.pset ? { pset: j.pset } : {}),
    members: j.members.map((m) => ({
      rank: m.rank,
      workerId: m.workerId,
      state: m.state,
      ...(m.reason ? { reason: redact(m.reason) } : {}),
    })),
  };
}

const NONE = { bytesSent: 0, bytesReceived: 0 };
const trafficView = ({ tcp, mpi, cma, at }: Traffic & { at: string }) => ({ tcp, mpi, cma: cma ?? NONE, at });

/** Something an operator should see: a worker left the pool or the cluster (and why), the PMIx server stalled. */
interface Notice {
  time: string;
  what: string;
  worker?: string;
  reason: string;
}
const NOTICES = 50;

function noticeOf(e: RmEvent, time: number): Notice | undefined {
  const at = new Date(time).toISOString();
  if (e.kind === 'workerPoolChanged' && e.pool.state === 'retired') {
    return { time: at, what: 'left the pool', worker: e.workerId, reason: redact(e.pool.reason ?? '') };
  }
  if (e.kind === 'workerLeft')
    return { time: at, what: 'left the cluster', worker: e.workerId, reason: redact(e.reason) };
  if (e.kind === 'drainChanged') {
    const d = e.drain;
    const what = d.state === 'requested' ? 'asked to leave' : `drain ${d.state}`;
    const at_ = d.state === 'honoured' && d.generation ? `, left at generation ${d.generation}` : '';
    return { time: at, what: `${what} (elastic job ${e.elasticId})`, worker: d.workerId, reason: `${d.reason}${at_}` };
  }
  if (e.kind === 'healthChanged') {
    return {
      time: at,
      what: e.status === 'ok' ? 'PMIx progresses again' : 'PMIx server stalled',
      reason: `${e.pmixStalledSeconds.toFixed(1)} s`,
    };
  }
  return undefined;
}

export const dashboardRoutes: FastifyPluginAsync<DashboardOptions> = async (app, opts) => {
  const { rm, auth } = opts;
  const maxJobs = opts.maxJobs ?? 200;
  // Bounded by the registered workers: only a registered worker's traffic is taken, and a worker
  // that is gone (or registered again since: a new process) is dropped at the next read.
  const traffic = new Map<string, Traffic & { at: string; registeredAt: string }>();
  // The latest notices, newest last; kept apart from the event history, which a busy cluster's
  // jobs cycle through in minutes.
  const notices: Notice[] = [];
  const unsubscribe = rm.events.subscribe(({ event, time }) => {
    const n = noticeOf(event, time);
    if (!n) return;
    notices.push(n);
    if (notices.length > NOTICES) notices.shift();
  });
  app.addHook('onClose', async () => unsubscribe());
  const tryWorker = (id: string) => {
    try {
      return rm.getWorker(id);
    } catch {
      return undefined;
    }
  };

  app.put<Body<{ workers: (Traffic & { id: string })[] }>>(
    '/traffic',
    {
      onRequest: auth.write,
      schema: {
        security: auth.security.write,
        summary:
          "The bytes each worker's comm backend moved per transport since it started (the scheduler plugin reports " +
          'them); workers that are not registered are left out',
        tags: ['workers'],
        body: trafficSchema,
        response: {
          200: { type: 'object', properties: { accepted: { type: 'integer' } }, required: ['accepted'] },
          ...errors(400, 401),
        },
      },
    },
    async (req) => {
      let accepted = 0;
      for (const t of req.body.workers) {
        const w = tryWorker(t.id);
        if (!w) continue;
        const seen = { at: new Date().toISOString(), registeredAt: w.registeredAt };
        traffic.set(t.id, { tcp: t.tcp, mpi: t.mpi, ...(t.cma ? { cma: t.cma } : {}), ...seen });
        accepted++;
      }
      return { accepted };
    },
  );

  app.get(
    '/dashboard',
    {
      onRequest: auth.read,
      schema: {
        ...(auth.security.read ? { security: auth.security.read } : {}),
        summary:
          'What the dashboard page shows: workers, pool epochs, psets, recent jobs, traffic, notices; no namespaces, pids or uids',
        tags: ['service'],
        response: { ...errors(401) },
      },
    },
    async () => {
      const workers = rm.listWorkers();
      const present = new Map(workers.map((w) => [w.id, w.registeredAt]));
      for (const [id, t] of [...traffic]) if (present.get(id) !== t.registeredAt) traffic.delete(id);
      // A rank is busy while its worker is a member of a running in-process job (a fork job's
      // members run as other processes and leave the rank idle).
      const inprocess = new Set(
        rm
          .activeJobs()
          .filter((j) => j.mode === 'inprocess')
          .map((j) => j.id),
      );
      const busy = new Map<number, number>();
      const seated = new Map<number, number>();
      for (const w of workers) {
        if (!w.pool || w.pool.impl || w.pool.state === 'retired') continue;
        seated.set(w.pool.epoch, (seated.get(w.pool.epoch) ?? 0) + 1);
        if (w.jobId && inprocess.has(w.jobId)) busy.set(w.pool.epoch, (busy.get(w.pool.epoch) ?? 0) + 1);
      }
      const pmix = opts.pmixProgress?.() ?? { stalled: false, stalledMs: 0 };
      const jobs = [...rm.listJobs()].sort((a, b) => b.createdAt.localeCompare(a.createdAt)).slice(0, maxJobs);
      return {
        version: opts.version,
        pmixVersion: opts.pmixVersion,
        status: rm.isStopping ? 'stopping' : pmix.stalled ? 'pmix-stalled' : 'ok',
        now: new Date().toISOString(),
        workers: workers.map((w) => ({
          id: w.id,
          host: w.host,
          state: w.state,
          ...(w.jobId ? { jobId: w.jobId } : {}),
          ...(w.pool
            ? {
                pool: {
                  epoch: w.pool.epoch,
                  rank: w.pool.rank,
                  state: w.pool.state,
                  ...(w.pool.impl ? { impl: w.pool.impl } : {}),
                },
              }
            : {}),
          ...(traffic.has(w.id) ? { traffic: trafficView(traffic.get(w.id)!) } : {}),
        })),
        epochs: (rm.pool?.epochSummaries() ?? []).map((e) => ({
          ...e,
          seated: seated.get(e.epoch) ?? 0,
          busy: busy.get(e.epoch) ?? 0,
        })),
        psets: rm.listPsets().map((p) => ({ name: p.name, members: [...p.members] })),
        jobs: jobs.map(jobView),
        notices: [...notices].reverse(),
      };
    },
  );
};
