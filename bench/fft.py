"""An all-to-all on Dask's data: the 2-D FFT of an n x n float64 array held as row slabs, one per
worker, on M = 4 workers. Both sides start from the same persisted array and end with the
(complex128) result persisted in column slabs, one per worker, on the same cluster, alternating:

- dask: the best pure-Dask way found (see "dask_variants"): ``da.fft.fft`` along the rows (each
  slab holds whole rows), ``rechunk`` into column slabs (the all-to-all: Dask's task-based
  rechunk or its peer-to-peer one, ``method="p2p"``), ``da.fft.fft`` along the columns, persisted.
  (``da.fft.fft2`` takes only arrays of one block along both axes: it would not be distributed.)
- mpi: one ``dask_pmix.map_blocks_mpi`` job over the slabs' workers: each rank joins its blocks
  into one row slab (``Blocks.contiguous(axis=0)``), FFTs its rows, exchanges the pieces with
  every rank in one ``Alltoallv`` (rank q gets the columns of the rows q holds), FFTs the
  columns, and returns its column slab as a block of the output, left on its worker.

Results are compared (max |dask - mpi| relative to max |result|, on the cluster) every run, and
against numpy's fft2 on the gathered input up to 2048^2. Each figure times, from the first call
to every output block in memory: Dask, building the graph, its submission and execution, and
wait(); MPI, the whole map_blocks_mpi call (look-up, admission, communicator, hand-off, the FFTs
and the Alltoallv, the output check and the output array of futures) and wait(). Bytes moved:
what the workers sent each other through Dask (transfer_outgoing_bytes_total), and the bytes the
ranks sent each other in the Alltoallv.

    .venv/bin/python bench/fft.py                       # the recorded run
    .venv/bin/python bench/fft.py --sizes 1024 --repeat 2 --out -
"""

from __future__ import annotations

import sys
import time

import numpy as np
import workloads as W

CHOICE_SIZE = 2048


def make_block(index: tuple, shape: tuple) -> np.ndarray:
    return np.random.default_rng(2000 + index[0]).random(shape)


# --- Dask ------------------------------------------------------------------------------------


def dask_fft2(client, x, method: str):
    import dask.array as da
    from distributed import wait

    rows = da.fft.fft(x, axis=1)
    cols = rows.rechunk({0: -1, 1: x.chunks[0]}, method=method)
    y = client.persist(da.fft.fft(cols, axis=0))
    wait(y)
    return y


# --- MPI -------------------------------------------------------------------------------------


def fft_rank(comm, x):
    """One rank: its row slab, FFT along the rows, Alltoallv into column slabs (rank q gets the
    columns numbered like the rows q holds), FFT along the columns; returns its output blocks."""
    import time as _t

    from mpi4py import MPI

    t0 = _t.perf_counter()
    n = x.shape[1]
    slab = x.contiguous(axis=0)
    rows = np.fft.fft(slab.data, axis=1)
    # Every rank's rows (and so its output columns), from the layout: the same on every rank.
    lay, starts = x.layout, np.cumsum((0, *x.chunks[0]))
    span = []
    for q in range(comm.size):
        ix = [i for (i, _) in lay.blocks(q)]
        span.append((int(starts[min(ix)]), int(starts[max(ix) + 1])) if ix else (0, 0))
    me = span[comm.rank]
    width = me[1] - me[0]
    mine = rows.shape[0]
    send = np.concatenate([rows[:, a:b].ravel() for a, b in span]) if mine else np.empty(0, complex)
    scounts = [mine * (b - a) for a, b in span]
    rcounts = [(b - a) * width for a, b in span]
    recv = np.empty(sum(rcounts), complex)
    comm.Alltoallv([send, (scounts, None), MPI.C_DOUBLE_COMPLEX], [recv, (rcounts, None), MPI.C_DOUBLE_COMPLEX])
    cols = np.empty((n, width), complex)
    at = 0
    for (a, b), c in zip(span, rcounts):
        cols[a:b] = recv[at : at + c].reshape(b - a, width)
        at += c
    out = np.fft.fft(cols, axis=0)
    sent = sum(c for q, c in enumerate(scounts) if q != comm.rank) * 16
    W.stash({"loop_s": _t.perf_counter() - t0, "alltoall_bytes_sent": sent})
    # Output block (0, j) is column slab j: the columns numbered like this rank's row blocks.
    return {(0, i): out[:, int(starts[i]) - me[0] : int(starts[i + 1]) - me[0]] for (i, _) in lay.blocks(comm.rank)}


def mpi_fft2(x):
    from distributed import wait

    import dask_pmix

    y = dask_pmix.map_blocks_mpi(
        fft_rank, x, chunks=((x.shape[0],), x.chunks[0]), dtype=complex, name=f"fft2-mpi-{time.monotonic_ns()}"
    )
    wait(y)
    return y


# --- the run ---------------------------------------------------------------------------------


def make_input(client, n: int, m: int):
    base, extra = divmod(n, m)
    rows = tuple(base + (i < extra) for i in range(m))
    return W.pinned(client, make_block, (n, n), (rows, (n,)), owner=lambda ix: ix[0])


def relative_difference(a, b) -> float:
    import dask.array as da

    diff, scale = da.compute(da.max(abs(a - b)), da.max(abs(b)))
    return float(diff / scale)


