"""Adaptive's scale-down in Dask alone: what bench/elastic.py's planned releases are measured
against, without dask-pmix.

A plain LocalCluster (no dask-pmix plugin, no MPI) of --workers nanny workers, one thread each.
Each round: cluster.adapt(minimum=maximum=workers - 2, interval 0.5 s, wait_count 3), as the
elastic bench asks, timed from the adapt call to both workers gone from the scheduler; then the
cluster scales back. Counted from the nannies' log: how many closing workers were still alive
after Dask's 4 s and were killed ("Worker process still alive after 4.0 seconds, killing"). Such a
close holds Adaptive's next round for those seconds, with or without dask-pmix.

    .venv/bin/python bench/adaptive_plain.py --rounds 10 [--out bench/results/adaptive-plain.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

from elastic import ADAPT_INTERVAL, ADAPT_WAIT, wait_for  # bench/elastic.py, beside this file


class _Kills(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "still alive after" in record.getMessage():
            self.count += 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    kills = _Kills()
    logging.getLogger("distributed.nanny").addHandler(kills)
    n, target = args.workers, args.workers - 2
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    times = []
    load0 = os.getloadavg()
    try:
        for _ in range(args.rounds):
            client.wait_for_workers(n, timeout=120)
            time.sleep(1.0)
            t0 = time.time()
            adaptive = cluster.adapt(
                minimum=target, maximum=target, interval=f"{ADAPT_INTERVAL}s", wait_count=ADAPT_WAIT
            )
            try:
                wait_for(lambda: len(client.scheduler_info()["workers"]) <= target, 120, "Adaptive scaling down")
                times.append(time.time() - t0)
                # Adaptive's scale-down returns once the nannies closed: let the closes finish.
                time.sleep(5.0)
            finally:
                adaptive.stop()
            cluster.scale(n)
    finally:
        client.close()
        cluster.close()
    doc = {
        "benchmark": "adaptive_plain",
        "cpus": os.cpu_count(),
        "workers": n,
        "target": target,
        "rounds": args.rounds,
        "closes": 2 * args.rounds,
        "killed_after_4s": kills.count,
        "scale_down_s": {
            "median": round(statistics.median(times), 3),
            "max": round(max(times), 3),
            "all": [round(t, 3) for t in times],
        },
        "load_avg": {"start": [round(x, 1) for x in load0], "end": [round(x, 1) for x in os.getloadavg()]},
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
