"""The member's half of map_blocks_mpi (dask_pmix.client.collections): hands ``fn`` this rank's
blocks of each input, with their indices, offsets and the layout, and checks the output blocks
it returns before they are left on this worker. Runs where the rank runs: the worker's task
thread in process, the child in fork mode."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..blocks import Block, Blocks, Layout, Partition, Partitions, block_starts, show


def rank_blocks(fn: Callable, spec: dict, comm: Any, *args: Any, local: dict, **kwargs: Any) -> dict:
    """Runs ``fn(comm, *blocks, *args, **kwargs)`` with one Blocks per input; returns its output
    blocks, checked, as {block index: array}."""
    rank = comm.rank
    layout: Layout = local["layout"]
    if rank != local["rank"]:  # the layout was made for the rank order the job was created with
        raise RuntimeError(f"this member is rank {rank} of the job, but its blocks were given to rank {local['rank']}")
    inputs = []
    for k, (meta, values) in enumerate(zip(spec["inputs"], exchanged(comm, local))):
        starts = block_starts(meta["chunks"])
        indices = layout.blocks(rank, k)
        blocks = [
            Block(index, tuple(int(starts[a][i]) for a, i in enumerate(index)), value)
            for index, value in zip(indices, values)
        ]
        inputs.append(
            Blocks(
                blocks,
                name=meta["name"],
                shape=meta["shape"],
                chunks=meta["chunks"],
                dtype=meta["dtype"],
                input=k,
                rank=rank,
                layout=layout,
            )
        )
    return check_output(fn(comm, *inputs, *args, **kwargs), spec["out"], rank, layout)


# The tag of rebalance="mpi"'s messages: every one is received before fn runs, so fn's own
# messages, whatever their tags, never meet one.
EXCHANGE_TAG = 27


def exchanged(comm: Any, local: dict) -> list[list[Any]]:
    """This rank's pieces of each input, in the order of ``local["layout"]``. With
    rebalance="mpi" (``local["source"]``, where the pieces are now), the ranks first send each
    piece to the rank the layout gives it: each rank sends its leaving pieces to each rank in
    index order and receives its arriving ones from each rank in the same order (MPI keeps the
    order of messages between two ranks on one tag), all sends posted before any receive waits."""
    source: Layout | None = local.get("source")
    if source is None:
        return local["data"]
    from mpi4py.util import pkl5  # pickle protocol 5: a block's buffer travels out of band, any size

    layout: Layout = local["layout"]
    rank, inputs = comm.rank, len(local["data"])
    have = {(k, ix): v for k in range(inputs) for ix, v in zip(source.blocks(rank, k), local["data"][k])}
    comm = pkl5.Intracomm(comm)
    sends = [
        comm.isend(have[(k, ix)], dest=layout.rank_of(ix, k), tag=EXCHANGE_TAG)
        for k, ix in sorted(have)
        if layout.rank_of(ix, k) != rank
    ]
    arriving = sorted((k, ix) for k in range(inputs) for ix in layout.blocks(rank, k) if (k, ix) not in have)
    for k, ix in arriving:  # in index order overall, so in index order from each sender
        have[(k, ix)] = comm.recv(source=source.rank_of(ix, k), tag=EXCHANGE_TAG)
    for req in sends:
        req.wait()
    return [[have[(k, ix)] for ix in layout.blocks(rank, k)] for k in range(inputs)]


def _index(key: Any, ndim: int) -> tuple[int, ...] | None:
    if isinstance(key, int) and not isinstance(key, bool):
        key = (key,)
    if isinstance(key, tuple) and len(key) == ndim and all(isinstance(i, int) and not isinstance(i, bool) for i in key):
        return tuple(int(i) for i in key)
    return None


def _outputs(value: Any, rank: int, call: str, what: str) -> Mapping:
    """What a rank's function returned, as its outputs by position (None: none), or TypeError."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"rank {rank}'s function returned a {type(value).__name__}; {call}'s function returns its output {what}"
        )
    return value


