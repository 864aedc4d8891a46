// Keeps the state store in step with the core: restores what an earlier run left (and removes the
// shared-memory segments of its jobs that were still running), then writes each pset and job
// change as it happens.
import type { ResourceManager } from '../rm/manager.js';
import { isActive } from '../rm/types.js';
import { StateStore } from '../store/state-store.js';
import { removeShmSegments } from './shm-cleanup.js';

export interface Restored {
  psets: number;
  jobs: number;
  /** Jobs that were active when the earlier run ended. */
  interrupted: string[];
  shmRemoved: string[];
}

export const RESTART_REASON = 'the sidecar stopped before the job ended (it was restarted)';

/** Opens the store in `dir`, restores it into `rm` and follows `rm` from then on. */
export function persist(rm: ResourceManager, dir: string): { store: StateStore; restored: Restored; stop: () => void } {
  const store = StateStore.open(dir);
  const psets = store.psets();
  const jobs = store.jobs();
  const interrupted = jobs.filter((j) => isActive(j.state));
  const shmRemoved = removeShmSegments(interrupted.map((j) => j.namespace));
  rm.restore({ psets, jobs }, RESTART_REASON);
  store.saveAll([], rm.listJobs().filter((j) => interrupted.some((i) => i.id === j.id)));

  const unsubscribe = rm.events.subscribe(({ event: e }) => {
    if (e.kind === 'psetDefined') store.savePset(e.pset);
    else if (e.kind === 'psetDeleted') store.deletePset(e.name);
    else if (e.kind === 'jobStateChanged') store.saveJob(e.job);
  });
  return {
    store,
    restored: { psets: psets.length, jobs: jobs.length, interrupted: interrupted.map((j) => j.id), shmRemoved },
    stop: () => {
      unsubscribe();
      store.close();
    },
  };
}
