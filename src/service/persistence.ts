// Keeps the state store in step with the core: restores what an earlier run left (and removes the
// shared-memory segments of its jobs that were still running, and of its pool epochs: their
// workers are all replaced, and a worker whose PMIx server is gone cannot finalize and unlink its
// own), then writes each pset and job change, and each pool epoch, as it happens.
import type { ResourceManager } from '../rm/manager.js';
import { isActive } from '../rm/types.js';
import type { StateStore, StoreLog } from '../store/state-store.js';
import { removeShmSegments } from './shm-cleanup.js';

export interface Restored {
  psets: number;
  jobs: number;
  /** Jobs that were active when the earlier run ended. */
  interrupted: string[];
  shmRemoved: string[];
}

export const RESTART_REASON = 'the sidecar stopped before the job ended (it was restarted)';

export interface Persisted {
  store: StateStore;
  restored: Restored;
  stop: () => void;
}

/**
 * Opens the store in `dir`, restores it into `rm` and follows `rm` from then on. The SQLite
 * binding is a native module built for one Node.js ABI: on another Node it does not load, and
 * the sidecar runs without persistence (the error says why) rather than not at all.
 */
export async function persist(
  rm: ResourceManager,
  dir: string,
  log?: StoreLog,
  shmDir = '/dev/shm',
): Promise<Persisted | Error> {
  let store: StateStore;
  try {
    // The binding loads its native part when the first database opens.
    store = (await import('../store/state-store.js')).StateStore.open(dir, log);
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
  const psets = store.psets();
  const jobs = store.jobs();
  const interrupted = jobs.filter((j) => isActive(j.state));
  const shmRemoved = removeShmSegments(
    [...new Set([...interrupted.map((j) => j.namespace), ...store.pools()])],
    shmDir,
  );
  store.forgetPools();
  rm.restore({ psets, jobs }, RESTART_REASON);
  store.saveAll(
    [],
    rm.listJobs().filter((j) => interrupted.some((i) => i.id === j.id)),
  );

  let seen = ''; // the last pool namespace written: most events repeat it
  const unsubscribe = rm.events.subscribe(({ event: e }) => {
    if (e.kind === 'psetDefined') store.savePset(e.pset);
    else if (e.kind === 'psetDeleted') store.deletePset(e.name);
    else if (e.kind === 'jobStateChanged') store.saveJob(e.job);
    else if (e.kind === 'workerPoolChanged' && e.pool.namespace !== seen) {
      seen = e.pool.namespace;
      store.savePool(seen);
    }
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
