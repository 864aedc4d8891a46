"""map_blocks_mpi: a dask.array in, an MPI job over the workers holding its blocks, a dask.array
out whose blocks stay on the workers that made them.

The client's half (DESIGN.md, "Collections and elastic jobs"): it persists the inputs, reads
each block's position from its key ((name, i, j, ...): never from list order), finds its holder
(who_has), groups aligned blocks onto one rank, and builds the layout that every rank gets. The
member's half (dask_pmix.member.collections) hands ``fn`` its blocks and checks what it returns.
The output array is a persisted collection: one future per block, made by a getitem task pinned
to the worker of the rank that returned the block, so no byte moves until the array is used."""

from __future__ import annotations

import functools
import math
import numbers
import operator
import uuid
from collections.abc import Callable
from typing import Any

from ..blocks import Index, Layout, show, shown
from ..errors import Failure, MPIJobError
from ..protocol import Call
from .events import job_ends
from .graph import submit_ranks
from .retries import check_retries, held_now, with_retries
from .run import _check_request, _gather, _settler, _start_job, _sync, _warn_soon

MEMBER = "dask_pmix.member.collections"
EMPTY = ("include", "exclude", "error")
ALIGN = ("error", "move", "none")
REBALANCE = (None, "dask", "mpi")


def map_blocks_mpi(
    fn: Callable,
    *arrays,
    chunks: tuple | None = None,
    dtype: Any = None,
    empty: str = "include",
    align: str = "error",
    rebalance: str | None = None,
    client=None,
    n: int | None = None,
    workers: list[str] | None = None,
    impl: str | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    name: str | None = None,
    retries: int = 0,
    **kwargs,
):
    """Runs ``fn(comm, *blocks, **kwargs)`` as one MPI job over the workers that hold the blocks
    of ``arrays`` (dask arrays), and returns the blocks the ranks return as a dask array that
    stays where it was made.

    Each rank gets one :class:`dask_pmix.blocks.Blocks` per input: the blocks its worker holds,
    each a ``Block(index, offset, data)`` (index from the block's key, offset its global start),
    with the array's ``shape``, ``chunks``, ``dtype`` and the ``layout`` (which rank holds which
    block indices, the same on every rank); ``blocks.contiguous(axis)`` joins a contiguous run
    into one array with its offset. Inputs that are not persisted are persisted first (they are
    computed where Dask puts them; persist them yourself to keep them for another call).

    ``fn`` returns its output blocks as ``{block index: array}``. With ``chunks=None`` the output
    has the first input's chunks and each rank returns the blocks it holds of the first input
    (so do output chunks with the first input's grid, or a block shape per block as in
    ``da.map_blocks(chunks=...)``); with other ``chunks`` (NaN for sizes not known ahead), every
    output block comes from exactly one rank, any. ``dtype=None`` takes the blocks' own. A block
    of the wrong shape or dtype, one missing or returned twice, fails the call naming the rank
    and the block.

    Aligned inputs (``align="error"``, the default): blocks whose indices agree along the axes
    the inputs have in common (block i of X and of y) must be on one worker, and the inputs
    chunked alike along those axes; ``align="move"`` has Dask copy the blocks that are not to
    the worker holding most of their group first, ``align="none"`` treats the inputs apart.

    ``rebalance`` spreads the blocks over the members, in contiguous runs of block indices
    (row-major) of sizes that differ by at most one (aligned blocks together; with
    ``align="none"`` each input on its own), each run to the member that holds most of it:
    ``"dask"`` has Dask copy the blocks that must move before the job starts, ``"mpi"`` has the
    ranks send them to each other over the job's communicator before ``fn`` runs. ``fn`` then
    sees the balanced layout. ``None`` (the default) moves nothing.

    Members: the holders; ``workers`` (which must include them) or ``n`` (at least the holders,
    other workers added) make more. ``empty`` says what a member without blocks does:
    ``"include"`` takes part with no blocks, ``"exclude"`` leaves the job, ``"error"`` fails the
    call. ``impl``, ``mode``, ``timeout`` and ``wiring_timeout`` are run_mpi's. A worker that
    held blocks and left before the job started fails the call naming it (the inputs, persisted,
    are still in the cluster: Dask recomputes what was lost; call again). ``retries`` (run_mpi's)
    does that itself: a job that lost a member (or a holder lost before it started) runs again,
    up to ``retries`` times, over the workers holding the blocks once Dask has computed again or
    moved what the lost worker held. With an asynchronous client, ``await`` it.
    """
    import dask.array as da
    from distributed import default_client

    if not arrays:
        raise TypeError("map_blocks_mpi needs at least one dask array")
    for k, a in enumerate(arrays):
        if not isinstance(a, da.Array):
            raise TypeError(
                f"argument {k + 1} of map_blocks_mpi is a {type(a).__name__}, not a dask array "
                "(pass other arguments by keyword)"
            )
        if a.ndim == 0:
            raise ValueError(f"input {k} is 0-dimensional: map_blocks_mpi hands out blocks of arrays of 1 or more axes")
        if any(not math.isfinite(c) for sizes in a.chunks for c in sizes):
            raise ValueError(
                f"input {k} has unknown chunk sizes (NaN), so its blocks have no offsets: "
                "call x.compute_chunk_sizes() on it first"
            )
    if "local" in kwargs:  # the rank's pieces travel as local= (run_mpi's)
        raise TypeError("map_blocks_mpi and map_partitions_mpi pass fn no keyword 'local': rename it")
    if empty not in EMPTY:
        raise ValueError(f"empty must be 'include', 'exclude' or 'error', not {empty!r}")
    if align not in ALIGN:
        raise ValueError(f"align must be 'error', 'move' or 'none', not {align!r}")
    if rebalance not in REBALANCE:
        raise ValueError(f"rebalance must be None, 'dask' or 'mpi', not {rebalance!r}")
    if align != "none":
        _check_chunks(arrays)
    out = output_spec(arrays[0], chunks, dtype)
    _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    retries = check_retries(retries)
    client = client or default_client()
    from dask.utils import funcname

    out_name = name or f"{funcname(fn)}-mpi-{uuid.uuid4().hex}"
    held = _persisted(client, arrays)
    fallbacks: list = []
    options = {"impl": impl, "mode": mode, "timeout": timeout, "wiring_timeout": wiring_timeout}

    async def attempt(labels: dict | None):
        members, blocks_of, targets_of = await _place(
            client, min(a.ndim for a in arrays), held, align, empty, workers, n, rebalance
        )
        spec = {
            "inputs": [{"name": a.name, "shape": a.shape, "chunks": a.chunks, "dtype": a.dtype} for a in arrays],
            "out": out,
        }
        job, futures = await _run_job(
            client,
            f"{MEMBER}:rank_blocks",
            fn,
            spec,
            kwargs,
            held,
            members,
            blocks_of,
            targets_of,
            fallbacks,
            {**options, "labels": labels},
            _block,
        )
        return await _output(client, job, futures, out, out_name)

    async def run():
        return await with_retries(client, retries, attempt, settle_with=_settler(client))

    return _sync(client, fallbacks, run)


