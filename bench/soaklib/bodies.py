"""The functions the soak runs as MPI jobs (fn(comm, ...) of run_mpi). They travel to the workers
by value (cloudpickle), so they import what they use inside."""

from __future__ import annotations


def healthy(comm, token):
    """A normal job: one Allreduce whose result says every member took part."""
    import os

    total = comm.allreduce(comm.Get_rank() + 1)
    return {"token": token, "size": comm.Get_size(), "rank": comm.Get_rank(), "sum": total, "pid": os.getpid()}


def canary(i, log):
    """A chunk of the data each cluster keeps for the whole soak: every computation of it adds a
    line to `log`, so a chunk computed twice (its worker's data lost) shows."""
    import numpy as np

    with open(log, "a") as f:
        f.write(f"{i}\n")
    return np.full(10_000, i, dtype="f8")


def stalled(comm, marker_dir, token, hold):
    """A healthy job that holds its members `hold` s between two Barriers (the soak stops the
    sidecar meanwhile); returns what healthy() returns."""
    import time

    _mark(marker_dir, token, comm.Get_rank())
    comm.Barrier()
    time.sleep(hold)
    comm.Barrier()
    return healthy(comm, token)


def _mark(marker_dir, token, rank, what="in"):
    """Writes `<token>.<rank>.<what>`: this rank's pid and the wall time (atomically)."""
    import os
    import time

    path = os.path.join(marker_dir, f"{token}.{rank}.{what}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {time.time():.6f}")
    os.replace(path + ".tmp", path)


def faulty(comm, marker_dir, token, victim, how, hold=0.0):
    """A job with a fault in it. Every rank marks itself in and meets the others; then
    - "kill":       the victim waits to be killed (kill -9 from the soak), the others wait for it in a Barrier;
    - "abort":      the victim calls MPI_Abort, the others wait for it in a Barrier;
    - "hang-sleep": the victim sleeps in Python (ignores MPI), the others wait in a Barrier: the job's timeout ends it;
    - "hang-mpi":   the victim waits in a receive nobody sends, the others in a Barrier;
    - "hold":       everyone sleeps `hold` s between two Barriers (the soak kills the sidecar meanwhile).
    """
    import time

    rank = comm.Get_rank()
    _mark(marker_dir, token, rank)
    comm.Barrier()
    if how == "hold":
        time.sleep(hold)
        comm.Barrier()
        return rank
    if rank == victim:
        if how == "kill":
            time.sleep(300)
        elif how == "abort":
            _mark(marker_dir, token, rank, "abort")
            comm.Abort(7)
        elif how == "hang-sleep":
            time.sleep(600)
        elif how == "hang-mpi":
            comm.recv(source=rank, tag=4242)  # from itself: never sent
    comm.Barrier()
    return rank


def member_stacks(dask_worker=None):
    """Run on a worker (client.run): each thread still running a job's member (in-process or the
    fork rank's parent task) -> its job and rank, and its innermost frames, innermost first (where it is stuck)."""
    import sys
    import traceback

    out = {}
    for tid, frame in sys._current_frames().items():
        f, member = frame, None
        while f is not None:
            if f.f_code.co_name in ("run_member", "run_rank"):
                loc = f.f_locals
                job = loc.get("job_id") or (loc.get("job") or {}).get("id")
                member = {"job": job, "rank": loc.get("rank"), "function": f.f_code.co_name}
            f = f.f_back
        if member is not None:
            member["frames"] = [f"{x.filename.rsplit('/', 1)[-1]}:{x.lineno} {x.name}: {(x.line or '').strip()}"
                                for x in reversed(traceback.extract_stack(frame)[-8:])]
            out[str(tid)] = member
    return out


def hold_thread(marker_dir, token, slot, within):
    """A task that keeps one of its worker's threads until `<token>.release` exists (at most
    `within` s): with every thread of a worker so held, a job's rank there waits to start, and its
    member's PMI credential stays unbound meanwhile (the PMI faults). Marks itself in first."""
    import os
    import time

    _mark(marker_dir, token, f"hold{slot}")
    release = os.path.join(marker_dir, f"{token}.release")
    deadline = time.monotonic() + within
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    return slot


def comm_description(dask_worker=None):
    """Run on a tcp+mpi worker (client.run): what its transport hello tells a peer about it
    (dask_pmix.comm.paths.describe), and its comm counters."""
    from dask_pmix.comm.link import current_link
    from dask_pmix.comm.paths import describe
    from dask_pmix.comm.stats import comm_stats

    return {"description": describe(current_link()), "stats": comm_stats()}


def block(nbytes, seed):
    """A block of data large enough to cross between tcp+mpi workers over MPI (comm.sm-threshold)."""
    import numpy as np

    return np.full(nbytes // 8, seed, dtype="f8")


def total(x):
    return float(x[:4].sum()) + x.nbytes
