"""The soak's 100-job version (bench/soak.py): run_mpi and submit_mpi jobs on two real clusters
(Open MPI in-process and fork, MPICH fork), sizes 1-4, a tenth of them faults (a member killed,
MPI_Abort, hangs under a timeout, silent connections, another uid, a flood of connections, the
sidecar stalled for 4 s, stopped and killed, PMI binds with commands in the credential and from
another uid, a forged tcp+mpi hello, client.restart() mid-job); fails on any invariant the soak checks (no hung
call, faults failing their jobs within the promised bounds, every other job right, nothing
frozen, no namespace or /dev/shm file left, flat memory, the sidecar and its workers, psets and
pool back after it died, no chunk of the data held since the start computed again but after a
member kill). The 1,000-job result is in bench/results/soak.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import IMPL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the soak runs both MPI libraries itself, in one pass")


def test_a_hundred_jobs_with_faults_keep_every_invariant(tmp_path):
    out = tmp_path / "soak.json"
    # Lighter than the 1,000-job run so that it fits the test command: few Open MPI fork jobs (a
    # fresh interpreter each) and the sidecar faults in the last tenth. Member faults hit
    # in-process jobs too (they ran in fork mode only until the survivors' fix, 175f1e5). 14
    # faults: one of each kind (fewer would leave the lightest kinds out).
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "bench" / "soak.py"), "--jobs", "100",
                           "--faults", "0.14", "--fork-share", "0.1", "--sidecar-faults-from", "0.9", "--check",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert out.exists(), f"exit {proc.returncode}: {proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result["violations"] == [], "\n".join(result["violations"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    inv = result["invariants"]
    assert (inv["hung_jobs"], inv["faults_not_as_promised"], inv["healthy_jobs_failed"], inv["next_jobs_failed"],
            inv["members_left_frozen"], inv["frozen_workers_at_end"], inv["leaked_namespaces"],
            inv["shm_orphaned_at_end"], inv["shm_left_after_stop"], inv["canary_recomputed_by_dask_pmix"]) \
        == (0, 0, 0, 0, 0, 0, 0, 0, 0, 0), inv
    assert len(result["records"]) == 100
    faults = result["summary"]["faults"]
    assert sum(f["count"] for f in faults.values()) == 14, faults
    kinds = {k.split("@")[0] for k in faults}
    assert kinds == {"kill", "abort", "hang-sleep", "hang-mpi", "silent", "stranger", "flood", "stall", "sidecar-term",
                     "sidecar-kill", "pmi-injection", "foreign-pmi-binder", "forged-hello", "client-restart"}, kinds
    assert {k.split("@")[1] for k in faults} == {"openmpi", "mpich"}, faults
    assert len(result["sidecar_faults"]) == 2 and all(f["recovery"]["restarted"] for f in result["sidecar_faults"])
    assert all(flag for flags in inv["rss_flat"].values() for flag in flags if flag is not None), result["rss"]