async def _run_job(
    client, target: str, fn, spec, kwargs, held, members, blocks_of, targets_of, fallbacks, options, piece
) -> tuple[Any, list]:
    """The job over ``members``, each rank given its pieces of every input (``local=``) and the
    layout once the rank order is known; returns it with its ranks' futures, all finished.
    ``targets_of`` (rebalance="mpi"): where the pieces go; the ranks send them there first
    (member.collections.exchanged), and ``fn`` sees that layout."""

    def local_for(ranked: list[dict]) -> dict[str, Any]:
        order = [m["workerId"] for m in ranked]
        source = Layout([blocks_of[w] for w in order], order)
        layout = Layout([targets_of[w] for w in order], order) if targets_of is not None else source
        return {
            w: {
                "rank": r,
                "layout": layout,
                **({"source": source} if targets_of is not None else {}),
                "data": [[held[k][ix] for ix in source.blocks(r, k)] for k in range(len(held))],
            }
            for r, w in enumerate(order)
        }

    wrapper = functools.partial(Call(target), fn, spec)
    # A holder that left since the look-up would be waited for as a member (the sidecar waits
    # for workers that are coming back): said at once instead.
    gone = await _gone(client, members)
    if gone:
        raise _holder_gone(gone[0], blocks_of, piece=piece)
    try:
        job = await _start_job(client, wrapper, (), kwargs, workers=members, local_for=local_for, **options)
    except MPIJobError as e:
        gone = await _gone(client, members)
        if gone:
            raise _holder_gone(gone[0], blocks_of, f" (the sidecar said: {e.reason})", e.job_id, piece) from e
        raise
    _warn_soon(fallbacks, job)
    try:
        futures = await _gather(client, job, job.job.get("timeoutSeconds") or None, fetch=False)
    except BaseException:
        await job._release()
        raise
    finally:
        job_ends(client).forget(job.id)
    return job, futures


