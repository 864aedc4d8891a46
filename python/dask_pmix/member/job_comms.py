"""Every communicator of the job that runs in this process, so that a failed job revokes them all.

A failed job ends its members' MPI calls by revoking (ULFM), locally in each member: the member
whose function raised revokes at once, the others when the scheduler pushes the failure to their
watcher. A revoke reaches only the communicator it names, and a member may wait on others:
- mpi4py's pickle-based reductions (allreduce, reduce, scan, exscan) run on a duplicate that
  mpi4py makes at the first one, inside MPI_Comm_dup with the interpreter lock held: a member
  waiting there for a rank that raised freezes its whole worker, and no revoke can run. So the
  duplicate is made when the communicator is, with every member there, and is revoked with it;
- communicators the function makes (``MPI.COMM_WORLD.Dup()``, ``comm.Split(...)``, topologies),
  whichever object it made them from: mpi4py's creation methods are wrapped, in a thread that
  runs a job's function, to record what they return (and to make its duplicate the same way),
  and they are built, as the job's own, while the comm backend's engine makes no MPI call
  (dask_pmix.worker.activation).

One job at a time is in MPI in a process (dask_pmix.member.inprocess), so one list serves."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from ..worker import world_model
from ..worker.activation import GATE

logger = logging.getLogger("dask_pmix")

# Intracommunicator constructors of mpi4py (collective over the new communicator's members).
_INTRA_MAKERS = {
    "Comm": ("Dup", "Dup_with_info", "Split", "Split_type", "Create"),
    "Intracomm": ("Create_group", "Create_cart", "Create_graph", "Create_dist_graph", "Create_dist_graph_adjacent"),
}

_lock = threading.Lock()
_running: str | None = None  # the job whose communicators are recorded
_comms: list[Any] = []  # the objects the job's code holds, then mpi4py's duplicates: (comm, duplicate)
_installed = False


def begin(MPI, job_id: str, comm) -> None:
    """The job's own communicator, just built by every member: records it and makes mpi4py's
    duplicate for it (collective: the members are all here)."""
    global _running
    _install(MPI)
    with _lock:
        _running = job_id
        _comms.clear()
    _record(MPI, comm)


def end(job_id: str) -> None:
    global _running
    with _lock:
        if _running == job_id:
            _running = None
            _comms.clear()


def revoke_all(job_id: str) -> bool:
    """Revokes every live communicator of the job (one the function freed is skipped); False if
    the job recorded none here."""
    with _lock:
        if _running != job_id or not _comms:
            return False
        pairs = list(_comms)
    for comm, dup in pairs:
        try:
            if not comm:  # freed by the function: its duplicate went with it
                continue
            for c in (comm, dup):
                if c is not None and not c.Is_revoked():
                    c.Revoke()
        except Exception as exc:  # noqa: BLE001 - a broken communicator may refuse
            logger.debug("dask-pmix: revoking a communicator failed: %r", exc)
    return True


def _record(MPI, comm) -> None:
    dup = None
    if isinstance(comm, MPI.Intracomm) and comm:
        with GATE.building():  # a construction too (activation.py)
            dup, _tag = MPI._commctx_intra(comm)
    with _lock:
        _comms.append((comm, dup))


def _install(MPI) -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for cls_name, names in _INTRA_MAKERS.items():
        cls = getattr(MPI, cls_name)
        for name in names:
            world_model.set_type_attribute(cls, name, _recording(MPI, cls.__dict__[name]))


def _recording(MPI, make):
    @functools.wraps(make)
    def call(self, *args: Any, **kwargs: Any):
        if _running is None or threading.get_ident() not in world_model.job_threads():
            return make(self, *args, **kwargs)
        with GATE.building():  # no progress of the comm backend's engine meanwhile (activation.py)
            new = make(self, *args, **kwargs)
        _record(MPI, new)
        return new

    return call
