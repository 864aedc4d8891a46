// Prometheus metrics through prom-client: the process's own (RSS, heap, event-loop lag, GC)
// come with its default collectors; the service feeds the upcall, collective and HTTP
// observations; the core's counts are read at scrape time.
import client from 'prom-client';
import type { ResourceManager } from '../rm/manager.js';

const BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export class Metrics {
  /** One registry per sidecar (tests run several in one process). */
  readonly registry = new client.Registry();
  readonly upcalls: client.Counter<'upcall' | 'status'>;
  readonly upcallSeconds: client.Histogram<'upcall'>;
  readonly collectiveSeconds: client.Histogram<'name' | 'outcome'>;
  readonly httpRequests: client.Counter<'method' | 'route' | 'code'>;
  readonly httpSeconds: client.Histogram<'route'>;
  readonly eventSubscribers: client.Gauge;
  readonly eventStreamsDropped: client.Counter;

  constructor(rm: ResourceManager) {
    const registers = [this.registry];
    client.collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: 20 });
    this.upcalls = new client.Counter({
      name: 'dask_pmix_pmix_upcalls_total',
      help: 'PMIx upcalls answered, by upcall and PMIx status',
      labelNames: ['upcall', 'status'],
      registers,
    });
    this.upcallSeconds = new client.Histogram({
      name: 'dask_pmix_pmix_upcall_seconds',
      help: 'Time from a PMIx upcall to its answer',
      labelNames: ['upcall'],
      buckets: BUCKETS,
      registers,
    });
    this.collectiveSeconds = new client.Histogram({
      name: 'dask_pmix_collective_seconds',
      help: 'Duration of collectives (fence, barrier, group construct) from first to last join',
      labelNames: ['name', 'outcome'],
      buckets: BUCKETS,
      registers,
    });
    this.httpRequests = new client.Counter({
      name: 'dask_pmix_http_requests_total',
      help: 'REST requests, by method, route and status code',
      labelNames: ['method', 'route', 'code'],
      registers,
    });
    this.httpSeconds = new client.Histogram({
      name: 'dask_pmix_http_request_seconds',
      help: 'REST request latency, by route',
      labelNames: ['route'],
      buckets: BUCKETS,
      registers,
    });
    this.eventSubscribers = new client.Gauge({
      name: 'dask_pmix_event_subscribers',
      help: 'Open event streams',
      registers,
    });
    this.eventStreamsDropped = new client.Counter({
      name: 'dask_pmix_event_streams_dropped_total',
      help: 'Event streams closed because their reader fell too far behind',
      registers,
    });

    const stats = () => rm.stats();
    new client.Gauge({
      name: 'dask_pmix_workers',
      help: 'Registered workers, by state',
      labelNames: ['state'],
      registers,
      collect() {
        for (const [state, n] of Object.entries(stats().workers)) this.set({ state }, n);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_psets',
      help: 'Defined process sets',
      registers,
      collect() {
        this.set(stats().psets);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_jobs',
      help: 'Known jobs, by state',
      labelNames: ['state'],
      registers,
      collect() {
        for (const [state, n] of Object.entries(stats().jobs)) this.set({ state }, n);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_published_names',
      help: 'Entries in the name service',
      registers,
      collect() {
        this.set(stats().names);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_jobs_by_mode',
      help: 'Known jobs, by the mode they run in',
      labelNames: ['mode'],
      registers,
      collect() {
        for (const [mode, n] of Object.entries(stats().modes)) this.set({ mode }, n);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_pool_epochs',
      help: 'Open epochs (namespaces) of the in-process pool',
      registers,
      collect() {
        this.set(stats().pool?.epochs ?? 0);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_pool_ranks',
      help: 'Ranks of the open pool epochs, by state',
      labelNames: ['state'],
      registers,
      collect() {
        for (const [state, n] of Object.entries(stats().pool?.ranks ?? {})) this.set({ state }, n);
      },
    });
    new client.Counter({
      name: 'dask_pmix_jobs_created_total',
      help: 'Jobs created since start',
      registers,
      collect() {
        this.reset();
        this.inc(rm.jobsCreated);
      },
    });
    new client.Counter({
      name: 'dask_pmix_context_ids_allocated_total',
      help: 'PMIx group context ids handed out',
      registers,
      collect() {
        this.reset();
        this.inc(rm.contextIds.allocated);
      },
    });
  }

  /**
   * The PMIx gate's counters (connections by what became of them) and what waits: handshakes
   * still being sent, and namespaces of ended jobs whose clients are still connected.
   */
  watchGate(gate: () => Readonly<Record<string, number>>, lingeringNamespaces: () => number): void {
    const registers = [this.registry];
    new client.Counter({
      name: 'dask_pmix_gate_connections_total',
      help: 'Connections to the PMIx gate, by what became of them',
      labelNames: ['outcome'],
      registers,
      collect() {
        this.reset();
        for (const [outcome, n] of Object.entries(gate())) if (outcome !== 'pending') this.inc({ outcome }, n);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_gate_pending',
      help: 'Connections still sending their PMIx handshake',
      registers,
      collect() {
        this.set(gate().pending ?? 0);
      },
    });
    new client.Gauge({
      name: 'dask_pmix_pmix_lingering_namespaces',
      help: 'Namespaces of ended jobs waiting for their clients to disconnect',
      registers,
      collect() {
        this.set(lingeringNamespaces());
      },
    });
  }

  /** The C allocator's bytes, outside V8's heap: what a native leak grows, which RSS cannot show apart from freed memory the allocator keeps. */
  watchAllocator(stats: () => { inUseBytes: number; freeBytes: number }): void {
    new client.Gauge({
      name: 'dask_pmix_native_heap_bytes',
      help: 'Bytes of the C allocator (libpmix, the addon, Node): in use, or freed and kept in its arenas',
      labelNames: ['kind'],
      registers: [this.registry],
      collect() {
        const s = stats();
        this.set({ kind: 'in_use' }, s.inUseBytes);
        this.set({ kind: 'free' }, s.freeBytes);
      },
    });
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  render(): Promise<string> {
    return this.registry.metrics();
  }
}
