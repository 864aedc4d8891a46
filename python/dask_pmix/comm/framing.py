"""How one Dask message (a list of frames from distributed.protocol) travels on a tcp+mpi
connection.

Every message starts in the TCP stream with a block:

    u64 length of what follows in the block
    u32 n, n x u64 frame sizes, n x u8 where each frame goes
    the frames that travel inside the block, concatenated

A frame goes INSIDE the block when it is small (one copy is cheaper than another write), AFTER
the block in the TCP stream (in order, each read into a buffer of its own so numpy arrays never
share one) when it is large and the connection has no MPI route, or over MPI when it is at least
the MPI threshold and the connection has a route: then the sender posts it before writing the
block, and the receiver posts its receive into a fresh buffer when it reads the block.

So the TCP stream orders the messages and carries everything small at tcp:// cost, and MPI
carries the bulk without a copy on either side of Python.
"""

from __future__ import annotations

import struct

INSIDE, AFTER, MPI = 0, 1, 2
INSIDE_MAX = 64 * 1024
LENGTH = struct.Struct("<Q")
COUNT = struct.Struct("<I")


def placement(sizes: list, mpi_threshold) -> list:
    """Where each frame goes; mpi_threshold None when the connection has no MPI route."""
    if max(sizes, default=0) < INSIDE_MAX and (mpi_threshold is None or max(sizes, default=0) < mpi_threshold):
        return [INSIDE] * len(sizes)
    out = []
    for n in sizes:
        if n < INSIDE_MAX and (mpi_threshold is None or n < mpi_threshold):
            out.append(INSIDE)
        elif mpi_threshold is not None and n >= mpi_threshold:
            out.append(MPI)
        else:
            out.append(AFTER)
    return out


def pack_block(frames: list, sizes: list, where: list) -> bytes:
    """The length prefix and the block (the inside frames copied in)."""
    n = len(sizes)
    parts = [COUNT.pack(n), struct.pack(f"<{n}Q", *sizes), bytes(where)]
    parts.extend(f for f, w in zip(frames, where) if w == INSIDE)
    body = b"".join(parts)
    return LENGTH.pack(len(body)) + body


def parse_block(block: memoryview) -> tuple[list, list, list]:
    """(sizes, where, inside frames as views of block in order) of a block without its prefix."""
    (n,) = COUNT.unpack_from(block, 0)
    off = COUNT.size
    sizes = list(struct.unpack_from(f"<{n}Q", block, off))
    off += 8 * n
    where = list(block[off:off + n])
    off += n
    if any(w not in (INSIDE, AFTER, MPI) for w in where):
        raise ValueError("malformed tcp+mpi block: unknown frame placement")
    inside = []
    for size, w in zip(sizes, where):
        if w == INSIDE:
            inside.append(block[off:off + size])
            off += size
    if off != len(block):
        raise ValueError("malformed tcp+mpi block: frame sizes do not add up")
    return sizes, where, inside