def output_spec(first, chunks, dtype) -> dict:
    """What the output's blocks must be: chunks (NaN where unknown), dtype (None: the blocks'),
    and whether it follows the first input (each rank returns the blocks it holds of it)."""
    import numpy as np

    def size(c: Any) -> float:
        if isinstance(c, numbers.Real) and not isinstance(c, bool):
            f = float(c)
            if math.isnan(f):
                return f
            if f.is_integer() and f >= 0:
                return int(f)
        raise ValueError(f"chunks must be block sizes (whole numbers, or NaN when not known ahead), not {c!r}")

    if chunks is None:
        out_chunks = first.chunks
    elif isinstance(chunks, tuple) and all(isinstance(c, numbers.Number) for c in chunks):
        # A shape per block, as in da.map_blocks: the first input's grid.
        if len(chunks) != first.ndim:
            raise ValueError(
                f"chunks={chunks!r} is a block shape of {len(chunks)} axes; the first input has {first.ndim} "
                "(give the whole chunks, a tuple of block sizes per axis, for another grid)"
            )
        out_chunks = tuple((size(c),) * nb for c, nb in zip(chunks, first.numblocks))
    elif isinstance(chunks, (tuple, list)) and chunks and all(isinstance(c, (tuple, list)) and c for c in chunks):
        out_chunks = tuple(tuple(size(c) for c in axis) for axis in chunks)
    else:
        raise ValueError(
            f"chunks must be None (the first input's), a block shape, or block sizes per axis, not {chunks!r}"
        )
    grid = tuple(len(c) for c in out_chunks)
    return {
        "chunks": tuple(tuple(c) for c in out_chunks),
        "dtype": None if dtype is None else np.dtype(dtype),
        "follow": grid == first.numblocks,
    }


def _persisted(client, arrays) -> list[dict[Index, Any]]:
    """For each input, {block index: future}, persisting the inputs that are not (all at once)."""
    from dask.core import flatten
    from distributed import futures_of

    def futures(a) -> dict | None:
        if not hasattr(a, "chunks"):
            # A persisted dask-expr frame's keys are aliases (FromGraph) of its futures', which
            # are (name, i) for partition i.
            fs = {f.key: f for f in futures_of(a)}
            if not all(isinstance(k, tuple) and len(k) == 2 for k in fs):
                return None
            whole = len({k[0] for k in fs}) == 1 and sorted(k[1] for k in fs) == list(range(a.npartitions))
            return fs if whole else None
        keys = set(flatten(a.__dask_keys__()))
        fs = {f.key: f for f in futures_of(a) if f.key in keys}
        return fs if len(fs) == len(keys) else None

    found = [futures(a) for a in arrays]
    todo = [k for k, f in enumerate(found) if f is None]
    if todo:
        done = client.persist([arrays[k] for k in todo])
        for k, a in zip(todo, done):
            found[k] = futures(a)
    out = []
    for fs in found:
        assert fs is not None
        # A block's position is its key's index tuple, (name, i, j, ...).
        out.append({tuple(key[1:]): f for key, f in fs.items()})
    return out


