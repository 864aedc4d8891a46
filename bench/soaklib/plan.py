"""Which jobs the soak runs, in which order: a seeded mix of clusters (MPI libraries), modes and
sizes, with about a tenth of them faults. Every fault is followed by a healthy job on the same
cluster (the "next job", which must succeed), and no two faults are adjacent. The sidecar faults
come last (the last quarter by default), so that the stretch before measures one sidecar process
per cluster (its memory over many jobs); they alternate between the clusters."""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_WEIGHTS = {
    "kill": 0.26,          # kill -9 of a member mid-job
    "abort": 0.22,         # MPI_Abort from a rank
    "hang-sleep": 0.12,    # a rank that sleeps in Python; the job's timeout ends it
    "hang-mpi": 0.12,      # a rank that waits in MPI for a message nobody sends; the timeout ends it
    "silent": 0.16,        # a connection that sends nothing, held open to the sidecar while jobs run
    "stranger": 0.05,      # another uid connects to every port of the sidecar and sends handshakes, PMI, HTTP, junk
    "flood": 0.05,         # 300 connections that send nothing kept open on the PMIx gate while a job runs
    "stall": 0.05,         # SIGSTOP of the sidecar for 4 s while a job runs (SIGCONT after): the job succeeds
    # The four below are healthy faults but client-restart; the first two need MPICH's PMI port and
    # the third the tcp+mpi cluster (soak.py starts it only when a plan has one). Light weights:
    # each costs a few seconds more than a healthy job, a restart about ten.
    "pmi-injection": 0.03,       # a member's PMI_ID with commands behind it, sent while its rank is held back
    "foreign-pmi-binder": 0.03,  # another uid binds with a member's PMI environment before its rank does
    "forged-hello": 0.03,        # a tcp+mpi hello that replays another worker's description
    "client-restart": 0.03,      # client.restart() mid-job: the job fails saying so, Dask drops its data
    "sidecar-term": 0.06,  # SIGTERM of the sidecar mid-job
    "sidecar-kill": 0.06,  # kill -9 of the sidecar mid-job
}
SIDECAR_FAULTS = ("sidecar-term", "sidecar-kill")
# Faults done beside a healthy job, which must succeed all the same.
HEALTHY_FAULTS = ("silent", "stranger", "flood", "stall", "pmi-injection", "foreign-pmi-binder", "forged-hello")
PMI_FAULTS = ("pmi-injection", "foreign-pmi-binder")  # MPICH's PMI wire: on the MPICH cluster


def _openmpi_mode(rng: random.Random, fork_share: float) -> str | None:
    return "fork" if rng.random() < fork_share else rng.choice((None, "inprocess"))


@dataclass
class Spec:
    idx: int
    cluster: str              # "openmpi" or "mpich": which cluster (and MPI library) runs it
    mode: str | None          # run_mpi(mode=...)
    n: int                    # members
    fault: str | None = None
    follows: int | None = None  # the fault this healthy job comes right after
    submit: bool = False      # a healthy job through submit_mpi (futures, gathered) instead of run_mpi


def fault_counts(n_faults: int, only: tuple[str, ...] | None = None) -> dict[str, int]:
    """Faults per kind (of `only`, or all): at least one of each when there are enough, the rest by weight."""
    kinds = [k for k in FAULT_WEIGHTS if only is None or k in only]
    counts = {k: 0 for k in kinds}
    if n_faults >= len(kinds):
        counts = {k: 1 for k in kinds}
    left = n_faults - sum(counts.values())
    total = sum(FAULT_WEIGHTS[k] for k in kinds)
    shares = {k: FAULT_WEIGHTS[k] / total * left for k in kinds}
    for k in kinds:
        counts[k] += int(shares[k])
    for k in sorted(kinds, key=lambda k: shares[k] - int(shares[k]), reverse=True)[:n_faults - sum(counts.values())]:
        counts[k] += 1
    return counts


def make_plan(n_jobs: int, fault_fraction: float, seed: int, clusters: tuple[str, ...] = ("openmpi", "mpich"),
              mpich_share: float = 0.3, max_size: int = 4, warmup: int = 10,
              submit_share: float = 0.2, fork_share: float = 1 / 3, sidecar_faults_from: float = 0.75,
              fork_faults: tuple[str, ...] = (), kinds: tuple[str, ...] | None = None) -> list[Spec]:
    """`fork_faults`: fault kinds that run in fork mode on the Open MPI cluster too (never in-process);
    `kinds`: only these fault kinds."""
    unknown = set(kinds or ()) - set(FAULT_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
    rng = random.Random(seed)
    n_faults = round(n_jobs * fault_fraction)
    counts = fault_counts(n_faults, kinds)
    # Slots: a fault at i needs i+1 for its next job; faults never adjacent.
    late_start = max(warmup, int(n_jobs * sidecar_faults_from))
    chosen = [k for k, c in counts.items() for _ in range(c)]
    early = [k for k in chosen if k not in SIDECAR_FAULTS]
    late = [k for k in chosen if k in SIDECAR_FAULTS]
    positions: dict[int, str] = {}

    def place(kinds_here: list[str], lo: int, hi: int) -> None:
        free = [i for i in range(lo, hi - 1) if i % 3 == 0]  # every third slot: room for the next job
        if len(free) < len(kinds_here):
            raise ValueError(f"{n_jobs} jobs leave no room for {len(kinds_here)} faults in [{lo}, {hi})")
        for i, k in zip(sorted(rng.sample(free, len(kinds_here))), rng.sample(kinds_here, len(kinds_here))):
            positions[i] = k

    place(late, late_start, n_jobs)
    place(early, warmup, late_start if late else n_jobs)

    def cluster_for(kind: str | None) -> str:
        if len(clusters) == 1:
            return clusters[0]
        if kind in SIDECAR_FAULTS:
            done = sum(1 for i, k in positions.items() if k in SIDECAR_FAULTS and i < current)
            return clusters[done % len(clusters)]  # alternate, Open MPI first
        if kind == "flood" and "openmpi" in clusters:
            return "openmpi"  # the PMIx gate's flood: only Open MPI jobs come through it
        if kind in PMI_FAULTS and "mpich" in clusters:
            return "mpich"  # Open MPI's ranks speak PMIx: only MPICH jobs bind on the PMI port
        if kind == "forged-hello" and "openmpi" in clusters:
            return "openmpi"  # the job beside it; the hello goes to the tcp+mpi cluster (Open MPI's)
        return "mpich" if rng.random() < mpich_share else "openmpi"

    plan: list[Spec] = []
    current = 0
    while current < n_jobs:
        kind = positions.get(current)
        cluster = cluster_for(kind)
        mode = _openmpi_mode(rng, fork_share) if cluster == "openmpi" else rng.choice((None, "fork"))
        if kind in fork_faults:
            mode = "fork"
        plan.append(Spec(current, cluster, mode, rng.randint(1, max_size), kind,
                         submit=kind is None and rng.random() < submit_share))
        if kind is not None and current + 1 < n_jobs:
            nxt = current + 1
            plan.append(Spec(nxt, cluster, _openmpi_mode(rng, fork_share) if cluster == "openmpi" else None,
                             rng.randint(1, max_size), None, follows=current))
            current += 1
        current += 1
    return plan
