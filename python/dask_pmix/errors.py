"""Errors raised by dask_pmix."""

from __future__ import annotations

import re

# A schema violation as the sidecar (fastify, ajv) words it: "invalid request: " and then, for
# each violation, where ("body/timeoutSeconds", "querystring/wait", "body") and what is wrong.
_INVALID = "invalid request: "
_WHERE = re.compile(r"(?:^|(?<=, ))(body|querystring|params|headers)((?:/[^\s/,]+)*) (?=must |should |is |has )")
_PLACE = {"body": "the request", "querystring": "the query", "params": "the URL", "headers": "the headers"}


def readable(status: int, message: str) -> str:
    """The sidecar's message, with a schema violation's JSON paths said in words:
    "invalid request: body/timeoutSeconds must be <= 31536000" becomes "the request's
    timeoutSeconds must be <= 31536000"; other messages are kept as they are."""
    if status != 400 or not message.startswith(_INVALID):
        return message

    def where(m: re.Match) -> str:
        place = _PLACE[m.group(1)]
        parts = [p for p in m.group(2).split("/") if p]
        if not parts:
            return f"{place} "
        field = parts[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts[1:])
        return f"{place}'s {field} "

    return "invalid request: " + _WHERE.sub(where, message[len(_INVALID) :])


class SidecarError(RuntimeError):
    """The sidecar refused a request (HTTP 4xx/5xx) or could not be reached."""

    def __init__(self, status: int, message: str, method: str = "", path: str = ""):
        self.status = status
        self.message = readable(status, message)
        self.method = method
        self.path = path
        where = f" ({method} {path})" if method else ""
        text = self.message
        super().__init__(
            f"the sidecar refused the request ({status}): {text}{where}"
            if 400 <= status < 500
            else f"sidecar answered {status}: {text}{where}"
            if status
            else f"{text}{where}"
        )


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
