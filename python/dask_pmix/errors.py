"""Errors raised by dask_pmix."""

from __future__ import annotations

import re
from collections.abc import Callable

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


class Failure:
    """Why a job failed, as :attr:`MPIJobError.kind` says it. Only ``MEMBER_LOST`` is retried
    (``run_mpi(..., retries=k)``)."""

    #: A member was lost: its worker died (kill -9, a crash), was retired or removed by Dask
    #: (``cluster.scale``, ``retire_workers``, a lifetime), restarted by its nanny, or its MPI
    #: session ended; a worker holding ``local=`` data left before the job started.
    MEMBER_LOST = "member-lost"
    #: A rank's own function or process failed: an exception, ``MPI_Abort``, a fork-mode child
    #: that crashed while its worker lives.
    RANK = "rank"
    #: The job's own timeout (``timeout=``), or its members did not come within the wiring timeout.
    TIMEOUT = "timeout"
    #: The job was ended on purpose: its futures cancelled or released, its client gone,
    #: ``client.restart()``.
    CANCELLED = "cancelled"
    #: The job was not started: the sidecar or the cluster refused it (bad members, too few
    #: workers, an unknown process set), or its inputs could not be had.
    REFUSED = "refused"
    #: Anything else (the sidecar gone, a result that could not come back).
    JOB = "job"


#: The sidecar's words (member.reason) for a member that is gone because its worker is: each is
#: said by dask-pmix itself (src/, python/dask_pmix/scheduler), never by a rank's code.
#: test_retries checks that every one is still said somewhere.
#: An Open MPI pool rank's connection to the PMIx server dropped: its worker process is gone
#: (src/service/pmix-handlers.ts), and the sidecar names it failed to the job's other members.
POOL_PROCESS_DIED = "its worker process died"
WORKER_GONE = (
    "its worker left (",  # Dask removed the worker (src/rm/manager.ts)
    "its worker is being retired by Dask",  # the plugin saw it closing gracefully
    "its worker finalized its MPI session",  # Open MPI pool rank: the worker closed
    POOL_PROCESS_DIED,
    "its worker process ended",  # an MPICH/Intel MPI world: its PMI connection closed
    "its MPI library finalized (the worker process is exiting)",  # a world finalized
)
#: A member's MPI library saw another member's process fail (ULFM): that one is blamed, as lost.
_PEER_FAILED = re.compile(r"^rank \d+ \(worker [^)]*\) saw its process fail: ")
#: The member's process went without finalizing. In process that is the worker; in fork mode it is
#: the rank's child, lost with its worker or crashed on its own (then its worker says why).
PROCESS_GONE = (
    "its connection to the PMIx server dropped before it finalized",
    "its PMI connection closed before PMI finalize",
    "connection closed after ",
)
_TIMEOUT = ("job timeout: ", "timed out after ", "the other members did not come within ")
_CANCELLED = (
    "a rank's task was cancelled",
    "released by its client",
    "its client ",
    "the cluster was restarted (client.restart())",
)


def _starts(text: str, prefixes: tuple[str, ...]) -> bool:
    return any(text.startswith(p) for p in prefixes)


def is_worker_gone(reason: str) -> bool:
    """Whether a member's reason says that its worker is gone (WORKER_GONE, a peer's ULFM report)."""
    return _starts(reason, WORKER_GONE) or bool(_PEER_FAILED.match(reason))


def lost_members(view: dict, because: Callable[[str], bool] = is_worker_gone) -> frozenset[str]:
    """The workers of the job ``view``'s members that left it lost, for a reason ``because``
    accepts (by default: their worker is gone)."""
    return frozenset(
        m["workerId"] for m in view.get("members") or () if m.get("state") == "lost" and because(m.get("reason") or "")
    )