async def _holders(client, held: list[dict[Index, Any]]) -> dict[Any, list[str]]:
    from distributed.client import _wait

    every = [f for fs in held for f in fs.values()]
    await _wait(every)
    for k, fs in enumerate(held):
        for ix, f in fs.items():
            if f.status == "error":
                exc = await f._exception()
                raise RuntimeError(f"block {show(ix)} of input {k} could not be computed: {exc!r}") from exc
    # A holder that left since is computed again by Dask: looked for until each block is held (bounded).
    return await held_now(client, every)


def _check_chunks(arrays) -> None:
    """Aligned arrays are chunked alike along the axes they have in common."""
    common = min(a.ndim for a in arrays)
    for k, a in enumerate(arrays[1:], 1):
        for axis in range(common):
            if a.chunks[axis] != arrays[0].chunks[axis]:
                raise ValueError(
                    f"inputs 0 and {k} are not chunked alike along axis {axis} ({_few(arrays[0].chunks[axis])} "
                    f"and {_few(a.chunks[axis])}): rechunk one like the other, or pass align='none' if "
                    "their blocks are not meant to meet"
                )


def _block(ix: Index) -> str:
    return f"block {show(ix)}"


def _partition(ix: Index) -> str:
    return f"partition {ix[0]}"


async def _place(
    client, common: int, held, align, empty, workers, n, rebalance=None, piece: Callable[[Index], str] = _block
) -> tuple[list[str], dict[str, list[list[Index]]], dict[str, list[list[Index]]] | None]:
    """The members; for each, the indices of the pieces (blocks, partitions) of each input it
    holds, aligned pieces (indices that agree on the first ``common`` axes) on one member; and,
    with rebalance="mpi", the pieces each is to hold once the ranks have sent them (else None)."""
    who_has = await _holders(client, held)
    nowhere = [(k, ix) for k, fs in enumerate(held) for ix, f in fs.items() if not who_has.get(f.key)]
    if nowhere:
        k, ix = nowhere[0]
        raise MPIJobError(
            f"{piece(ix)} of input {k} is on no worker (its worker left and Dask has not computed it "
            "again yet): call again",
            kind=Failure.MEMBER_LOST,
        )
    groups: dict[Any, list[tuple[int, Index]]] = {}
    for k, fs in enumerate(held):
        for ix in fs:
            groups.setdefault(ix[:common] if align != "none" else (k, ix), []).append((k, ix))
    owner: dict[tuple[int, Index], str] = {}
    load: dict[str, int] = {}
    apart: list[list[tuple[int, Index]]] = []
    for group in groups.values():
        on = set.intersection(*(set(who_has[held[k][ix].key]) for k, ix in group))
        if on:
            # A group held in several places (replicated) goes to the holder with the fewest
            # groups so far, so that replicas spread the job instead of piling it on one worker.
            w = min(on, key=lambda h: (load.get(h, 0), h))
            load[w] = load.get(w, 0) + 1
            owner.update({b: w for b in group})
        else:
            apart.append(group)
    if apart and align == "error":
        k0, ix0 = apart[0][0]
        other = next(
            (k, ix) for k, ix in apart[0] if not set(who_has[held[k][ix].key]) & set(who_has[held[k0][ix0].key])
        )
        raise ValueError(
            f"the inputs are not aligned: {piece(ix0)} of input {k0} is on "
            f"{', '.join(sorted(who_has[held[k0][ix0].key]))} but {piece(other[1])} of input {other[0]} on "
            f"{', '.join(sorted(who_has[held[other[0]][other[1]].key]))}"
            + (f" ({len(apart) - 1} more groups are split)" if len(apart) > 1 else "")
            + "; persist them together, or pass align='move' to have Dask copy them first"
        )
    for group in apart:  # align == "move"
        count: dict[str, int] = {}
        for k, ix in group:
            for w in who_has[held[k][ix].key]:
                count[w] = count.get(w, 0) + 1
        target = min(count, key=lambda w: (-count[w], w))
        copy = {held[k][ix].key: who_has[held[k][ix].key] for k, ix in group if target not in who_has[held[k][ix].key]}
        await _copy_or_fail(client, target, copy, "align the inputs")
        owner.update({b: target for b in group})
    holders = sorted(set(owner.values()))
    if workers is not None:
        outside = sorted((w, b) for b, w in owner.items() if w not in workers)
        if outside:
            w, (k, ix) = outside[0]
            raise ValueError(
                f"{piece(ix)} of input {k} is on {w}, which is not one of workers= (the members must "
                "include every worker holding the inputs)"
            )
        members = list(dict.fromkeys(workers))
    elif n is not None:
        if n < len(holders):
            raise ValueError(f"n={n} is fewer than the {len(holders)} workers holding the inputs")
        everyone = sorted((await client.scheduler.identity())["workers"])
        extra = [w for w in everyone if w not in holders][: n - len(holders)]
        if len(holders) + len(extra) < n:
            raise ValueError(f"n={n} members asked for, but the cluster has {len(everyone)} workers")
        members = holders + extra
    else:
        members = holders
    final = owner
    if rebalance is not None:
        # Each piece's holders now (replicas count: a piece a target already holds does not move).
        holders_of = {b: set(who_has[held[b[0]][b[1]].key]) | {w} for b, w in owner.items()}
        # Inputs that are not aligned are spread each on its own, so that each is spread.
        parts = (
            [groups] if align != "none" else [{g: v for g, v in groups.items() if g[0] == k} for k in range(len(held))]
        )
        final = {}
        for part in parts:
            final.update(_balanced(part, holders_of, members))
        if rebalance == "mpi":  # the source of a piece its target holds already is the target
            owner = {b: final[b] if final[b] in holders_of[b] else w for b, w in owner.items()}
    holding = set(final.values())
    without = [w for w in members if w not in holding]
    if without and empty == "error":
        raise ValueError(
            f"worker {without[0]} holds nothing of the inputs (empty='error'), nor do {len(without) - 1} more"
            if len(without) > 1
            else f"worker {without[0]} holds nothing of the inputs (empty='error')"
        )
    if rebalance == "dask":
        await _move(client, held, who_has, final)
        owner = final
    if empty == "exclude":  # a member that sends its pieces away (rebalance="mpi") stays
        sources = set(owner.values())
        members = [w for w in members if w in holding or w in sources]
    blocks_of = _per_member(owner, members, len(held))
    return members, blocks_of, _per_member(final, members, len(held)) if final is not owner else None


