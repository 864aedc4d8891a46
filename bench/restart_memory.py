"""The sidecar's native memory over client.restart() cycles (issue 31: the soak's Open MPI sidecar
grew ~1 MB per client.restart()). One soak-style cluster (bench/soaklib: `dask scheduler --preload
dask_pmix` and --workers nanny workers, in-process pool); after --warmup healthy jobs, --cycles
times: client.restart() (with --mid-job, while a job's members wait between two Barriers, as the
soak's client-restart fault does), wait until every new worker is ready in the pool, run --jobs
healthy jobs over all of them, and sample the sidecar: RSS, anonymous RSS, V8's heap size (from its
/metrics), "native" (anonymous RSS minus V8's heap size), the pool's epochs and the namespaces
libpmix would still hold. Prints one JSON document, with the least-squares slope of native memory
per cycle.

    .venv/bin/python bench/restart_memory.py --cycles 8 [--mid-job] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def status_kb(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon"):
            out[key] = int(line.split()[1])
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=20, help="healthy jobs before the first sample")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=4, help="healthy jobs after each restart")
    ap.add_argument("--mid-job", action="store_true", help="restart while a job's members wait in it")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()

    import httpx
    from soaklib import bodies
    from soaklib.cluster import DaskCluster

    from dask_pmix import run_mpi, submit_mpi

    cluster = DaskCluster(
        "openmpi", ROOT / ".venv", Path(tempfile.mkdtemp(prefix="dask-pmix-restart-memory-")), args.workers
    )
    samples: list[dict] = []
    load0 = os.getloadavg()
    n = args.workers

    def ready() -> int:
        return sum(1 for w in cluster.rest.workers() if (w.get("pool") or {}).get("state") == "ready")

    def jobs(k: int, tag: str) -> None:
        for i in range(k):
            r = run_mpi(cluster.client, bodies.healthy, f"{tag}-{i}", n=n, timeout=120)
            assert len(r) == n and r[0]["sum"] == n * (n + 1) // 2, r

    def sample(cycle: int, t0: float) -> None:
        pid = cluster.sidecar()["pid"]
        headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
        text = httpx.get(f"{cluster.url}/metrics", headers=headers, timeout=10).text
        m = re.search(r"^nodejs_heap_size_total_bytes ([0-9.e+]+)$", text, re.M)
        heap_kb = float(m.group(1)) / 1024 if m else 0.0
        st = status_kb(pid)
        epochs = re.findall(r"^dask_pmix_pool_epochs ([0-9.e+]+)$", text, re.M)
        s = {
            "cycle": cycle,
            "seconds": round(time.monotonic() - t0, 1),
            "pid": pid,
            "rss_mb": round(st["VmRSS"] / 1024, 1),
            "anon_mb": round(st["RssAnon"] / 1024, 1),
            "heap_total_mb": round(heap_kb / 1024, 1),
            "native_mb": round((st["RssAnon"] - heap_kb) / 1024, 1),
            "pool_epochs": float(epochs[0]) if epochs else None,
        }
        samples.append(s)
        print(json.dumps(s), file=sys.stderr, flush=True)

    try:
        cluster.launch_scheduler()
        cluster.launch_workers()
        cluster.connect()
        t0 = time.monotonic()
        jobs(args.warmup, "warm")
        sample(0, t0)
        for c in range(1, args.cycles + 1):
            if args.mid_job:
                marks = Path(tempfile.mkdtemp(prefix="marks-", dir=cluster.workdir))
                futs = submit_mpi(cluster.client, bodies.faulty, str(marks), f"c{c}", 0, "hold", 30.0, n=n, timeout=120)
                deadline = time.monotonic() + 60
                while len(list(marks.iterdir())) < n and time.monotonic() < deadline:
                    time.sleep(0.1)
                del futs
            cluster.client.restart(timeout=120)
            cluster.client.wait_for_workers(n, timeout=120)
            deadline = time.monotonic() + 120
            while ready() < n and time.monotonic() < deadline:
                time.sleep(0.2)
            jobs(args.jobs, f"c{c}")
            sample(c, t0)
    finally:
        cluster.stop()
    xs = [s["cycle"] for s in samples]
    doc = {
        "workers": n,
        "warmup": args.warmup,
        "cycles": args.cycles,
        "jobs_per_cycle": args.jobs,
        "mid_job": args.mid_job,
        "load_avg": {"start": [round(x, 1) for x in load0], "end": [round(x, 1) for x in os.getloadavg()]},
        "native_mb_per_restart": round(slope(xs, [s["native_mb"] for s in samples]), 3) if len(xs) > 2 else None,
        "rss_mb_per_restart": round(slope(xs, [s["rss_mb"] for s in samples]), 3) if len(xs) > 2 else None,
        "samples": samples,
    }
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
