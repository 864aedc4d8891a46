"""An iterative 2-D stencil on Dask's data: 100 Jacobi sweeps of the heat equation's steady state
(u <- (u_N + u_S + u_W + u_E) / 4, zero outside the array) over an n x n float64 array held as
2 x 2 blocks, one per worker, on M = 4 workers. Both sides start from the same persisted array
and end with the result persisted (every output block in a worker's memory), on the same cluster,
alternating:

- dask: the best pure-Dask way found (see "dask_variants"): ``map_overlap`` with depth 1, each
  sweep one more layer of the graph, persisted every ``k`` sweeps. Two boundary treatments are
  tried: ``boundary=0`` (Dask pads the array's outer edges with zero blocks) and ``boundary='none'``
  (no padding tasks; the kernel pads the outer edges itself from ``block_info``).
- mpi: one ``dask_pmix.map_blocks_mpi`` job over the blocks' workers: each rank keeps its blocks
  padded by one ghost cell, and every sweep exchanges edge rows and columns with the ranks holding
  the neighbouring blocks (Isend/Irecv, neighbours from the layout), then sweeps; the output
  blocks come back as a dask array left on the ranks' workers.

Both sides run the same kernel on the same values, so the results agree to the last bit
(compared within 1e-12 anyway). Each figure times, from the first call to every output block in
memory: Dask, building and submitting the graph of 100 sweeps and its execution; MPI, the whole
map_blocks_mpi call (placement look-up, job admission, communicator, hand-off of the blocks, the
sweeps, output check and collection-out) and waiting for its output futures. Bytes moved: what
the workers sent each other through Dask during the run (transfer_outgoing_bytes_total), and the
halo bytes the ranks sent each other over MPI.

    .venv/bin/python bench/stencil.py                       # the recorded run
    .venv/bin/python bench/stencil.py --sizes 512,1024 --repeat 3 --out -
"""

from __future__ import annotations

import sys
import time

import numpy as np
import workloads as W

ITERATIONS = 100


# --- the kernel, the same on both sides ------------------------------------------------------


def sweep(p: np.ndarray, out: np.ndarray) -> np.ndarray:
    """One Jacobi sweep: ``p`` is a block with one ghost cell on each side, ``out`` its interior."""
    np.add(p[:-2, 1:-1], p[2:, 1:-1], out=out)
    out += p[1:-1, :-2]
    out += p[1:-1, 2:]
    out *= 0.25
    return out


def make_block(index: tuple, shape: tuple) -> np.ndarray:
    """Block ``index`` of the input: random values, seeded by its index."""
    seed = 1000 + 97 * index[0] + index[1]
    return np.random.default_rng(seed).random(shape)


# --- Dask ------------------------------------------------------------------------------------


def dask_kernel_zero(p: np.ndarray) -> np.ndarray:
    """map_overlap(boundary=0, trim=False): ``p`` is padded on every side."""
    return sweep(p, np.empty((p.shape[0] - 2, p.shape[1] - 2)))


def dask_kernel_none(p: np.ndarray, block_info=None) -> np.ndarray:
    """map_overlap(boundary='none', trim=False): ``p`` has ghost cells only towards other blocks;
    the array's outer edges are padded with zeros here."""
    (i, j), (ni, nj) = block_info[0]["chunk-location"], block_info[0]["num-chunks"]
    pad = ((int(i == 0), int(i == ni - 1)), (int(j == 0), int(j == nj - 1)))
    if any(a or b for a, b in pad):
        p = np.pad(p, pad)
    return sweep(p, np.empty((p.shape[0] - 2, p.shape[1] - 2)))


def dask_sweeps(client, u, iterations: int, boundary, every: int):
    """The Dask way: ``iterations`` layers of map_overlap, persisted every ``every`` sweeps."""
    from distributed import wait

    kernel = dask_kernel_zero if boundary == 0 else dask_kernel_none
    for it in range(iterations):
        u = u.map_overlap(kernel, depth=1, boundary=boundary, trim=False, chunks=u.chunks, dtype=u.dtype)
        if (it + 1) % every == 0 or it == iterations - 1:
            u = client.persist(u)
    wait(u)
    return u


