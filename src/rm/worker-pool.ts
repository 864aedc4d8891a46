// The Dask workers the sidecar knows, and whether each is free to join a job.
import { RmError } from './errors.js';
import type { Worker, WorkerSpec, WorkerState } from './types.js';

export class WorkerPool {
  private readonly workers = new Map<string, Worker>();

  add(spec: WorkerSpec, registeredAt: string): Worker {
    if (this.workers.has(spec.id)) throw new RmError('conflict', `worker '${spec.id}' is already registered`);
    const w: Worker = {
      id: spec.id,
      address: spec.address ?? spec.id,
      host: spec.host,
      pid: spec.pid ?? 0,
      resources: { ...(spec.resources ?? {}) },
      tags: [...new Set(spec.tags ?? [])],
      state: 'available',
      registeredAt,
    };
    if (spec.uid !== undefined) w.uid = spec.uid;
    if (spec.gid !== undefined) w.gid = spec.gid;
    this.workers.set(w.id, w);
    return w;
  }

  /** What the worker process says of itself (the registration may have come from elsewhere). */
  identify(id: string, who: { host?: string; pid?: number; uid?: number; gid?: number }): Worker {
    const w = this.require(id);
    if (who.host) w.host = who.host;
    if (who.pid !== undefined) w.pid = who.pid;
    if (who.uid !== undefined) w.uid = who.uid;
    if (who.gid !== undefined) w.gid = who.gid;
    return w;
  }

  get(id: string): Worker | undefined {
    return this.workers.get(id);
  }

  require(id: string): Worker {
    const w = this.workers.get(id);
    if (!w) throw new RmError('not_found', `no worker '${id}'`);
    return w;
  }

  remove(id: string): Worker {
    const w = this.require(id);
    this.workers.delete(id);
    w.state = 'gone';
    return w;
  }

  /** Marks the worker as a member of `jobId` (or frees it); returns the previous state. */
  setJob(id: string, jobId: string | undefined): WorkerState {
    const w = this.require(id);
    const from = w.state;
    if (jobId) {
      w.state = 'frozen';
      w.jobId = jobId;
    } else {
      w.state = 'available';
      delete w.jobId;
    }
    return from;
  }

  list(): Worker[] {
    return [...this.workers.values()];
  }

  get size(): number {
    return this.workers.size;
  }
}
