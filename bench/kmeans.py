"""A workload a Dask user brings: k-means (Lloyd's iterations) on a persisted (N, 8) float64 array
of points in row blocks, one per worker, on M = 4 workers: 8 clusters, 20 iterations (no early
stop, so that both sides do the same work), from the same initial centroids. Both sides start
from the same persisted array and end with the centroids on the client, on the same cluster,
alternating:

- dask: Dask-ML's way (dask_ml.cluster.KMeans, _kmeans_single_lloyd): each iteration one graph
  of a partial-sums task per block (labels by nearest centroid; per-cluster sums and counts) and
  their sum, computed, the new centroids worked out on the client and sent with the next graph.
- mpi: one ``dask_pmix.map_blocks_mpi`` job: each rank computes the partial sums of its blocks,
  ``Allreduce`` adds them up on every rank, every rank updates its centroids; rank 0 returns
  them as the one block of a (8, 8) dask array, computed to the client.

Both use the same kernel (the partial sums of one block, the update), so the centroids agree to
rounding (the sums are added in another order: compared within 1e-9 relative), and the labels
that each side's centroids give are compared too. Each figure times, from the first call to the
centroids on the client: Dask, 20 rounds of graph, execution and compute; MPI, the whole
map_blocks_mpi call (look-up, admission, communicator, hand-off, 20 iterations with their
Allreduce, output check, output array) and computing its one block. Bytes moved: what the workers
sent each other through Dask (transfer_outgoing_bytes_total) and what the ranks sent each other
in the Allreduces.

    .venv/bin/python bench/kmeans.py                       # the recorded run
    .venv/bin/python bench/kmeans.py --sizes 131072 --repeat 2 --out -
"""

from __future__ import annotations

import sys
import time

import numpy as np
import workloads as W

K, D, ITERATIONS = 8, 8, 20
CENTRES = np.random.default_rng(3).uniform(-10, 10, size=(K, D))


def make_block(index: tuple, shape: tuple) -> np.ndarray:
    """Points around the CENTRES, seeded by the block's index."""
    rng = np.random.default_rng(3000 + index[0])
    which = rng.integers(0, K, size=shape[0])
    return CENTRES[which] + rng.normal(scale=2.0, size=shape)


def initial(points_block: np.ndarray) -> np.ndarray:
    return points_block[:K].copy()


# --- the kernel, the same on both sides ------------------------------------------------------


