// In-process seats for MPICH and Intel MPI: each worker process is an MPI world of its own, of
// size 1, initialised once for the process's life. MPICH has no way to build a communicator
// over part of a pre-sized world (research H: the 5.0.2 wheel's first communicator needs every
// rank of its PMI world), so a job over such workers is built inside the worker processes by a
// merge tree of MPI_Comm_accept/connect + MPI_Intercomm_merge (merge-tree.ts) over ports the
// members open for it and the sidecar hands around (JobLifecycle.join).
//
// A seat is a PoolSeat with `impl` set (epoch 0, rank 0, its world's kvsname as namespace):
// joining (the worker fetched its environment) → ready (its PMI connection is bound) → retired
// (the worker left, its connection closed, or it could not join). A world is never reused.
//
// Plain TypeScript without I/O: the PMI side of a world is the WorldBackend's.
import { RmError } from './errors.js';
import type { EventLog } from './events.js';
import type { PoolPlan } from './pool.js';
import type { Impl, PoolSeat, Worker } from './types.js';
import type { WorkerPool } from './worker-pool.js';

/** The protocol side of the worlds (PMI): what the core needs to open and forget one. */
export interface WorldBackend {
  /** The libraries whose processes can be worlds of their own. */
  readonly impls: readonly Impl[];
  /** Makes the world known to the protocol server; the environment its process sets first. */
  open(namespace: string, impl: Impl, worker: Readonly<Worker>): Record<string, string>;
  /** Forgets the world (its connection stays open until its process closes it). */
  close(namespace: string): void;
}

export interface WorldsOptions {
  backend: WorldBackend;
  workers: WorkerPool;
  events: EventLog;
  /** The kvsname of the n-th world. */
  namespaceOf: (n: number) => string;
}

export class Worlds {
  /** Worlds not retired: namespace → worker id. */
  private readonly open = new Map<string, string>();
  private counter = 0;

  constructor(private readonly o: WorldsOptions) {}

  get impls(): readonly Impl[] {
    return this.o.backend.impls;
  }

  /** Whether `w`'s in-process seat is a world of its own (not an Open MPI pool rank). */
  static isWorld(seat: Readonly<PoolSeat> | undefined): boolean {
    return !!seat?.impl && seat.impl !== 'openmpi';
  }

  /** The worker process is about to initialise MPI as a world of its own: its seat and env. */
  join(w: Worker, impl: Impl): { seat: PoolSeat; env: Record<string, string> } {
    if (!this.o.backend.impls.includes(impl))
      throw new RmError('unprocessable', `${impl} processes cannot join in-process jobs here`);
    if (Worlds.isWorld(w.pool)) {
      const s = w.pool!;
      if (s.state === 'retired')
        throw new RmError('conflict', `worker '${w.id}' left the pool: ${s.reason ?? 'retired'}`);
      throw new RmError('conflict', `worker '${w.id}' already has its ${s.impl} world (${s.state})`);
    }
    const namespace = this.o.namespaceOf(this.counter++);
    const env = this.o.backend.open(namespace, impl, w);
    w.pool = { epoch: 0, namespace, rank: 0, state: 'joining', impl };
    this.open.set(namespace, w.id);
    this.emit(w);
    return { seat: w.pool, env };
  }

  /** Why a connection as this world must be refused, or undefined. */
  refusal(namespace: string): string | undefined {
    const w = this.workerOf(namespace);
    if (!w) return `world ${namespace} belongs to no registered worker`;
    if (w.pool!.state !== 'joining') return `world ${namespace} is ${w.pool!.state} already`;
    return undefined;
  }

  /** The world's MPI library bound its PMI connection; returns its worker. */
  connected(namespace: string): Worker {
    const w = this.workerOf(namespace);
    if (!w) throw new RmError('not_found', `world ${namespace} belongs to no registered worker`);
    if (w.pool!.state !== 'joining') throw new RmError('conflict', `world ${namespace} is ${w.pool!.state}`);
    w.pool!.state = 'ready';
    this.emit(w);
    return w;
  }

  /** The world's connection ended (finalized, or its process died); returns its worker. */
  gone(namespace: string, reason: string): Worker | undefined {
    const w = this.workerOf(namespace);
    if (w) this.retire(w, reason);
    else this.forget(namespace);
    return w;
  }

  /** The worker's world is of no more use (it left, or it gave its seat up): never reused. */
  retire(w: Worker, reason: string): void {
    const s = w.pool;
    if (!Worlds.isWorld(s) || s!.state === 'retired') return;
    s!.state = 'retired';
    s!.reason = reason;
    this.forget(s!.namespace);
    this.emit(w);
  }

  /** The worker of a live world, if it is still registered. */
  workerOf(namespace: string): Worker | undefined {
    const id = this.open.get(namespace);
    const w = id ? this.o.workers.get(id) : undefined;
    return w?.pool?.namespace === namespace ? w : undefined;
  }

  /** Whether an in-process job of `impl` can run over these workers. */
  plan(workers: readonly Worker[], impl: Impl): PoolPlan {
    for (const w of workers) {
      const s = w.pool;
      if (s?.state === 'retired') return { reason: `worker '${w.id}' left the pool: ${s.reason ?? 'retired'}` };
      if (!Worlds.isWorld(s)) {
        return {
          reason: `worker '${w.id}' has no ${impl} world (no dask-pmix worker plugin, another MPI library, or it has not started yet)`,
          pending: s?.state === 'assigned',
        };
      }
      if (s!.impl !== impl) return { reason: `worker '${w.id}' runs ${s!.impl}, not ${impl}` };
      if (s!.state !== 'ready')
        return { reason: `worker '${w.id}' has not finished initialising its ${impl} world`, pending: true };
    }
    if (workers.length === 0) return { reason: 'no members' };
    return { epoch: 0, namespace: '' };
  }

  /** Workers that can run an in-process job of `impl`. */
  candidates(available: readonly Worker[], impl: Impl): Worker[] {
    return available.filter((w) => w.pool?.impl === impl && w.pool.state === 'ready');
  }

  /** For /metrics: live worlds. */
  get size(): number {
    return this.open.size;
  }

  private forget(namespace: string): void {
    if (this.open.delete(namespace)) this.o.backend.close(namespace);
  }

  private emit(w: Worker): void {
    if (w.pool) this.o.events.emit({ kind: 'workerPoolChanged', workerId: w.id, pool: structuredClone(w.pool) });
  }
}
