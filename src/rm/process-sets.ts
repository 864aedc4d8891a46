// Named sets of workers. A pset is a set of Dask workers, not of MPI processes: its members get
// process identities (namespace, rank) only when a job runs on them.
import { RmError } from './errors.js';
import type { ProcessSet, Selector } from './types.js';

/** Names a client may use; reserved: the mpi:// and mpix:// sets MPI libraries define. */
export const PSET_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.:\-/]{0,127}$/;

export class ProcessSets {
  private readonly sets = new Map<string, ProcessSet>();

  static validateName(name: string): void {
    if (!PSET_NAME.test(name)) {
      throw new RmError(
        'bad_request',
        `invalid pset name '${name}': 1-128 characters of [A-Za-z0-9_.:-/], not starting with a punctuation mark`,
      );
    }
    if (/^mpix?:\/\//.test(name))
      throw new RmError('bad_request', `pset names starting with mpi:// or mpix:// are reserved`);
  }

  define(name: string, members: string[], selector: Selector | undefined, createdAt: string): ProcessSet {
    if (this.sets.has(name)) throw new RmError('conflict', `pset '${name}' already exists`);
    const p: ProcessSet = { name, members: [...members], createdAt };
    if (selector) p.selector = structuredClone(selector);
    this.sets.set(name, p);
    return p;
  }

  get(name: string): ProcessSet | undefined {
    return this.sets.get(name);
  }

  require(name: string): ProcessSet {
    const p = this.sets.get(name);
    if (!p) throw new RmError('not_found', `no pset '${name}'`);
    return p;
  }

  delete(name: string): ProcessSet {
    const p = this.require(name);
    this.sets.delete(name);
    return p;
  }

  /** Marks `workerId` gone (left the cluster) in every pset it is a member of; those psets. */
  memberGone(workerId: string): ProcessSet[] {
    const changed = [...this.sets.values()].filter((p) => p.members.includes(workerId) && !p.gone?.includes(workerId));
    for (const p of changed) p.gone = [...(p.gone ?? []), workerId];
    return changed;
  }

  /** `workerId` is registered (again): no pset counts it gone any more; those psets. */
  memberBack(workerId: string): ProcessSet[] {
    const changed = [...this.sets.values()].filter((p) => p.gone?.includes(workerId));
    for (const p of changed) {
      p.gone = p.gone!.filter((g) => g !== workerId);
      if (!p.gone.length) delete p.gone;
    }
    return changed;
  }

  list(): ProcessSet[] {
    return [...this.sets.values()];
  }

  get size(): number {
    return this.sets.size;
  }
}
