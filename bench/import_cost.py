"""What importing dask_pmix costs a process, side by side in one run: a fresh interpreter doing
nothing, importing distributed, importing dask_pmix, importing both, and the entry points every
process pays for (`dask-pmix --version`, `python -m dask_pmix.pmi_connect` with no program).

    .venv/bin/python bench/import_cost.py [--repeat 15]

Prints JSON: per command the median wall time of the whole process (ms), and the differences the
issue asks about (dask_pmix over distributed; pmi_connect over a bare interpreter)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "python": [sys.executable, "-c", "pass"],
    "import distributed": [sys.executable, "-c", "import distributed"],
    "import dask_pmix": [sys.executable, "-c", "import dask_pmix"],
    "import distributed, dask_pmix": [sys.executable, "-c", "import distributed, dask_pmix"],
    "import distributed; dask_pmix.run_mpi": [sys.executable, "-c", "import distributed, dask_pmix; dask_pmix.run_mpi"],
    "python -m dask_pmix.pmi_connect": [sys.executable, "-m", "dask_pmix.pmi_connect"],
    "dask-pmix --version": [str(Path(sys.executable).parent / "dask-pmix"), "--version"],
}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeat):  # interleaved: the machine's noise spreads over every command
        for name, cmd in COMMANDS.items():
            samples[name].append(timed(cmd))
    med = {name: round(statistics.median(v) * 1e3, 1) for name, v in samples.items()}
    out = {
        "benchmark": "import_cost",
        "what": "median wall time of a whole process running the command, ms",
        "repeat": args.repeat, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "median_ms": med,
        "dask_pmix_over_distributed_ms": round(med["import distributed, dask_pmix"] - med["import distributed"], 1),
        "pmi_connect_over_python_ms": round(med["python -m dask_pmix.pmi_connect"] - med["python"], 1),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