# --- MPI -------------------------------------------------------------------------------------

# Directions a block sends its edge towards: north, south, west, east.
DIRS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def stencil_rank(comm, u, *, iterations: int):
    """One rank of the MPI job: its blocks of ``u`` padded with ghost cells; each sweep, the
    ghost cells from the neighbouring blocks (sent by their ranks, or copied when the neighbour is
    local), then the sweep. Returns its output blocks {index: array}."""
    import time as _t

    from mpi4py import MPI

    t0 = _t.perf_counter()
    ni, nj = u.numblocks
    flat = lambda ix: ix[0] * nj + ix[1]  # noqa: E731
    pads, spare = {}, {}
    for b in u:
        h, w = b.shape
        p = np.zeros((h + 2, w + 2))
        p[1:-1, 1:-1] = b.data
        pads[b.index], spare[b.index] = p, np.zeros_like(p)

    def edge(p, d):  # this block's cells next to its neighbour in direction d
        return {0: p[1, 1:-1], 1: p[-2, 1:-1], 2: p[1:-1, 1], 3: p[1:-1, -2]}[d]

    def ghost(p, d):  # this block's ghost cells towards direction d
        return {0: p[0, 1:-1], 1: p[-1, 1:-1], 2: p[1:-1, 0], 3: p[1:-1, -1]}[d]

    local, remote = [], []  # (block, direction, neighbour[, its rank])
    for ix in pads:
        for d, (di, dj) in enumerate(DIRS):
            nb = (ix[0] + di, ix[1] + dj)
            if 0 <= nb[0] < ni and 0 <= nb[1] < nj:
                owner = u.layout.rank_of(nb)
                (local if owner == comm.rank else remote).append((ix, d, nb, owner))
    # A column edge is not contiguous: it travels through a buffer.
    sendbuf = {(ix, d): np.empty(edge(pads[ix], d).shape) for ix, d, _, _ in remote}
    recvbuf = {(ix, d): np.empty(ghost(pads[ix], d).shape) for ix, d, _, _ in remote}
    sent = 0
    for it in range(iterations):
        reqs = []
        for ix, d, _, owner in remote:
            # The neighbour in direction d sends its edge towards us (direction d ^ 1).
            reqs.append(comm.Irecv(recvbuf[(ix, d)], source=owner, tag=flat(ix) * 4 + d))
        for ix, d, nb, owner in remote:
            buf = sendbuf[(ix, d)]
            buf[...] = edge(pads[ix], d)
            reqs.append(comm.Isend(buf, dest=owner, tag=flat(nb) * 4 + (d ^ 1)))
            sent += buf.nbytes
        for ix, d, nb, _ in local:
            ghost(pads[ix], d)[...] = edge(pads[nb], d ^ 1)
        MPI.Request.Waitall(reqs)
        for ix, d, _, _ in remote:
            ghost(pads[ix], d)[...] = recvbuf[(ix, d)]
        last = it == iterations - 1
        out = {}
        for ix, p in pads.items():
            if last:  # the output blocks, contiguous and new
                out[ix] = sweep(p, np.empty((p.shape[0] - 2, p.shape[1] - 2)))
            else:
                sweep(p, spare[ix][1:-1, 1:-1])
        if not last:
            pads, spare = spare, pads
    W.stash({"loop_s": _t.perf_counter() - t0, "halo_bytes_sent": sent, "rank": comm.rank})
    return out


def mpi_sweeps(u, iterations: int):
    from distributed import wait

    import dask_pmix

    y = dask_pmix.map_blocks_mpi(stencil_rank, u, iterations=iterations, name=f"stencil-mpi-{time.monotonic_ns()}")
    wait(y)
    return y


# --- the run ---------------------------------------------------------------------------------


def make_input(client, n: int, grid: tuple[int, int]):
    """The input: n x n, ``grid`` blocks (as even as can be), block (i, j) on worker i * cols + j."""

    def split(k: int) -> tuple[int, ...]:
        base, extra = divmod(n, k)
        return tuple(base + (i < extra) for i in range(k))

    return W.pinned(
        client, make_block, (n, n), (split(grid[0]), split(grid[1])), owner=lambda ix: ix[0] * grid[1] + ix[1]
    )


