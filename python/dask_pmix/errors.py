"""Errors raised by dask_pmix."""

from __future__ import annotations


class SidecarError(RuntimeError):
    """The sidecar refused a request (HTTP 4xx/5xx) or could not be reached."""

    def __init__(self, status: int, message: str, method: str = "", path: str = ""):
        self.status = status
        self.message = message
        self.method = method
        self.path = path
        where = f" ({method} {path})" if method else ""
        super().__init__(f"sidecar answered {status}: {message}{where}" if status else f"{message}{where}")


class MPIJobError(RuntimeError):
    """An MPI job failed: names the job, the rank and worker that failed first, and why."""

    def __init__(
        self, reason: str, *, job_id: str = "", rank: int | None = None, worker: str | None = None, origin: str = "job"
    ):
        self.reason = reason
        self.job_id = job_id
        self.rank = rank
        self.worker = worker
        # "rank": this rank's own function or process failed; "job": the job failed elsewhere.
        self.origin = origin
        who = []
        if rank is not None:
            who.append(f"rank {rank}")
        if worker:
            who.append(f"worker {worker}")
        prefix = f"MPI job {job_id}" if job_id else "MPI job"
        super().__init__(f"{prefix} failed" + (f" ({', '.join(who)})" if who else "") + f": {reason}")

    def __reduce__(self):
        return (_rebuild_job_error, (self.reason, self.job_id, self.rank, self.worker, self.origin))


def _rebuild_job_error(reason, job_id, rank, worker, origin="job"):
    return MPIJobError(reason, job_id=job_id, rank=rank, worker=worker, origin=origin)


class RankAborted(BaseException):
    """Raised in an in-process job's function by ``comm.Abort(errorcode)``: the job fails with
    the code, and the worker process, which MPI_Abort would end, stays with its data. A
    BaseException, so that the function's own ``except Exception`` does not swallow it."""

    def __init__(self, errorcode: int = 0):
        self.errorcode = errorcode
        super().__init__(
            f"MPI_Abort: the rank aborted the job with status {errorcode} (in-process, its worker "
            "process stays, with its data)"
        )

    def __reduce__(self):
        return (RankAborted, (self.errorcode,))


class MPIFallbackWarning(RuntimeWarning):
    """A job asked to run in-process (the default mode) runs in fork mode instead; says why."""
