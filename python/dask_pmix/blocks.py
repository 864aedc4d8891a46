"""What a rank of map_blocks_mpi sees of a Dask array: its own blocks, each with its block index
and global offset, the array's global metadata, and the layout (which rank holds which blocks),
the same on every rank. Built by the client (dask_pmix.client.collections) and handed to ``fn``
by the member (dask_pmix.member.collections); shared because both name these types. No import of
numpy at load time: ``import dask_pmix`` stays cheap."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

Index = tuple[int, ...]


def block_starts(chunks: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """For each axis, the global start of each block along it (cumulative sums of ``chunks``)."""
    out = []
    for sizes in chunks:
        starts, at = [], 0.0
        for s in sizes:
            starts.append(int(at) if math.isfinite(at) else at)
            at += s
        out.append(tuple(starts))
    return tuple(out)


def show(index: Index) -> str:
    """A block index as Dask writes it: (1, 0); a 1-D one as (3,)."""
    return "(" + ", ".join(str(i) for i in index) + ("," if len(index) == 1 else "") + ")"


def shown(indices: Sequence[Index], most: int = 4) -> str:
    """A few block indices in words, with how many more there are."""
    parts = [show(i) for i in list(indices)[:most]]
    more = len(indices) - most
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


class Layout:
    """Which rank holds which blocks of each input, identical on every rank.

    ``layout.blocks(rank, input=0)`` is the block indices rank ``rank`` holds of input ``input``
    (in index order), ``layout.rank_of(index, input=0)`` the rank that holds a block, and
    ``layout.workers[rank]`` that rank's worker."""

    __slots__ = ("_blocks", "_owner", "workers")

    def __init__(self, blocks: Sequence[Sequence[Sequence[Index]]], workers: Sequence[str]):
        # blocks[rank][input] = indices
        self._blocks = tuple(tuple(tuple(sorted(tuple(i) for i in per_input)) for per_input in r) for r in blocks)
        self.workers = tuple(workers)
        self._owner: dict[tuple[int, Index], int] = {}
        for rank, per_rank in enumerate(self._blocks):
            for k, indices in enumerate(per_rank):
                for index in indices:
                    self._owner[(k, index)] = rank

    @property
    def size(self) -> int:
        return len(self._blocks)

    def blocks(self, rank: int, input: int = 0) -> tuple[Index, ...]:
        return self._blocks[rank][input]

    def rank_of(self, index: Index | int, input: int = 0) -> int:
        key = (input, (index,) if isinstance(index, int) else tuple(index))
        if key not in self._owner:
            raise KeyError(f"input {input} has no block {show(key[1])}")
        return self._owner[key]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and (self._blocks, self.workers) == (other._blocks, other.workers)

    def __hash__(self) -> int:
        return hash((self._blocks, self.workers))

    def __repr__(self) -> str:
        ranks = "; ".join(
            f"rank {r}: " + " | ".join(shown(ix, 3) or "-" for ix in per) for r, per in enumerate(self._blocks)
        )
        return f"Layout({ranks})"

    def __reduce__(self):
        return (Layout, (self._blocks, self.workers))


@dataclass(frozen=True)
class Block:
    """One block of an input on this rank: its block index (from its key), its global offset
    (the index of its first element in the whole array), and its data."""

    index: Index
    offset: tuple[int, ...]
    data: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def slices(self) -> tuple[slice, ...]:
        """Where the block sits in the whole array: ``whole[block.slices] == block.data``."""
        return tuple(slice(o, o + s) for o, s in zip(self.offset, self.shape))


class Slab(NamedTuple):
    """A contiguous run of blocks as one array, with the global offset of its first element."""

    data: Any
    offset: tuple[int, ...]


