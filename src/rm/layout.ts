// Where a job's ranks live: given the workers in rank order, each rank's host, its rank among
// the job's ranks on that host, and the host's index. Ranks on different hosts must be told
// so, or an MPI library will try shared memory between them.
import type { JobMember, Worker } from './types.js';

export function layoutMembers(workers: readonly Worker[]): JobMember[] {
  const nodeIds = new Map<string, number>();
  const perHost = new Map<string, number>();
  return workers.map((w, rank) => {
    let nodeId = nodeIds.get(w.host);
    if (nodeId === undefined) nodeIds.set(w.host, (nodeId = nodeIds.size));
    const localRank = perHost.get(w.host) ?? 0;
    perHost.set(w.host, localRank + 1);
    return { workerId: w.id, rank, host: w.host, localRank, nodeRank: localRank, nodeId, state: 'assigned' };
  });
}