def choose_dask(client, n: int, m: int, repeat: int) -> dict:
    x = make_input(client, n, m)
    where = W.placement(client, x)
    methods = ("tasks", "p2p")
    runs: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(repeat):
        for method in methods if r % 2 == 0 else methods[::-1]:
            dt, _, y = W.timed(client, lambda method=method: dask_fft2(client, x, method), m + 8, x, where)
            runs[method].append(dt)
            del y
    found = {f"rechunk method={k!r}": W.summary(v) for k, v in runs.items()}
    best = min(methods, key=lambda k: W.median(runs[k]))
    print(f"[fft] dask variants at {n}: {found}", file=sys.stderr)
    return {"size": n, "repeat": repeat, "medians": found, "chosen": f"rechunk method={best!r}", "method": best}


def run_size(client, n: int, m: int, repeat: int, method: str) -> dict:
    x = make_input(client, n, m)
    where = W.placement(client, x)
    load0 = W.loadavg()
    dask_s, mpi_s, dask_b, mpi_b, loops, diffs = [], [], [], [], [], []
    sent = None
    for r in range(repeat):
        outs = {}
        for side in ("dask", "mpi") if r % 2 == 0 else ("mpi", "dask"):
            keep = m + 8 + m * len(outs)
            if side == "dask":
                dt, b, outs["dask"] = W.timed(client, lambda: dask_fft2(client, x, method), keep, x, where)
                dask_s.append(dt)
                dask_b.append(b)
            else:
                dt, b, outs["mpi"] = W.timed(client, lambda: mpi_fft2(x), keep, x, where)
                mpi_s.append(dt)
                mpi_b.append(b)
                prof = W.stashed(client)
                loops.append(max(p["loop_s"] for p in prof))
                sent = sum(p["alltoall_bytes_sent"] for p in prof)
        assert outs["dask"].chunks == outs["mpi"].chunks, (outs["dask"].chunks, outs["mpi"].chunks)
        diffs.append(relative_difference(outs["dask"], outs["mpi"]))
        if r == 0 and n <= 2048:
            ref = np.fft.fft2(x.compute())
            got = outs["mpi"].compute()
            diffs.append(float(np.abs(got - ref).max() / np.abs(ref).max()))
        del outs
    load1 = W.loadavg()
    d, mm = W.median(dask_s), W.median(mpi_s)
    print(f"[fft] {n}^2: dask {d:.3f} s, mpi {mm:.3f} s, ratio {d / mm:.2f}x (load {load0[0]})", file=sys.stderr)
    return {
        "n": n,
        "input_bytes": n * n * 8,
        "output_bytes": n * n * 16,
        "mib": round(n * n * 8 / 2**20, 1),
        "load_average_at_start": load0,
        "load_average_at_end": load1,
        "dask": {**W.summary(dask_s), "bytes_moved_between_workers": int(W.median(dask_b))},
        "mpi": {
            **W.summary(mpi_s),
            "bytes_moved_between_workers_by_dask": int(W.median(mpi_b)),
            "alltoallv_bytes_over_mpi": sent,
            "on_the_ranks_median_s": round(W.median(loops), 4),
            "outside_the_ranks_work_median_s": round(mm - W.median(loops), 4),
        },
        "ratio_dask_over_mpi": round(d / mm, 2),
        "max_relative_difference": max(diffs),
    }


def main() -> None:
    ap = W.arguments(__doc__, "fft", "1024,2048,4096,8192", "8192")
    ap.add_argument("--choose-repeat", type=int, default=3)
    ap.add_argument("--method", default=None, help="skip the choice: tasks or p2p")
    args = ap.parse_args()
    W.by_value(sys.modules[__name__], W)
    cluster, client, _ = W.start(args.workers)
    try:
        t0 = time.time()
        doc = W.header("fft2", args.workers, client)
        m = args.workers
        choice = (
            {"chosen": f"given: rechunk method={args.method!r}", "method": args.method}
            if args.method
            else choose_dask(client, CHOICE_SIZE, m, args.choose_repeat)
        )
        rows = [
            run_size(client, n, m, args.large_repeat if n >= 8192 else args.repeat, choice["method"])
            for n in (int(s) for s in args.sizes.split(","))
        ]
        doc.update(
            {
                "blocks": f"row slabs: block (i, 0) made on worker i (sorted addresses), {m} blocks; output in "
                f"{m} column slabs",
                "what_is_timed": {
                    "dask": "from the first call to every output block in memory: da.fft.fft along axis 1, "
                    "rechunk into column slabs, da.fft.fft along axis 0, persist, wait()",
                    "mpi": "the whole dask_pmix.map_blocks_mpi call (look-up, admission, communicator, hand-off, "
                    "row FFTs, one Alltoallv, column FFTs, output check, output array of futures) and wait()",
                    "on_the_ranks": "on each rank, from fn's start to its return; the slowest rank's, median",
                    "ratio": "median dask time / median mpi time (above 1: MPI is faster)",
                },
                "bytes_moved": "dask: bytes the workers sent each other through Dask during the run "
                "(transfer_outgoing_bytes_total); mpi: the same for the Dask part of the job, and the bytes the "
                "ranks sent each other in the Alltoallv",
                "results_compared": "max |dask - mpi| / max |mpi| on the cluster every run; up to 2048^2 also "
                "max |mpi - numpy.fft.fft2(input)| / max |numpy's|",
                "dask_variants": choice,
                "sizes": rows,
                "seconds": round(time.time() - t0, 1),
            }
        )
        W.write(doc, "fft.json", args.out)
    finally:
        W.stop(cluster, client)


if __name__ == "__main__":
    main()
