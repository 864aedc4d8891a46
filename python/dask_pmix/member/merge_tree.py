"""The merge tree that turns the size-1 MPI worlds of an in-process MPICH / Intel MPI job into one
communicator, in the worker processes themselves (src/rm/merge-tree.ts checks the ports).

Round by round (step = 1, 2, 4, ...), the group of ``step`` consecutive job ranks that begins at
a multiple of ``2 * step`` merges with the group right after it: the lower group's first rank
accepts (``MPI_Comm_accept`` over its group) on a port it opened for that step, the upper group's
first rank connects (over its group) to that port, and both sides ``MPI_Intercomm_merge`` with
the lower group first. After ceil(log2(size)) rounds every rank holds one communicator whose rank
order is the job's. One port per accepting step: with one port serving two rounds, a connector
of the later round could reach the earlier round's accept (measured with the 5.0.2 wheel: wrong
groups merged, then ranks deadlocked or crashed).

The sidecar hands the ports around: each member opens the ports of its accepting steps, joins
the job with them, and gets every member's once all are there.
"""

from __future__ import annotations

from typing import Any


def accept_steps(rank: int, size: int) -> list[int]:
    """The steps at which job rank ``rank`` of ``size`` accepts a merge (one port each)."""
    steps = []
    step = 1
    while step < size:
        if rank % (2 * step) == 0 and rank + step < size:
            steps.append(step)
        step *= 2
    return steps


def open_ports(MPI, rank: int, size: int) -> dict[str, str]:
    """Opens this rank's ports for the job, keyed by step (as the sidecar wants them)."""
    return {str(step): MPI.Open_port() for step in accept_steps(rank, size)}


def close_ports(MPI, ports: dict[str, str]) -> None:
    for port in ports.values():
        try:
            MPI.Close_port(port)
        except Exception:  # noqa: BLE001 - a port that cannot be closed only keeps its tag
            pass


class Tree:
    """The communicators one rank builds; ``comm`` is the job's, the others are freed with it."""

    def __init__(self, MPI, self_comm):
        self.MPI = MPI
        self.comm = self_comm
        self._self = self_comm
        self._kept: list[Any] = []

    def build(self, rank: int, size: int, ports: list[dict[str, str]], timeout: float) -> Any:
        """Runs the merge rounds; ``ports[r]`` are job rank r's ports by step. ``timeout``
        bounds each accept and connect (seconds): a peer that never comes fails the build
        instead of hanging it (a merge, once both sides are connected, has no bound)."""
        MPI = self.MPI
        info = MPI.Info.Create()
        info.Set("timeout", str(max(1, int(timeout))))
        try:
            step = 1
            while step < size:
                lower = (rank // (2 * step)) * (2 * step)
                upper = lower + step
                if upper < size:
                    port = ports[lower][str(step)]
                    if rank < upper:
                        inter = self.comm.Accept(port, info=info, root=0)
                    else:
                        inter = self.comm.Connect(port, info=info, root=0)
                    merged = inter.Merge(high=rank >= upper)
                    # The intercommunicator and the smaller group stay until the job's
                    # communicator goes: nothing is torn down while the tree is in use.
                    self._kept.append(inter)
                    if self.comm is not self._self:
                        self._kept.append(self.comm)
                    self.comm = merged
                step *= 2
            if self.comm is self._self:  # a job of one
                self.comm = self._self.Dup()
            return self.comm
        finally:
            info.Free()

    def free(self) -> None:
        """Frees what was built (a merged communicator, then the intercommunicators)."""
        for c in [self.comm, *reversed(self._kept)]:
            if c is None or c is self._self:
                continue
            try:
                c.Free()
            except Exception:  # noqa: BLE001 - a communicator of a failed job may refuse
                pass
        self._kept.clear()
        self.comm = None