def check_output(value: Any, out: dict, rank: int, layout: Layout) -> dict:
    """The blocks a rank returned, as {index: array}, or ValueError/TypeError naming the block
    that is not what the output's chunks and dtype say (what this rank alone can tell; the client
    checks that every block came from exactly one rank)."""
    import numpy as np

    value = _outputs(value, rank, "map_blocks_mpi", "blocks as a dict {block index: array}")
    chunks = out["chunks"]
    ndim = len(chunks)
    dtype = None if out["dtype"] is None else np.dtype(out["dtype"])
    blocks: dict[tuple[int, ...], Any] = {}
    for key, data in value.items():
        index = _index(key, ndim)
        if index is None or not all(0 <= i < len(c) for i, c in zip(index, chunks)):
            grid = tuple(len(c) for c in chunks)
            raise ValueError(
                f"rank {rank} returned output block {key!r}, which is not a block index of the output's {grid} blocks"
            )
        if not (hasattr(data, "shape") and hasattr(data, "dtype")):
            data = np.asarray(data)
        want = tuple(c[i] for c, i in zip(chunks, index))
        shape = tuple(data.shape)
        if len(shape) != ndim or any(math.isfinite(w) and w != s for w, s in zip(want, shape)):
            said = tuple("nan" if not math.isfinite(w) else int(w) for w in want)
            raise ValueError(
                f"rank {rank} returned output block {show(index)} of shape {shape}, not {said} as the "
                "output's chunks say"
            )
        if dtype is not None and np.dtype(data.dtype) != dtype:
            raise ValueError(f"rank {rank} returned output block {show(index)} of dtype {data.dtype}, not {dtype}")
        blocks[index] = data
    if out["follow"]:
        # The output's blocks are the first input's: each rank returns those it holds.
        expected = set(layout.blocks(rank, 0))
        missing = sorted(expected - set(blocks))
        if missing:
            raise ValueError(
                f"rank {rank} did not return output block {show(missing[0])}"
                + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                + ": the output follows the first input, and this rank holds that block of it"
            )
        extra = sorted(set(blocks) - expected)
        if extra:
            raise ValueError(
                f"rank {rank} returned output block {show(extra[0])}, which rank {layout.rank_of(extra[0])} "
                "holds of the first input (the output follows it: give chunks= for another layout)"
            )
    return blocks


def output_meta(blocks: dict) -> dict:
    """{index: (shape, dtype)} of a rank's output blocks: what the client needs to build the array."""
    return {index: (tuple(data.shape), data.dtype) for index, data in blocks.items()}


def rank_partitions(fn: Callable, spec: dict, comm: Any, *args: Any, local: dict, **kwargs: Any) -> dict:
    """map_partitions_mpi's rank: ``fn(comm, *parts, *args, **kwargs)`` with one Partitions per
    input; returns its output partitions, checked, as {partition number: frame}."""
    rank = comm.rank
    layout: Layout = local["layout"]
    if rank != local["rank"]:
        raise RuntimeError(
            f"this member is rank {rank} of the job, but its partitions were given to rank {local['rank']}"
        )
    inputs = []
    for k, (meta, values) in enumerate(zip(spec["inputs"], exchanged(comm, local))):
        divisions = meta["divisions"]
        mine = [
            Partition(ix[0], (divisions[ix[0]], divisions[ix[0] + 1]), value)
            for ix, value in zip(layout.blocks(rank, k), values)
        ]
        inputs.append(
            Partitions(
                mine,
                name=meta["name"],
                npartitions=meta["npartitions"],
                divisions=divisions,
                meta=meta["meta"],
                input=k,
                rank=rank,
                layout=layout,
            )
        )
    value = fn(comm, *inputs, *args, **kwargs)
    out = spec["out"]
    value = _outputs(value, rank, "map_partitions_mpi", "partitions as a dict {partition number: frame}")
    parts: dict[int, Any] = {}
    for key, frame in value.items():
        i = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < out["npartitions"]:
            raise ValueError(
                f"rank {rank} returned output partition {key!r}, which is not a partition number below "
                f"{out['npartitions']}"
            )
        if not hasattr(frame, "iloc"):
            raise TypeError(f"rank {rank} returned output partition {i} as a {type(frame).__name__}, not a frame")
        parts[i] = frame
    if out["follow"]:
        expected = {ix[0] for ix in layout.blocks(rank, 0)}
        missing = sorted(expected - set(parts))
        if missing:
            raise ValueError(
                f"rank {rank} did not return output partition {missing[0]}: the output follows the first input, "
                "and this rank holds that partition of it"
            )
        extra = sorted(set(parts) - expected)
        if extra:
            raise ValueError(
                f"rank {rank} returned output partition {extra[0]}, which rank {layout.rank_of(extra[0])} "
                "holds of the first input (give divisions= for another layout)"
            )
    return parts


def partition_meta(parts: dict) -> dict:
    """{number: (rows, empty frame)} of a rank's output partitions."""
    return {i: (len(frame), frame.iloc[:0]) for i, frame in parts.items()}