def _per_member(owner: dict[tuple[int, Index], str], members: list[str], inputs: int) -> dict[str, list[list[Index]]]:
    """{member: [sorted indices of each input]}."""
    out: dict[str, list[list[Index]]] = {w: [[] for _ in range(inputs)] for w in members}
    for (k, ix), w in owner.items():
        out[w][k].append(ix)
    for per_input in out.values():
        for ixs in per_input:
            ixs.sort()
    return out


def _balanced(groups: dict[Any, list[tuple[int, Index]]], holders_of: dict, members: list[str]) -> dict:
    """The pieces spread over ``members``: the groups in index order (row-major) cut into
    contiguous runs whose sizes differ by at most one, each run to the member (not given one yet)
    that holds most of its pieces now (the first such member on a tie), so that as little as can
    be moves. A run is a slab of whole rows of blocks when the other axes have one block each."""
    keys = sorted(groups)
    m = len(members)
    runs = [keys[i * len(keys) // m : (i + 1) * len(keys) // m] for i in range(m)]
    free = list(members)
    final: dict[tuple[int, Index], str] = {}
    for run in sorted(runs, key=len, reverse=True):  # the larger runs choose first
        pieces = [b for g in run for b in groups[g]]
        w = max(free, key=lambda x: (sum(x in holders_of[b] for b in pieces), -free.index(x)))
        free.remove(w)
        final.update({b: w for b in pieces})
    return final


async def _move(client, held, who_has: dict, final: dict) -> None:
    """rebalance="dask": Dask copies each piece to its new member (as rebalance does)."""
    to: dict[str, dict] = {}
    for b, w in final.items():
        key = held[b[0]][b[1]].key
        if w not in who_has[key]:
            to.setdefault(w, {})[key] = who_has[key]
    for target, copy in sorted(to.items()):
        await _copy_or_fail(client, target, copy, "rebalance the inputs")


async def _copy_or_fail(client, target: str, who_has: dict, why: str) -> None:
    """Dask copies keys to one worker, or the call fails saying so (nothing of the job has run)."""
    failed = await client._run_on_scheduler(_copy_to, target, who_has)
    if failed:
        raise MPIJobError(f"Dask could not copy {len(failed)} blocks to {target} to {why}; call again")


async def _copy_to(target: str, who_has: dict, dask_scheduler=None) -> list:
    """On the scheduler: Dask's own peer-to-peer copy of keys to one worker (as rebalance does)."""
    assert dask_scheduler is not None
    return list(await dask_scheduler.gather_on_worker(target, who_has))


async def _gone(client, members: list[str]) -> list[str]:
    try:
        now = (await client.scheduler.identity())["workers"]
    except Exception:  # noqa: BLE001
        return []
    return [w for w in members if w not in now]


def _holder_gone(
    w: str, blocks_of: dict, said: str = "", job_id: str = "", piece: Callable[[Index], str] = _block
) -> MPIJobError:
    return MPIJobError(
        f"worker {w}, which held {_blocks_said(blocks_of[w], piece)}, left the cluster "
        f"before the job started{said}; the inputs are still in the cluster (Dask keeps or recomputes what "
        "it held): call again",
        job_id=job_id,
        worker=w,
        kind=Failure.MEMBER_LOST,
        lost_workers=[w],
    )


def _few(sizes: tuple) -> str:
    return str(sizes) if len(sizes) <= 4 else f"({', '.join(map(str, sizes[:3]))}, ... {len(sizes)} blocks)"


def _blocks_said(per_input: list[list[Index]], piece: Callable[[Index], str] = _block) -> str:
    def few(ixs: list[Index]) -> str:
        more = len(ixs) - 3
        return ", ".join(piece(ix) for ix in ixs[:3]) + (f" and {more} more" if more > 0 else "")

    return "; ".join(f"{few(ixs)} of input {k}" for k, ixs in enumerate(per_input) if ixs)


async def _output(client, job, futures: list, out: dict, out_name: str):
    """The ranks' output blocks as a dask array: checked against each other, each block a future
    made on its rank's worker."""
    import dask.array as da
    import numpy as np

    members = job.members
    metas = await client._gather(
        submit_ranks(
            client,
            [
                (f"{out_name}-meta-{m['rank']}", m["workerId"], Call(f"{MEMBER}:output_meta"), (f,))
                for m, f in zip(members, futures)
            ],
        )
    )
    chunks = out["chunks"]
    grid = tuple(len(c) for c in chunks)

    def fail(text: str, rank: int | None = None) -> MPIJobError:
        return MPIJobError(text, job_id=job.id, rank=rank, worker=None if rank is None else members[rank]["workerId"])

    made: dict[Index, int] = {}
    for r, meta in enumerate(metas):
        for ix in meta:
            if ix in made:
                raise fail(f"ranks {made[ix]} and {r} both returned output block {show(ix)}", r)
            made[ix] = r
    missing = [ix for ix in np.ndindex(*grid) if ix not in made]
    if missing:
        raise fail(
            f"no rank returned output block{'s' if len(missing) > 1 else ''} {shown(missing)} "
            f"of the output's {grid} blocks"
        )
    first = min(made)
    dtype = out["dtype"] if out["dtype"] is not None else np.dtype(metas[made[first]][first][1])
    for ix, r in sorted(made.items()):
        if np.dtype(metas[r][ix][1]) != dtype:
            raise fail(
                f"rank {r} returned output block {show(ix)} of dtype {metas[r][ix][1]}, but block {show(first)} "
                f"is {dtype}: the blocks of an array share one dtype (dtype= checks it on each rank)",
                r,
            )
    sizes: list[list[int | None]] = [[None] * g for g in grid]
    seen_at: list[list[Index | None]] = [[None] * g for g in grid]
    for ix, r in sorted(made.items()):
        shape = metas[r][ix][0]
        for axis, j in enumerate(ix):
            if sizes[axis][j] is None:
                sizes[axis][j], seen_at[axis][j] = shape[axis], ix
            elif sizes[axis][j] != shape[axis]:
                raise fail(
                    f"rank {r} returned output block {show(ix)} of {shape[axis]} along axis {axis}, but block "
                    f"{show(seen_at[axis][j] or ())} of the same column of blocks has {sizes[axis][j]}",
                    r,
                )
    # One future per block, keyed as the array's own block, computed where its rank's output is.
    keys = {ix: (out_name, *ix) for ix in made}
    blocks = submit_ranks(
        client,
        [(keys[ix], members[r]["workerId"], operator.getitem, (futures[r], ix)) for ix, r in sorted(made.items())],
    )
    dsk = {keys[ix]: f for ix, f in zip(sorted(made), blocks)}
    final = tuple(tuple(int(s) for s in axis) for axis in sizes)  # type: ignore[arg-type]
    return da.Array(dsk, out_name, final, dtype=dtype, meta=np.empty((0,) * len(grid), dtype=dtype))


def map_partitions_mpi(
    fn: Callable,
    *frames,
    meta: Any = None,
    divisions: Any = "same",
    empty: str = "include",
    align: str = "error",
    rebalance: str | None = None,
    client=None,
    n: int | None = None,
    workers: list[str] | None = None,
    impl: str | None = None,
    mode: str | None = None,
    timeout: float | None = None,
    wiring_timeout: float | None = None,
    name: str | None = None,
    retries: int = 0,
    **kwargs,
):
    """map_blocks_mpi for dask dataframes and series: runs ``fn(comm, *parts, **kwargs)`` as one
    MPI job over the workers holding the partitions of ``frames``, with one
    :class:`dask_pmix.blocks.Partitions` per input (``Partition(number, division, data)``, the
    number from the partition's key, ``division`` its ``(lo, hi)`` or ``(None, None)`` when the
    divisions are unknown, and the frame's ``npartitions``, ``divisions``, ``meta`` and the
    ``layout``). ``fn`` returns ``{partition number: frame}``. The output has the first input's
    partitions (each rank returns those it holds) and divisions (``divisions="same"``), unknown
    divisions (``None``), or the divisions given (then ``npartitions = len(divisions) - 1`` and
    every partition comes from exactly one rank). ``meta=None`` takes the first partition's
    columns and dtypes; every partition must match them. Aligned inputs have the same number of
    partitions (and the same divisions where both are known); ``empty``, ``align``,
    ``rebalance``, members, failures and ``retries`` are as in map_blocks_mpi."""
    import dask.dataframe as dd
    from distributed import default_client

    if not frames:
        raise TypeError("map_partitions_mpi needs at least one dask dataframe or series")
    for k, f in enumerate(frames):
        if not isinstance(f, (dd.DataFrame, dd.Series)):
            raise TypeError(
                f"argument {k + 1} of map_partitions_mpi is a {type(f).__name__}, not a dask dataframe or series "
                "(pass other arguments by keyword)"
            )
    if "local" in kwargs:  # the rank's pieces travel as local= (run_mpi's)
        raise TypeError("map_blocks_mpi and map_partitions_mpi pass fn no keyword 'local': rename it")
    if empty not in EMPTY:
        raise ValueError(f"empty must be 'include', 'exclude' or 'error', not {empty!r}")
    if align not in ALIGN:
        raise ValueError(f"align must be 'error', 'move' or 'none', not {align!r}")
    if rebalance not in REBALANCE:
        raise ValueError(f"rebalance must be None, 'dask' or 'mpi', not {rebalance!r}")
    first = frames[0]
    if align != "none":
        for k, f in enumerate(frames[1:], 1):
            if f.npartitions != first.npartitions:
                raise ValueError(
                    f"inputs 0 and {k} have {first.npartitions} and {f.npartitions} partitions: repartition one "
                    "like the other, or pass align='none' if their partitions are not meant to meet"
                )
            if first.known_divisions and f.known_divisions and tuple(f.divisions) != tuple(first.divisions):
                raise ValueError(
                    f"inputs 0 and {k} have different divisions: repartition one like the other "
                    "(divisions=x.divisions), or pass align='none'"
                )
    if isinstance(divisions, str) and divisions == "same":
        out_divisions = tuple(first.divisions)
    elif divisions is None:
        out_divisions = (None,) * (first.npartitions + 1)
    elif isinstance(divisions, (tuple, list)) and len(divisions) >= 2:
        out_divisions = tuple(divisions)
    else:
        raise ValueError(f"divisions must be 'same', None or a tuple of at least 2 boundaries, not {divisions!r}")
    if meta is not None:
        from dask.dataframe.utils import make_meta

        meta = make_meta(meta)
    nparts = len(out_divisions) - 1
    out = {"npartitions": nparts, "meta": meta, "follow": nparts == first.npartitions}
    _check_request(n, workers, mode, impl, timeout, wiring_timeout)
    retries = check_retries(retries)
    client = client or default_client()
    from dask.utils import funcname

    out_name = name or f"{funcname(fn)}-mpi-{uuid.uuid4().hex}"
    held = _persisted(client, frames)
    fallbacks: list = []
    options = {"impl": impl, "mode": mode, "timeout": timeout, "wiring_timeout": wiring_timeout}

    async def attempt(labels: dict | None):
        members, blocks_of, targets_of = await _place(client, 1, held, align, empty, workers, n, rebalance, _partition)
        spec = {
            "inputs": [
                {"name": f._name, "npartitions": f.npartitions, "divisions": tuple(f.divisions), "meta": f._meta}
                for f in frames
            ],
            "out": out,
        }
        job, futures = await _run_job(
            client,
            f"{MEMBER}:rank_partitions",
            fn,
            spec,
            kwargs,
            held,
            members,
            blocks_of,
            targets_of,
            fallbacks,
            {**options, "labels": labels},
            _partition,
        )
        return await _frame_output(client, job, futures, out, out_divisions, out_name)

    async def run():
        return await with_retries(client, retries, attempt, settle_with=_settler(client))

    return _sync(client, fallbacks, run)


def _same_kind(a, b) -> bool:
    """Whether two empty frames have the same type, columns and dtypes (a series: dtype, name)."""
    if type(a) is not type(b):
        return False
    if hasattr(a, "columns"):
        return list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes)
    return a.dtype == b.dtype and a.name == b.name


async def _frame_output(client, job, futures: list, out: dict, divisions: tuple, out_name: str):
    from dask.dataframe.dask_expr import from_graph

    members = job.members
    metas = await client._gather(
        submit_ranks(
            client,
            [
                (f"{out_name}-meta-{m['rank']}", m["workerId"], Call(f"{MEMBER}:partition_meta"), (f,))
                for m, f in zip(members, futures)
            ],
        )
    )

    def fail(text: str, rank: int | None = None) -> MPIJobError:
        return MPIJobError(text, job_id=job.id, rank=rank, worker=None if rank is None else members[rank]["workerId"])

    made: dict[int, int] = {}
    for r, meta in enumerate(metas):
        for i in meta:
            if i in made:
                raise fail(f"ranks {made[i]} and {r} both returned output partition {i}", r)
            made[i] = r
    missing = [i for i in range(out["npartitions"]) if i not in made]
    if missing:
        raise fail(
            f"no rank returned output partition{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing[:4]))}{' and more' if len(missing) > 4 else ''} of {out['npartitions']}"
        )
    meta = out["meta"] if out["meta"] is not None else metas[made[0]][0][1]
    for i, r in sorted(made.items()):
        if not _same_kind(metas[r][i][1], meta):
            raise fail(
                f"rank {r} returned output partition {i} with other columns or dtypes than "
                f"{'meta' if out['meta'] is not None else 'partition 0'}",
                r,
            )
    keys = {i: (out_name, i) for i in made}
    parts = submit_ranks(
        client,
        [(keys[i], members[r]["workerId"], operator.getitem, (futures[r], i)) for i, r in sorted(made.items())],
    )
    layer = {keys[i]: f for i, f in zip(sorted(made), parts)}
    return from_graph(layer, meta, divisions, [keys[i] for i in sorted(made)], out_name)
