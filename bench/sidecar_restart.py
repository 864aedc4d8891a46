"""How long a cluster takes to be whole and in process again after its embedded sidecar is
killed (kill -9), and what it costs Dask.

Open MPI cannot re-attach an MPI session to a new PMIx server, so every worker of the pool, in a job
or not, is replaced after the restart: its data moved to other workers by Dask, then its nanny
restarts it and the new process joins the new sidecar's pool (docs/user-guide/failures.md).

For each size N: a LocalCluster of N workers (one thread each, in-process pool, the default
configuration), 4 persisted chunks per worker (1 MiB each), then kill -9 of the sidecar with no job
running. Figures, in seconds since the kill:
- sidecar_back: the restarted sidecar answers REST;
- whole: N workers again, none of them an old process, all ready in the new sidecar's pool;
- first_job: a job over all N workers, in process, has returned (its own run time is job_s).
Also the chunks that Dask computed again (0 expected: their data moved) and whether every chunk
still holds its value.

    .venv/bin/python bench/sidecar_restart.py --sizes 4 16 [--out bench/results/sidecar-restart.json]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from headline import start_cluster

CHUNKS_PER_WORKER = 4


def _chunk(i, log):
    import numpy as np

    with open(log, "a") as f:
        f.write(f"{i}\n")
    return np.full(131_072, i, dtype="f8")  # 1 MiB


def _ready(sidecar) -> set[str]:
    from dask_pmix.errors import SidecarError

    try:
        return {w["id"] for w in sidecar.workers() if (w.get("pool") or {}).get("state") == "ready"}
    except (SidecarError, OSError):
        return set()


def one_size(n: int, within: float) -> dict:
    from distributed import wait

    from dask_pmix import run_mpi
    from dask_pmix.errors import SidecarError

    cluster, client, sidecar = start_cluster(n, pool=True)
    log = Path(tempfile.mkdtemp(prefix="dask-pmix-restart-")) / "computed"
    try:
        old = sorted(client.scheduler_info()["workers"])
        chunks = [
            client.submit(_chunk, i, str(log), pure=False, workers=[old[i % n]]) for i in range(CHUNKS_PER_WORKER * n)
        ]
        wait(chunks)
        run_mpi(client, lambda comm: comm.allreduce(1), workers=old, mode="inprocess")
        plugin = cluster.scheduler.plugins["dask-pmix"]
        t0 = time.monotonic()
        os.kill(plugin.embedded.proc.pid, signal.SIGKILL)
        out: dict = {"workers": n}
        deadline = t0 + within
        while time.monotonic() < deadline:
            try:
                sidecar.jobs()
                out["sidecar_back"] = round(time.monotonic() - t0, 2)
                break
            except (SidecarError, OSError):
                time.sleep(0.05)
        replaced_at: dict[str, float] = {}
        while time.monotonic() < deadline:
            now = set(client.scheduler_info()["workers"])
            ready = _ready(sidecar) & now
            for w in ready - set(old):
                replaced_at.setdefault(w, round(time.monotonic() - t0, 2))
            if len(now) == n and not now & set(old) and len(ready) == n:
                out["whole"] = round(time.monotonic() - t0, 2)
                break
            time.sleep(0.1)
        else:
            out["whole"] = None
            out["not_whole"] = {"workers": len(now), "old_left": len(now & set(old)), "ready": len(ready)}
            return out
        out["each_ready_at"] = sorted(replaced_at.values())
        t1 = time.monotonic()
        assert run_mpi(client, lambda comm: comm.allreduce(1), n=n, mode="inprocess") == [n] * n
        out["job_s"] = round(time.monotonic() - t1, 2)
        out["first_job"] = round(time.monotonic() - t0, 2)
        values = client.gather(chunks)
        out["chunks_right"] = all(float(v[0]) == float(i) and v.size == 131_072 for i, v in enumerate(values))
        computed = [int(x) for x in log.read_text().split()]
        out["chunks_computed_again"] = len(computed) - len(set(computed))
        out["replacements"] = len(plugin.replacer.replaced)
        return out
    finally:
        client.close()
        cluster.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--within", type=float, default=600.0, help="give up on a size after this many seconds")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {
        "benchmark": "sidecar_restart",
        "commit": commit.stdout.strip(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "meaning": "seconds since kill -9 of the embedded sidecar (no job running): sidecar_back (REST answers), "
        "whole (N new worker processes, all ready in the new pool), first_job (an N-member in-process job returned)",
        "sizes": [one_size(n, args.within) for n in args.sizes],
        "load_average_after": os.getloadavg(),
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