def classify(
    view: dict | None, *, own: BaseException | None = None, gone: frozenset | set = frozenset(), mode: str = ""
) -> tuple[str, list[str]]:
    """Why the job failed (a :class:`Failure`), and the workers whose loss failed it.

    ``view``: the job as the sidecar had it when it ended (state, error, members with their rank,
    worker, state, reason, and endedJob for the one that ended it); ``own``: the error the blamed
    rank raised itself, if it did; ``gone``: the job's workers that Dask no longer has; ``mode``:
    the job's mode. On evidence only: a member counts as lost when the sidecar says its worker is
    gone, or its process went and either its worker is gone too or, in fork mode, its worker never
    said why (a worker that lives reports its child's crash: the rank's own failure). A rank's
    exception is never a loss, except an MPI error raised because another member was lost."""
    view = view or {}
    state = view.get("state") or ""
    error = view.get("error") or ""
    members = list(view.get("members") or ())
    mode = mode or view.get("mode") or ""

    def lost(m: dict, blamed_own: BaseException | None = None) -> bool:
        reason = m.get("reason") or ""
        if is_worker_gone(reason):
            return True
        if _starts(reason, PROCESS_GONE):
            if m.get("workerId") in gone or mode != "fork":
                return True
            return not isinstance(blamed_own, MPIJobError) or blamed_own.origin != "rank"
        return False

    culprit = next((m for m in members if m.get("endedJob")), None)
    if culprit is None:
        if _starts(error, _TIMEOUT):
            return Failure.TIMEOUT, []
        if _starts(error, _CANCELLED):
            return Failure.CANCELLED, []
        losses = [m for m in members if m.get("state") == "lost" and lost(m)]
        if losses and state in ("failed", "aborted") and not error:
            return Failure.MEMBER_LOST, [m["workerId"] for m in losses]
        return Failure.JOB, []
    if state == "aborted":
        return Failure.RANK, []  # MPI_Abort: the rank's own doing
    if lost(culprit, own):
        return Failure.MEMBER_LOST, [culprit["workerId"]]
    reason = culprit.get("reason") or ""
    if _starts(reason, _TIMEOUT):
        return Failure.TIMEOUT, []
    if "MPI error" in reason:
        # A rank whose MPI call failed because another member went, before the sidecar heard of it.
        losses = [m for m in members if m is not culprit and m.get("state") == "lost" and lost(m)]
        losses += [m for m in members if m.get("workerId") in gone and m not in losses and m is not culprit]
        if losses:
            return Failure.MEMBER_LOST, [m["workerId"] for m in losses]
    return Failure.RANK, []


class MPIJobError(RuntimeError):
    """An MPI job failed: names the job, the rank and worker that failed first, and why.

    ``kind`` says why, as a :class:`Failure` (``"member-lost"``, ``"rank"``, ``"timeout"``,
    ``"cancelled"``, ``"refused"``, ``"job"``), or None where it is not known (an error raised on a
    rank). ``attempts``: with ``retries=``, the error of every attempt in order, this one last
    (each attempt's error has ``job_id``, ``kind`` and ``reason``); ``(self,)`` otherwise.
    ``attempt`` and ``family``: which attempt this was, of which family of attempts."""

    def __init__(
        self,
        reason: str,
        *,
        job_id: str = "",
        rank: int | None = None,
        worker: str | None = None,
        origin: str = "job",
        kind: str | None = None,
        attempts: tuple | list = (),
        lost_workers: tuple | list = (),
        family: str = "",
        attempt: int = 0,
    ):
        self.reason = reason
        self.job_id = job_id
        self.rank = rank
        self.worker = worker
        # "rank": this rank's own function or process failed; "job": the job failed elsewhere.
        self.origin = origin
        self.kind = kind
        # The workers whose loss failed the job (kind "member-lost").
        self.lost_workers = tuple(lost_workers)
        self.family = family
        self.attempt = attempt
        self._attempts = tuple(attempts)
        super().__init__(self._message())

    def _message(self, with_attempts: bool = True) -> str:
        who = []
        if self.rank is not None:
            who.append(f"rank {self.rank}")
        if self.worker:
            who.append(f"worker {self.worker}")
        prefix = f"MPI job {self.job_id}" if self.job_id else "MPI job"
        text = f"{prefix} failed" + (f" ({', '.join(who)})" if who else "") + f": {self.reason}"
        if with_attempts and len(self._attempts) > 1:
            earlier = "; ".join(
                f"attempt {i}, {e.kind or 'failed'}: {e._message(False)}" for i, e in enumerate(self._attempts[:-1], 1)
            )
            text += f" (attempt {len(self._attempts)}, after {earlier})"
        return text

    @property
    def attempts(self) -> tuple:
        return self._attempts or (self,)

    def with_attempts(self, attempts: list) -> MPIJobError:
        """This error, as the last of ``attempts`` (every attempt's error, in order)."""
        self._attempts = (*attempts[:-1], self) if attempts else ()
        self.args = (self._message(),)
        return self

    def __reduce__(self):
        return (
            _rebuild_job_error,
            (
                self.reason,
                self.job_id,
                self.rank,
                self.worker,
                self.origin,
                self.kind,
                self._attempts[:-1],
                self.lost_workers,
                self.family,
                self.attempt,
            ),
        )


def _rebuild_job_error(
    reason, job_id, rank, worker, origin="job", kind=None, earlier=(), lost_workers=(), family="", attempt=0
):
    e = MPIJobError(
        reason,
        job_id=job_id,
        rank=rank,
        worker=worker,
        origin=origin,
        kind=kind,
        lost_workers=lost_workers,
        family=family,
        attempt=attempt,
    )
    return e.with_attempts([*earlier, e]) if earlier else e


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
