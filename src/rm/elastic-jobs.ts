// Elastic jobs as the sidecar sees them. An elastic job (dask_pmix.run_elastic) is a chain of
// ordinary jobs, its generations, labelled with its id; the scheduler plugin decides who leaves
// and joins at each commit, and records here the drain requests it makes of the job and how each
// ended. The sidecar keeps the drains (bounded) and reads the generations off its job history,
// so what GET /v1/elastic shows reaches back as far as that history does.
import type { Clock } from './clock.js';
import { isoTime } from './clock.js';
import { RmError } from './errors.js';
import type { EventLog } from './events.js';
import type { DrainRequest, DrainState, ElasticGeneration, ElasticJob, Job } from './types.js';

/** The labels run_elastic gives each generation's job (python/dask_pmix/protocol.py). */
export const ELASTIC_LABEL = 'dask-pmix.elastic';
export const GENERATION_LABEL = 'dask-pmix.generation';
export const CHANGE_LABEL = 'dask-pmix.change';

/** Drain requests kept per elastic job (the newest), and elastic jobs with drains kept at all. */
export const MAX_DRAINS_PER_JOB = 64;
export const MAX_DRAINED_JOBS = 256;

const ENDED: readonly DrainState[] = ['honoured', 'lapsed', 'overdue', 'withdrawn'];

export class ElasticJobs {
  /** Drains by elastic job id, in insertion order (the oldest job first, for trimming). */
  private readonly drains = new Map<string, DrainRequest[]>();

  constructor(
    private readonly jobs: () => readonly Readonly<Job>[],
    private readonly events: EventLog,
    private readonly clock: Clock,
  ) {}

  list(): ElasticJob[] {
    const ids = new Set<string>(this.drains.keys());
    for (const j of this.jobs()) {
      const id = j.labels[ELASTIC_LABEL];
      if (id) ids.add(id);
    }
    return [...ids].map((id) => this.view(id));
  }

  get(id: string): ElasticJob {
    const view = this.view(id);
    if (!view.generations.length && !view.drains.length) throw new RmError('not_found', `no elastic job '${id}'`);
    return view;
  }

  /**
   * A drain request of `workerId`, or its end. A request that already ended stays as it ended: the
   * scheduler's record of a worker's next request opens a new entry.
   */
  record(id: string, workerId: string, state: DrainState, reason: string, generation?: number): DrainRequest {
    if (!id) throw new RmError('bad_request', 'an elastic job needs an id');
    if (!workerId) throw new RmError('bad_request', 'a drain request names a worker');
    const now = isoTime(this.clock.now());
    let list = this.drains.get(id);
    const open = [...(list ?? [])].reverse().find((d) => d.workerId === workerId && d.state === 'requested');
    let drain: DrainRequest;
    if (state === 'requested') {
      if (open) {
        open.reason = reason || open.reason;
        return { ...open };
      }
      drain = { workerId, reason, state, requestedAt: now };
      if (!list) {
        list = [];
        this.drains.set(id, list);
        for (const old of this.drains.keys()) {
          if (this.drains.size <= MAX_DRAINED_JOBS) break;
          this.drains.delete(old);
        }
      }
      list.push(drain);
      if (list.length > MAX_DRAINS_PER_JOB) list.splice(0, list.length - MAX_DRAINS_PER_JOB);
    } else {
      if (!ENDED.includes(state)) throw new RmError('bad_request', `no drain state '${state}'`);
      if (!open) throw new RmError('conflict', `worker '${workerId}' has no drain request open in elastic job '${id}'`);
      drain = open;
      drain.state = state;
      drain.resolvedAt = now;
      if (reason) drain.reason = reason;
      if (generation !== undefined) drain.generation = generation;
    }
    this.events.emit({ kind: 'drainChanged', elasticId: id, drain: { ...drain } });
    return { ...drain };
  }

  private view(id: string): ElasticJob {
    const generations: ElasticGeneration[] = [];
    for (const j of this.jobs()) {
      if (j.labels[ELASTIC_LABEL] !== id) continue;
      generations.push({
        generation: Number(j.labels[GENERATION_LABEL] ?? 0) || 0,
        jobId: j.id,
        workers: [...j.members].sort((a, b) => a.rank - b.rank).map((m) => m.workerId),
        change: j.labels[CHANGE_LABEL] ?? '',
        state: j.state,
        createdAt: j.createdAt,
        ...(j.endedAt ? { endedAt: j.endedAt } : {}),
        ...(j.error ? { error: j.error } : {}),
      });
    }
    generations.sort((a, b) => a.generation - b.generation || a.createdAt.localeCompare(b.createdAt));
    const drains = (this.drains.get(id) ?? []).map((d) => ({ ...d }));
    const newest = generations.at(-1);
    return { id, generations, drains, ...(newest ? { state: newest.state } : {}) };
  }
}