def same(client, a, b) -> float:
    """Largest absolute difference between two persisted arrays (computed on the cluster)."""
    import dask.array as da

    return float(da.max(abs(a - b)).compute())


VARIANTS = [(b, k) for b in (0, "none") for k in (1, 10, ITERATIONS)]


def variant_name(v: tuple) -> str:
    return f"boundary={v[0]!r}, persist every {v[1]}"


def run_size(client, n: int, grid: tuple[int, int], repeat: int, candidates: list[tuple], check_numpy: bool) -> dict:
    """One size: each candidate Dask variant once (the fastest is this size's Dask way), then
    ``repeat`` runs of each side, alternating, and the results compared every run."""
    u = make_input(client, n, grid)
    blocks = grid[0] * grid[1]
    load0 = W.loadavg()
    where = W.placement(client, u)
    tried = {}
    for v in candidates if len(candidates) > 1 else ():  # one candidate: nothing to choose
        dt, b, y = W.timed(client, lambda v=v: dask_sweeps(client, u, ITERATIONS, *v), blocks + 8, u, where)
        tried[variant_name(v)] = {"seconds": round(dt, 4), "bytes_moved_between_workers": b}
        del y
    chosen = min(candidates, key=lambda v: tried[variant_name(v)]["seconds"]) if tried else candidates[0]
    print(f"[stencil] {n}^2 dask variants: {tried}; chosen {variant_name(chosen)}", file=sys.stderr)
    dask_s, mpi_s, dask_b, mpi_b, loops, diffs = [], [], [], [], [], []
    halo = None
    for r in range(repeat):
        sides = ("dask", "mpi") if r % 2 == 0 else ("mpi", "dask")
        outs = {}
        for side in sides:
            keep = blocks * (2 + len(outs)) + 8
            if side == "dask":
                dt, b, outs["dask"] = W.timed(
                    client, lambda: dask_sweeps(client, u, ITERATIONS, *chosen), keep, u, where
                )
                dask_s.append(dt)
                dask_b.append(b)
            else:
                dt, b, outs["mpi"] = W.timed(client, lambda: mpi_sweeps(u, ITERATIONS), keep, u, where)
                mpi_s.append(dt)
                mpi_b.append(b)
                prof = W.stashed(client)
                loops.append(max(p["loop_s"] for p in prof))
                halo = sum(p["halo_bytes_sent"] for p in prof)
        diffs.append(same(client, outs["dask"], outs["mpi"]))
        if check_numpy and r == 0:
            ref = u.compute()
            for _ in range(ITERATIONS):
                ref = sweep(np.pad(ref, 1), np.empty_like(ref))
            diffs.append(float(np.abs(outs["mpi"].compute() - ref).max()))
        del outs
    load1 = W.loadavg()
    d, m = W.median(dask_s), W.median(mpi_s)
    print(f"[stencil] {n}^2: dask {d:.3f} s, mpi {m:.3f} s, ratio {d / m:.1f}x (load {load0[0]})", file=sys.stderr)
    return {
        "n": n,
        "bytes": n * n * 8,
        "mib": round(n * n * 8 / 2**20, 1),
        "chunks": [list(c) for c in u.chunks],
        "placement": {str(k): v for k, v in sorted(where.items())},
        "load_average_at_start": load0,
        "load_average_at_end": load1,
        "dask_variants_tried_once": tried,
        "dask_variant": variant_name(chosen),
        "dask": {**W.summary(dask_s), "bytes_moved_between_workers": int(W.median(dask_b))},
        "mpi": {
            **W.summary(mpi_s),
            "bytes_moved_between_workers_by_dask": int(W.median(mpi_b)),
            "halo_bytes_over_mpi": halo,
            "sweeps_on_the_ranks_median_s": round(W.median(loops), 4),
            "outside_the_sweeps_median_s": round(m - W.median(loops), 4),
        },
        "ratio_dask_over_mpi": round(d / m, 2),
        "max_abs_difference": max(diffs),
        "compared_with_numpy": check_numpy,
    }


