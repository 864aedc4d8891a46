"""Which way a pair of workers moves its bulk frames: decided once per connection, from what each
end knows of itself before any communicator is built.

MPI carries a pair's frames only where its path beats the connection's own TCP stream:

- "sm": the two processes share memory in Open MPI's eyes, i.e. each is in the other's
  mpi://SHARED group (the ranks declared on its node when its pool epoch was registered, which is
  what Open MPI 5.0.x's sm transport and its single-copy mechanism serve). Both must say so, in one
  epoch: sm connects only processes of one namespace that each listed the other as local when
  they initialised.
- "cma": the two processes run on one host (one kernel, pid and network namespace) but do not
  share memory in Open MPI's eyes: one of them joined the pool after its host's cohort, or its nanny
  restarted it. The receiver copies each frame straight out of the sender's memory (cma.py): one
  copy, with no communicator to build, which the kernel may still refuse (hello.py probes it).
- "fabric": both ends were told (dask-pmix.comm.fabric) that their MPI library reaches the other
  over a network faster than TCP (UCX or OFI on InfiniBand, RoCE, EFA ...).
- otherwise none: Open MPI would use its TCP transport, which moves the same bytes through the
  same kernel as the TCP stream and adds the progress engine's hand-offs, so the frames stay in
  the stream and no pair communicator is built.

Each path has its own size threshold: frames below it stay in the stream, where a message costs
what it costs on tcp://.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import cma, config


@dataclass(frozen=True)
class Path:
    name: str  # "sm" or "fabric"
    threshold: int  # frames of at least this many bytes go over MPI


def describe(link) -> dict[str, Any]:
    """What this end tells the other about itself (sent in the transport hello)."""
    if link is None:
        return {"epoch": None, "rank": None}
    return {
        "epoch": link.epoch,
        "rank": link.rank,
        "local": sorted(link.local_peers),
        "fabric": bool(config.get("fabric")),
        "pid": os.getpid(),
        "host": cma.host() if config.get("cma") and cma.available() else None,
    }


def choose(mine: dict[str, Any], theirs: dict[str, Any]) -> Path | None:
    """The path of a pair from both ends' descriptions; the same answer at both ends (the
    function is symmetric), so no further round trip is needed to agree on it."""
    if mine.get("epoch") is None or mine.get("epoch") != theirs.get("epoch"):
        return None
    me, peer = mine.get("rank"), theirs.get("rank")
    if me is None or peer is None:
        return None
    if peer in (mine.get("local") or ()) and me in (theirs.get("local") or ()) and config.get("same-host") == "mpi":
        return Path("sm", config.get("sm-threshold"))
    if mine.get("host") is not None and mine.get("host") == theirs.get("host"):
        return Path("cma", config.get("cma-threshold"))
    if mine.get("fabric") and theirs.get("fabric"):
        return Path("fabric", config.get("fabric-threshold"))
    return None


def why_not(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """Why choose() gave no MPI path (the fallback's reason in comm_stats)."""
    if mine.get("epoch") is None or theirs.get("epoch") is None:
        return "no-pool" if mine.get("epoch") is None else "connector-no-pool"
    if mine.get("epoch") != theirs.get("epoch"):
        return "other-epoch"
    return "path-tcp"
