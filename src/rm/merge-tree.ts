// The merge tree that joins the size-1 MPI worlds of an in-process MPICH / Intel MPI job into one
// communicator (python/dask_pmix/merge_tree.py runs it; this side checks what members send).
//
// Round by round (step = 1, 2, 4, ...), the groups of `step` consecutive job ranks that begin at
// a multiple of 2*step merge with the group right after them: the lower group's first rank
// accepts (MPI_Comm_accept over its group) on a port it opened for that step, the upper group's
// first rank connects (over its group), both sides MPI_Intercomm_merge with the lower group
// first. After ceil(log2(size)) rounds every rank holds one communicator whose rank order is the
// job's. Each accepting rank opens one port per step it accepts at: one port serving two rounds
// would let a connector of the later round reach the earlier round's accept (measured: wrong
// groups merged, ranks deadlocked or crashed).

/** The steps at which job rank `rank` of `size` accepts a merge (and so needs a port). */
export function acceptSteps(rank: number, size: number): number[] {
  const steps: number[] = [];
  for (let step = 1; step < size; step *= 2) {
    if (rank % (2 * step) === 0 && rank + step < size) steps.push(step);
  }
  return steps;
}

/** Longest port name a member may send (MPICH's MPI_MAX_PORT_NAME). */
export const MAX_PORT_NAME = 1024;