def main() -> None:
    ap = W.arguments(__doc__, "stencil", "512,1024,2048,4096,8192,11585", "4096")
    ap.add_argument("--grid", default="4x1", help="blocks, rows x columns (one per worker by default)")
    ap.add_argument(
        "--choose-up-to",
        type=int,
        default=2048,
        help="every Dask variant tried up to this size; above it, the fastest at the last size tried",
    )
    ap.add_argument("--large-candidates", type=int, default=2, help="how many of those fastest (1: no choice)")
    ap.add_argument("--dask", default=None, help="only this Dask variant: 'BOUNDARY,EVERY', e.g. 0,10")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    grid = tuple(int(g) for g in args.grid.split("x"))
    W.by_value(sys.modules[__name__], W)
    cluster, client, _ = W.start(args.workers)
    try:
        t0 = time.time()
        doc = W.header("stencil", args.workers, client)
        if args.dask:
            b, k = args.dask.split(",")
            given = [(0 if b == "0" else b, int(k))]
        rows, best = [], list(VARIANTS)
        for n in sizes:
            if args.dask:
                candidates = given
            elif n <= args.choose_up_to:
                candidates = list(VARIANTS)
            else:
                candidates = best[: args.large_candidates]
            row = run_size(
                client, n, grid, args.large_repeat if n >= 4096 else args.repeat, candidates, check_numpy=n <= 1024
            )
            if n <= args.choose_up_to and not args.dask:
                tried = row["dask_variants_tried_once"]
                best = sorted(VARIANTS, key=lambda v: tried[variant_name(v)]["seconds"])
            rows.append(row)
        doc.update(
            {
                "iterations": ITERATIONS,
                "blocks": f"{grid[0]} x {grid[1]} blocks, block (i, j) made on worker {grid[1]}i + j (sorted "
                "addresses)",
                "what_is_timed": {
                    "dask": (
                        "from the first map_overlap call to every output block in memory: building the graph of "
                        "100 sweeps (map_overlap, depth 1), its submission (persisted every k sweeps), its "
                        "execution on the workers, and wait() on the result"
                    ),
                    "mpi": (
                        "the whole dask_pmix.map_blocks_mpi call (persisted-input check, who_has, job admission "
                        "by the sidecar, the in-process communicator, hand-off of each worker's blocks, the 100 "
                        "sweeps with halo exchange, the output check and the output array of futures) and wait() "
                        "on its output blocks"
                    ),
                    "sweeps_on_the_ranks": "on each rank, from fn's start to its return (padding, 100 exchanges "
                    "and sweeps); the slowest rank's, median over runs",
                    "ratio": "median dask time / median mpi time (above 1: MPI is faster)",
                },
                "dask_way": (
                    "per size, each candidate variant (boundary=0 or 'none', persisted every 1, 10 or 100 sweeps) "
                    f"is run once and the fastest is that size's Dask side; all six up to {args.choose_up_to}^2, "
                    f"above it the {args.large_candidates} fastest at the last size where all were tried (one: "
                    "taken without a trial run)"
                ),
                "bytes_moved": (
                    "dask: bytes the workers sent each other through Dask during the run "
                    "(transfer_outgoing_bytes_total); mpi: the same for the Dask part of the job, and "
                    "the halo rows and columns the ranks sent each other over MPI"
                ),
                "results_compared": "max |dask - mpi| over the whole array, computed on the cluster, every run; "
                "up to 1024^2 also the MPI result against numpy's 100 sweeps on the gathered input",
                "sizes": rows,
                "seconds": round(time.time() - t0, 1),
            }
        )
        doc["crossover"] = crossover(rows)
        W.write(doc, "stencil.json", args.out)
    finally:
        W.stop(cluster, client)


def crossover(rows: list[dict]) -> str:
    slower = [r["n"] for r in rows if r["ratio_dask_over_mpi"] < 1]
    if not slower:
        return "none: MPI is faster than Dask at every size measured"
    return f"MPI is slower than Dask from {min(slower)}^2"


if __name__ == "__main__":
    main()