def labels_of(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The nearest centroid of each point (|x|^2 is the same for every centroid: left out)."""
    return np.argmin((c * c).sum(1) - 2.0 * (x @ c.T), axis=1)


def partial(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Per cluster, the sum of this block's points nearest to it and their number: (K, D + 1)."""
    lab = labels_of(x, c)
    out = np.empty((len(c), x.shape[1] + 1))
    for j in range(x.shape[1]):
        out[:, j] = np.bincount(lab, weights=x[:, j], minlength=len(c))
    out[:, -1] = np.bincount(lab, minlength=len(c))
    return out


def update(c: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The new centroids from the summed partials (an empty cluster keeps its centroid)."""
    counts = total[:, -1:]
    return np.where(counts > 0, total[:, :-1] / np.maximum(counts, 1), c)


# --- Dask ------------------------------------------------------------------------------------


def dask_kmeans(client, x, c0: np.ndarray, iterations: int) -> np.ndarray:
    from dask import delayed

    blocks = x.to_delayed().ravel()
    c = c0
    for _ in range(iterations):
        parts = [delayed(partial)(b, c) for b in blocks]
        total = client.compute(delayed(sum)(parts)).result()
        c = update(c, total)
    return c


# --- MPI -------------------------------------------------------------------------------------


def kmeans_rank(comm, x, *, c0, iterations: int):
    import time as _t

    from mpi4py import MPI

    t0 = _t.perf_counter()
    c = c0
    total = np.empty((len(c0), x.shape[1] + 1))
    for _ in range(iterations):
        mine = sum((partial(b.data, c) for b in x), np.zeros_like(total))
        comm.Allreduce(mine, total, op=MPI.SUM)
        c = update(c, total)
    W.stash({"loop_s": _t.perf_counter() - t0, "allreduce_bytes": total.nbytes * iterations})
    return {(0, 0): c} if comm.rank == 0 else {}


def mpi_kmeans(x, c0: np.ndarray, iterations: int) -> np.ndarray:
    import dask_pmix

    out = dask_pmix.map_blocks_mpi(
        kmeans_rank, x, chunks=((K,), (D,)), c0=c0, iterations=iterations, name=f"kmeans-mpi-{time.monotonic_ns()}"
    )
    return out.compute()


# --- the run ---------------------------------------------------------------------------------


def make_input(client, n: int, m: int):
    base, extra = divmod(n, m)
    rows = tuple(base + (i < extra) for i in range(m))
    return W.pinned(client, make_block, (n, D), (rows, (D,)), owner=lambda ix: ix[0])


def run_size(client, n: int, m: int, repeat: int) -> dict:
    import dask.array as da

    x = make_input(client, n, m)
    where = W.placement(client, x)
    c0 = x[:K].compute()
    load0 = W.loadavg()
    dask_s, mpi_s, dask_b, mpi_b, loops, diffs, same_labels = [], [], [], [], [], [], []
    allreduce = None
    for r in range(repeat):
        outs = {}
        for side in ("dask", "mpi") if r % 2 == 0 else ("mpi", "dask"):
            W.unreplicate(client, x, where)
            W.settle(client, m + 8)
            before = W.moved(client)
            t0 = time.perf_counter()
            if side == "dask":
                outs[side] = dask_kmeans(client, x, c0, ITERATIONS)
                dask_s.append(time.perf_counter() - t0)
                dask_b.append(W.moved(client) - before)
            else:
                outs[side] = mpi_kmeans(x, c0, ITERATIONS)
                mpi_s.append(time.perf_counter() - t0)
                mpi_b.append(W.moved(client) - before)
                prof = W.stashed(client)
                loops.append(max(p["loop_s"] for p in prof))
                allreduce = sum(p["allreduce_bytes"] for p in prof)
        a, b = outs["dask"], outs["mpi"]
        diffs.append(float(np.abs(a - b).max() / np.abs(a).max()))
        la = x.map_blocks(labels_of, a, drop_axis=1, dtype=int)
        lb = x.map_blocks(labels_of, b, drop_axis=1, dtype=int)
        same_labels.append(float(da.mean(la == lb).compute()))
    load1 = W.loadavg()
    d, mm = W.median(dask_s), W.median(mpi_s)
    print(
        f"[kmeans] {n} points: dask {d:.3f} s, mpi {mm:.3f} s, ratio {d / mm:.2f}x (load {load0[0]})", file=sys.stderr
    )
    return {
        "n": n,
        "bytes": n * D * 8,
        "mib": round(n * D * 8 / 2**20, 1),
        "load_average_at_start": load0,
        "load_average_at_end": load1,
        "dask": {**W.summary(dask_s), "bytes_moved_between_workers": int(W.median(dask_b))},
        "mpi": {
            **W.summary(mpi_s),
            "bytes_moved_between_workers_by_dask": int(W.median(mpi_b)),
            "allreduce_bytes_per_rank": allreduce // m if allreduce else None,
            "on_the_ranks_median_s": round(W.median(loops), 4),
            "outside_the_ranks_work_median_s": round(mm - W.median(loops), 4),
        },
        "ratio_dask_over_mpi": round(d / mm, 2),
        "max_relative_difference_of_centroids": max(diffs),
        "fraction_of_equal_labels": min(same_labels),
    }


def main() -> None:
    ap = W.arguments(__doc__, "kmeans", "131072,1048576,4194304,16777216", "4194304 points")
    args = ap.parse_args()
    W.by_value(sys.modules[__name__], W)
    cluster, client, _ = W.start(args.workers)
    try:
        t0 = time.time()
        doc = W.header("kmeans", args.workers, client)
        m = args.workers
        rows = [
            run_size(client, n, m, args.large_repeat if n >= 4194304 else args.repeat)
            for n in (int(s) for s in args.sizes.split(","))
        ]
        doc.update(
            {
                "k": K,
                "dimensions": D,
                "iterations": ITERATIONS,
                "initial_centroids": "the first 8 points",
                "blocks": f"row blocks: block (i, 0) made on worker i (sorted addresses), {m} blocks",
                "what_is_timed": {
                    "dask": "from the first call to the centroids on the client: 20 rounds of one graph (a "
                    "partial-sums task per block and their sum, Dask-ML's Lloyd iteration), computed, and the "
                    "update on the client",
                    "mpi": "the whole dask_pmix.map_blocks_mpi call (look-up, admission, communicator, hand-off, "
                    "20 iterations with one Allreduce each, output check, output array) and computing its one "
                    "block to the client",
                    "on_the_ranks": "on each rank, from fn's start to its return; the slowest rank's, median",
                    "ratio": "median dask time / median mpi time (above 1: MPI is faster)",
                },
                "bytes_moved": "dask: bytes the workers sent each other through Dask (transfer_outgoing_bytes_"
                "total; the partial sums, 576 bytes each); mpi: the same for the Dask part of the job, and the "
                "bytes each rank contributed to the Allreduces",
                "results_compared": "max |dask - mpi| / max |dask| of the final centroids, and the fraction of "
                "points that both sides' centroids label alike (computed on the cluster), every run",
                "sizes": rows,
                "seconds": round(time.time() - t0, 1),
            }
        )
        W.write(doc, "kmeans.json", args.out)
    finally:
        W.stop(cluster, client)


if __name__ == "__main__":
    main()
