"""What bench/stencil.py, bench/fft.py and bench/kmeans.py share: the cluster (M workers of a
LocalCluster in the in-process pool, the default configuration), an input whose blocks are pinned
one group per worker (both sides start from the same persisted array), the bytes Dask moved
between workers, the load, and the medians and the JSON they print.

Each workload's numerical kernels live in its own file and are used by both sides, so that the
Dask side and the MPI side do the same arithmetic; the functions that run on the workers are
pickled by value (cloudpickle), so the workers need not import bench/."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results"


def by_value(*modules) -> None:
    """The workers get these modules' functions by value (they cannot import bench/)."""
    import cloudpickle

    for m in modules:
        cloudpickle.register_pickle_by_value(m)


def start(m: int):
    """M workers of one thread each, in the in-process MPI pool (the default), ready."""
    from headline import start_cluster

    return start_cluster(m, pool=True)


def stop(cluster, client) -> None:
    client.close()
    cluster.close()


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }


def versions(client) -> dict:
    """The libraries' versions, MPI's as a worker sees it (the client never loads MPI)."""
    import dask
    import distributed
    import mpi4py
    import numpy

    def mpi() -> str:
        from mpi4py import MPI

        return MPI.Get_library_version().splitlines()[0].strip()

    return {
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "numpy": numpy.__version__,
        "mpi4py": mpi4py.__version__,
        "mpi": client.submit(mpi, pure=False).result(),
    }


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def workers(client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


def pinned(client, make: Callable, shape: tuple, chunks: tuple, owner: Callable[[tuple], int], dtype="f8"):
    """A persisted dask array of ``shape`` and ``chunks`` whose block ``index`` is made by
    ``make(index, block_shape)`` on worker ``owner(index)`` (an index into the sorted workers),
    so that every run starts from the same placement."""
    import dask.array as da
    import numpy as np
    from distributed import wait

    ws = workers(client)
    grid = tuple(len(c) for c in chunks)

    def nest(prefix: tuple):
        k = len(prefix)
        if k == len(grid):
            block = tuple(c[i] for c, i in zip(chunks, prefix))
            fut = client.submit(make, prefix, block, workers=[ws[owner(prefix) % len(ws)]], pure=False)
            return da.from_delayed(fut, block, dtype=np.dtype(dtype))
        return [nest((*prefix, i)) for i in range(grid[k])]

    x = da.block(nest(())) if len(grid) > 1 else da.concatenate(nest(()))
    x = client.persist(x)
    wait(x)
    assert x.chunks == tuple(tuple(c) for c in chunks), (x.chunks, chunks)
    return x


def placement(client, x) -> dict[tuple, str]:
    """{block index: its worker} of a persisted array (one holder each)."""
    from distributed import futures_of

    who = client.who_has(futures_of(x))
    return {tuple(k[1:]): sorted(v)[0] for k, v in who.items()}


def unreplicate(client, x, where: dict[tuple, str]) -> int:
    """Puts ``x``'s blocks back where ``where`` says ({block index: worker}, from placement()
    right after pinned()), alone: a Dask run leaves copies of the blocks it fetched, and Dask's
    active memory manager then drops replicas, sometimes the original. So every run starts from
    the same placement. Returns how many copies it moved or dropped."""
    from distributed import futures_of

    home = {f.key: where[tuple(f.key[1:])] for f in futures_of(x)}

    async def restore(dask_scheduler=None):
        missing = {}
        for key, w in home.items():
            holders = {ws.address for ws in dask_scheduler.tasks[key].who_has}
            if w not in holders:
                missing.setdefault(w, {})[key] = sorted(holders)
        for w, who_has in missing.items():
            failed = await dask_scheduler.gather_on_worker(w, who_has)
            if failed:
                raise RuntimeError(f"could not put {sorted(failed)} back on {w}")
        extra: dict[str, list] = {}
        for key, w in home.items():
            for ws in dask_scheduler.tasks[key].who_has:
                if ws.address != w:
                    extra.setdefault(ws.address, []).append(key)
        for w, keys in extra.items():
            await dask_scheduler.delete_worker_data(w, keys, stimulus_id="bench-unreplicate")
        return sum(map(len, missing.values())) + sum(map(len, extra.values()))

    return client.run_on_scheduler(restore)


def moved(client) -> int:
    """Bytes the workers have sent each other through Dask so far (get_data, all of them)."""
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def settle(client, keep: int, seconds: float = 0.5) -> None:
    """A quiet moment before a timed run: the scheduler down to the ``keep`` tasks held at rest
    (the last run's keys released; at most 10 s), then ``seconds`` more."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) <= keep:
            break
        time.sleep(0.1)
    time.sleep(seconds)


def timed(client, fn: Callable, keep: int, x, where: dict[tuple, str]) -> tuple[float, int, Any]:
    """(seconds, bytes moved between workers, result) of fn(), started from x's blocks on their
    workers only (unreplicated) and a quiet cluster that keeps ``keep`` keys."""
    unreplicate(client, x, where)
    settle(client, keep)
    before = moved(client)
    t0 = time.perf_counter()
    y = fn()
    return time.perf_counter() - t0, moved(client) - before, y


def arguments(doc: str, name: str, sizes: str, large: str):
    """The options every workload takes; ``large`` says from which size --large-repeat applies."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=sizes)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each side per size (alternating)")
    ap.add_argument("--large-repeat", type=int, default=3, help=f"runs per side from {large} up")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default=None, help=f"results file (- for none); default bench/results/{name}.json")
    return ap


def stash(record: dict) -> None:
    """On a rank: a record of the job's own timing, kept in its worker (read back by stashed)."""
    import sys as _s
    import types

    mod = _s.modules.setdefault("_bench_stash", types.ModuleType("_bench_stash"))
    mod.last = record


def stashed(client) -> list[dict]:
    """The records the last job's ranks kept (one per worker that ran a rank)."""

    def read():
        import sys as _s

        mod = _s.modules.get("_bench_stash")
        return mod.__dict__.pop("last", None) if mod else None

    return [r for r in client.run(read).values() if r]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def summary(xs: list[float]) -> dict:
    return {
        "median_s": round(median(xs), 4),
        "min_s": round(min(xs), 4),
        "max_s": round(max(xs), 4),
        "runs_s": [round(x, 4) for x in xs],
    }


def write(doc: dict, name: str, out: str | None) -> None:
    text = json.dumps(doc, indent=2, default=_jsonable) + "\n"
    sys.stdout.write(text)
    if out != "-":
        path = Path(out) if out else RESULTS / name
        path.write_text(text)
        print(f"[bench] wrote {path}", file=sys.stderr)


def _jsonable(x: Any):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(type(x))


def header(what: str, m: int, client) -> dict:
    return {
        "benchmark": what,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "versions": versions(client),
        "workers": m,
        "configuration": (
            f"LocalCluster(n_workers={m}, threads_per_worker=1, processes=True) with "
            "client.register_plugin(SidecarPlugin()): the in-process pool, Open MPI, the default "
            "configuration (OMPI_MCA_mpi_yield_when_idle=1 among the sidecar's defaults); "
            "both sides on the same cluster and the same persisted input, alternating"
        ),
    }
