// Prometheus metrics, written by hand (a few counters and histograms do not need a library).
// The service feeds the upcall and collective observations; the core's counts are read at
// scrape time.
import type { ResourceManager } from '../rm/manager.js';

const BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

type Labels = Record<string, string>;
const key = (l: Labels) => JSON.stringify(Object.entries(l).sort());
const fmt = (l: Labels) => {
  const parts = Object.entries(l).map(([k, v]) => `${k}="${v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`);
  return parts.length ? `{${parts.join(',')}}` : '';
};

class Counter {
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  constructor(readonly name: string, readonly help: string) {}
  inc(labels: Labels = {}, by = 1): void {
    const k = key(labels);
    const v = this.values.get(k);
    if (v) v.value += by;
    else this.values.set(k, { labels, value: by });
  }
  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`];
    for (const v of this.values.values()) out.push(`${this.name}${fmt(v.labels)} ${v.value}`);
    return out;
  }
}

class Histogram {
  private readonly series = new Map<string, { labels: Labels; counts: number[]; sum: number; count: number }>();
  constructor(readonly name: string, readonly help: string) {}
  observe(labels: Labels, seconds: number): void {
    const k = key(labels);
    let s = this.series.get(k);
    if (!s) this.series.set(k, (s = { labels, counts: BUCKETS.map(() => 0), sum: 0, count: 0 }));
    BUCKETS.forEach((b, i) => { if (seconds <= b) s!.counts[i]!++; });
    s.sum += seconds;
    s.count++;
  }
  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (const s of this.series.values()) {
      BUCKETS.forEach((b, i) => out.push(`${this.name}_bucket${fmt({ ...s.labels, le: String(b) })} ${s.counts[i]}`));
      out.push(`${this.name}_bucket${fmt({ ...s.labels, le: '+Inf' })} ${s.count}`);
      out.push(`${this.name}_sum${fmt(s.labels)} ${s.sum}`);
      out.push(`${this.name}_count${fmt(s.labels)} ${s.count}`);
    }
    return out;
  }
}

function gauge(name: string, help: string, rows: [Labels, number][]): string[] {
  return [`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, ...rows.map(([l, v]) => `${name}${fmt(l)} ${v}`)];
}

export class Metrics {
  readonly upcalls = new Counter('dask_pmix_pmix_upcalls_total', 'PMIx upcalls answered, by upcall and PMIx status');
  readonly upcallSeconds = new Histogram('dask_pmix_pmix_upcall_seconds', 'Time from a PMIx upcall to its answer');
  readonly collectiveSeconds = new Histogram('dask_pmix_collective_seconds', 'Duration of collectives (fence, barrier, group construct) from first to last join');
  readonly httpRequests = new Counter('dask_pmix_http_requests_total', 'REST requests, by method, route and status code');
  readonly httpSeconds = new Histogram('dask_pmix_http_request_seconds', 'REST request latency, by route');

  constructor(private readonly rm: ResourceManager) {}

  render(): string {
    const s = this.rm.stats();
    const lines = [
      ...gauge('dask_pmix_workers', 'Registered workers, by state', Object.entries(s.workers).map(([state, n]) => [{ state }, n])),
      ...gauge('dask_pmix_psets', 'Defined process sets', [[{}, s.psets]]),
      ...gauge('dask_pmix_jobs', 'Known jobs, by state', Object.entries(s.jobs).map(([state, n]) => [{ state }, n])),
      ...gauge('dask_pmix_published_names', 'Entries in the name service', [[{}, s.names]]),
      ...gauge('dask_pmix_jobs_by_mode', 'Known jobs, by the mode they run in', Object.entries(s.modes).map(([mode, n]) => [{ mode }, n])),
      ...(s.pool
        ? [
            ...gauge('dask_pmix_pool_epochs', 'Open epochs (namespaces) of the in-process pool', [[{}, s.pool.epochs]]),
            ...gauge('dask_pmix_pool_ranks', 'Ranks of the open pool epochs, by state', Object.entries(s.pool.ranks).map(([state, n]) => [{ state }, n])),
          ]
        : []),
      `# HELP dask_pmix_jobs_created_total Jobs created since start`, `# TYPE dask_pmix_jobs_created_total counter`,
      `dask_pmix_jobs_created_total ${this.rm.jobsCreated}`,
      `# HELP dask_pmix_context_ids_allocated_total PMIx group context ids handed out`, `# TYPE dask_pmix_context_ids_allocated_total counter`,
      `dask_pmix_context_ids_allocated_total ${this.rm.contextIds.allocated}`,
      ...this.upcalls.render(),
      ...this.upcallSeconds.render(),
      ...this.collectiveSeconds.render(),
      ...this.httpRequests.render(),
      ...this.httpSeconds.render(),
    ];
    return lines.join('\n') + '\n';
  }
}