class Blocks(Sequence[Block]):
    """One input's blocks on this rank, in block-index order, with the array's global metadata:
    ``shape``, ``chunks``, ``dtype``, ``numblocks``, ``name`` (the key name of the array),
    ``input`` (its position among map_blocks_mpi's arrays), ``rank`` and ``layout``.
    ``blocks[i]`` is the i-th local block; ``blocks.get((1, 0))`` the block of that index, or
    None when another rank holds it."""

    def __init__(
        self,
        blocks: Sequence[Block],
        *,
        name: str,
        shape: tuple[int, ...],
        chunks: tuple[tuple[int, ...], ...],
        dtype: Any,
        input: int,
        rank: int,
        layout: Layout,
    ):
        self._blocks = tuple(sorted(blocks, key=lambda b: b.index))
        self._by_index = {b.index: b for b in self._blocks}
        self.name = name
        self.shape = tuple(shape)
        self.chunks = tuple(tuple(c) for c in chunks)
        self.dtype = dtype
        self.input = input
        self.rank = rank
        self.layout = layout

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numblocks(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.chunks)

    @property
    def indices(self) -> tuple[Index, ...]:
        return tuple(b.index for b in self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[Block]:
        return iter(self._blocks)

    def __getitem__(self, i):
        return self._blocks[i]

    def get(self, index: Index | int) -> Block | None:
        return self._by_index.get((index,) if isinstance(index, int) else tuple(index))

    def __repr__(self) -> str:
        return (
            f"Blocks(input {self.input} {self.name!r}, rank {self.rank}: {shown(self.indices) or 'none'} of "
            f"{self.numblocks}, shape {self.shape}, dtype {self.dtype})"
        )

    def contiguous(self, axis: int | None = None) -> Slab:
        """This rank's blocks as one array and its global offset, when they form one box of the
        block grid (every block between the first and the last along each axis is here). With
        ``axis``, the box must also span the whole array along every other axis: a slab split
        along ``axis``, as Heat (``ht.array(slab.data, is_split=axis)``) and mpi4py-fft take it.
        Raises ValueError saying which block is missing (and where it is) or which axis is not
        spanned; a rank with no blocks gets an empty slab (size 0 along ``axis``) at offset 0."""
        import numpy as np

        if axis is not None and not -self.ndim <= axis < self.ndim:
            raise ValueError(f"axis {axis} is out of range for a {self.ndim}-D array")
        if axis is not None:
            axis %= self.ndim
        if not self._blocks:
            if axis is None:
                raise ValueError(f"rank {self.rank} holds no blocks of input {self.input}: there is no run to join")
            shape = tuple(0 if k == axis else n for k, n in enumerate(self.shape))
            return Slab(np.empty(shape, dtype=self.dtype), (0,) * self.ndim)
        lo = tuple(min(i[k] for i in self.indices) for k in range(self.ndim))
        hi = tuple(max(i[k] for i in self.indices) for k in range(self.ndim))
        if axis is not None:
            for k in range(self.ndim):
                if k != axis and (lo[k], hi[k]) != (0, self.numblocks[k] - 1):
                    raise ValueError(
                        f"the blocks of input {self.input} on rank {self.rank} are not a slab along axis "
                        f"{axis}: along axis {k} they cover blocks {lo[k]} to {hi[k]} of {self.numblocks[k]}"
                    )
        box = list(np.ndindex(*(h - low + 1 for low, h in zip(lo, hi))))
        for rel in box:
            index = tuple(low + r for low, r in zip(lo, rel))
            if index not in self._by_index:
                elsewhere = self.layout.rank_of(index, self.input)
                raise ValueError(
                    f"the blocks of input {self.input} on rank {self.rank} are not contiguous: "
                    f"{show(lo)} and {show(hi)} are here, but {show(index)} between them is on rank {elsewhere}"
                )

        def nest(prefix: tuple[int, ...]) -> Any:
            k = len(prefix)
            if k == self.ndim:
                return self._by_index[prefix].data
            return [nest((*prefix, i)) for i in range(lo[k], hi[k] + 1)]

        return Slab(np.block(nest(())), self._by_index[lo].offset)


@dataclass(frozen=True)
class Partition:
    """One partition of a dask dataframe or series on this rank: its number (from its key), its
    division ``(lo, hi)`` (``(None, None)`` when the frame's divisions are unknown), its data."""

    number: int
    division: tuple[Any, Any]
    data: Any


class Partitions(Sequence[Partition]):
    """One input frame's partitions on this rank, in partition order, with the frame's
    ``npartitions``, ``divisions``, ``known_divisions``, ``meta`` (an empty frame of its columns
    and dtypes), ``name``, ``input``, ``rank`` and ``layout`` (partition ``i`` is block ``(i,)``
    there). ``parts.get(i)`` is partition ``i``, or None when another rank holds it."""

    def __init__(
        self,
        parts: Sequence[Partition],
        *,
        name: str,
        npartitions: int,
        divisions: tuple,
        meta: Any,
        input: int,
        rank: int,
        layout: Layout,
    ):
        self._parts = tuple(sorted(parts, key=lambda p: p.number))
        self._by_number = {p.number: p for p in self._parts}
        self.name = name
        self.npartitions = npartitions
        self.divisions = tuple(divisions)
        self.meta = meta
        self.input = input
        self.rank = rank
        self.layout = layout

    @property
    def known_divisions(self) -> bool:
        return len(self.divisions) > 0 and self.divisions[0] is not None

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(p.number for p in self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __iter__(self) -> Iterator[Partition]:
        return iter(self._parts)

    def __getitem__(self, i):
        return self._parts[i]

    def get(self, number: int) -> Partition | None:
        return self._by_number.get(number)

    def concat(self) -> Any:
        """This rank's partitions as one frame, in partition order (``meta`` when it has none)."""
        import pandas as pd

        return pd.concat([p.data for p in self._parts]) if self._parts else self.meta

    def __repr__(self) -> str:
        return (
            f"Partitions(input {self.input} {self.name!r}, rank {self.rank}: {list(self.numbers)} of "
            f"{self.npartitions}, divisions {'known' if self.known_divisions else 'unknown'})"
        )
