"""The sidecar's memory and job time over many healthy jobs on one soak-style cluster (bench/soaklib:
`dask scheduler --preload dask_pmix` and 4 nanny workers), sampled every --every jobs: RSS (and its
anonymous part), V8's heap size and use and external memory (the sidecar's /metrics), "native"
(anonymous RSS minus V8's heap size: libpmix, the addon, allocator arenas), what the C allocator
has in use and keeps free (its /metrics, from mallinfo2), the jobs it lists, and the seconds since
the first job. Sizes 1-4 (--sizes) in turn, all in one --mode; the scheduler picks the
workers, or with --random-workers each job names its own, a random sample in a random order (as
the soak's jobs and users who pass workers= do: most such sets are new to the communicator cache's
exact match). With --restart-every K, client.restart() after every K jobs (the soak's
client-restart fault: every worker replaced, a new pool epoch). Shows what grows per job and
whether it levels off (the soak's memory check, bench/soaklib/rss.py, rests on it).

    .venv/bin/python bench/sidecar_memory.py --impl openmpi --mode inprocess --jobs 2000
    .venv-mpich/bin/python bench/sidecar_memory.py --impl mpich --mode fork --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

METRICS = {"heap_total_mb": "nodejs_heap_size_total_bytes", "heap_used_mb": "nodejs_heap_size_used_bytes",
           "external_mb": "nodejs_external_memory_bytes"}


def status_mb(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon"):
            out[{"VmRSS": "rss_mb", "RssAnon": "anon_mb"}[key]] = round(int(line.split()[1]) / 1024, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=("openmpi", "mpich"), default="openmpi")
    ap.add_argument("--mode", choices=("inprocess", "fork"), default="inprocess")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--random-workers", action="store_true", help="each job names a random sample of the workers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sizes", default="1,2,3,4", help="the jobs' sizes, in turn")
    ap.add_argument("--restart-every", type=int, default=0, help="client.restart() after every K jobs")
    ap.add_argument("--job-history", type=int, help="serve --job-history (ended jobs the sidecar keeps)")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = [int(x) for x in args.sizes.split(",")]

    import httpx

    from dask_pmix import run_mpi
    from soaklib import bodies
    from soaklib.cluster import DaskCluster

    venv = ROOT / (".venv" if args.impl == "openmpi" else ".venv-mpich")
    history = ["--job-history", str(args.job_history)] if args.job_history is not None else []
    cluster = DaskCluster(
        args.impl, venv, Path(tempfile.mkdtemp(prefix="dask-pmix-sidecar-memory-")), 4, sidecar_args=history
    )
    samples = []
    load0 = os.getloadavg()
    try:
        cluster.launch_scheduler()
        cluster.launch_workers()
        cluster.connect()
        headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
        t0 = time.monotonic()
        for i in range(args.jobs + 1):
            if i % args.every == 0 or i == args.jobs:
                pid = cluster.sidecar()["pid"]
                text = httpx.get(f"{cluster.url}/metrics", headers=headers, timeout=10).text
                s = {"job": i, "seconds": round(time.monotonic() - t0, 1), **status_mb(pid)}
                for key, metric in METRICS.items():
                    m = re.search(rf"^{metric} ([0-9.e+]+)$", text, re.M)
                    s[key] = round(float(m.group(1)) / 2**20, 1) if m else None
                s["native_mb"] = round(s["anon_mb"] - s["heap_total_mb"], 1)
                for kind in ("in_use", "free"):
                    m = re.search(rf'^dask_pmix_native_heap_bytes{{kind="{kind}"}} ([0-9.e+]+)$', text, re.M)
                    s[f"malloc_{kind}_mb"] = round(float(m.group(1)) / 2**20, 1) if m else None
                s["jobs_listed"] = len(cluster.rest.jobs())
                samples.append(s)
                print(json.dumps(s), file=sys.stderr, flush=True)
            if i == args.jobs:
                break
            if args.restart_every and i and i % args.restart_every == 0:
                cluster.client.restart()
            n = sizes[i % len(sizes)]
            if args.random_workers:
                ws = rng.sample(sorted(cluster.client.scheduler_info()["workers"]), n)
                kw = {"workers": ws}
            else:
                kw = {"n": n}
            result = run_mpi(cluster.client, bodies.healthy, f"m{i}", **kw, impl=args.impl, mode=args.mode, timeout=120)
            assert len(result) == n and result[0]["sum"] == n * (n + 1) // 2, result
    finally:
        cluster.stop()
    doc = {"impl": args.impl, "mode": args.mode, "jobs": args.jobs, "workers": 4,
           "random_workers": args.random_workers, "seed": args.seed, "sizes": sizes,
           "job_history": args.job_history, "restart_every": args.restart_every,
           "load_avg": {"start": [round(x, 1) for x in load0], "end": [round(x, 1) for x in os.getloadavg()]},
           "samples": samples}
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
