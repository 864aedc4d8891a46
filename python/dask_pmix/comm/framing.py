"""How one Dask message (a list of frames from distributed.protocol) travels on a tcp+mpi
connection.

Every message starts in the TCP stream with a block:

    u64 length of what follows in the block
    u32 n, n x u64 frame sizes, n x u8 where each frame goes
    k + 2 x u64 with k frames copied out of the sender's memory (CMA): the address and token of
                their guard (held.py), then the frames' addresses
    the frames that travel inside the block, concatenated

A frame goes INSIDE the block when it is small (one copy is cheaper than another write), AFTER
the block in the TCP stream (in order) when it is large and the connection has no MPI route, or
over MPI when it is at least the path's threshold and the connection has an MPI route: then the
sender posts it before writing the block, and the receiver posts its receive into a fresh buffer
when it reads the block. On a single-copy route (cma.py) such a frame stays where it is: the block
says where it lies in the sender, the receiver copies it into a fresh buffer and answers with an
acknowledgement, a length prefix with ACK set and nothing after it, until which the sender holds the
frame.

Fresh buffers: one per buffer of the sender, as tcp:// does. Dask cuts a large buffer into shards
(distributed.comm.shard, 64 MiB) and joins them again before deserialising, without a copy only
when they are consecutive views of one buffer; frames of two objects must never share one (their
memory is released separately). So the sender marks each frame that is a shard of the same buffer
as the frame before it (JOINED, a bit of its placement byte), and the receiver gives such a run
one buffer, each frame a view of it.

So the TCP stream orders the messages and carries everything small at tcp:// cost, and MPI
carries the bulk without a copy on either side of Python.
"""

from __future__ import annotations

import struct

INSIDE, AFTER, MPI, CMA = 0, 1, 2, 3
JOINED = 0x80  # this frame continues the previous one's buffer (a shard of the same buffer)
INSIDE_MAX = 64 * 1024
LENGTH = struct.Struct("<Q")
ACK = 1 << 63  # a length prefix with this bit: the receiver has copied a message's CMA frames
COUNT = struct.Struct("<I")
ACK_PREFIX = LENGTH.pack(ACK)  # what an acknowledgement is in the stream


def placement(sizes: list, threshold, out=MPI) -> list:
    """Where each frame goes; threshold None when the connection has no route out of the stream,
    out the route's kind (MPI or CMA) for the frames of at least threshold bytes."""
    if max(sizes, default=0) < INSIDE_MAX and (threshold is None or max(sizes, default=0) < threshold):
        return [INSIDE] * len(sizes)
    result = []
    for n in sizes:
        if n < INSIDE_MAX and (threshold is None or n < threshold):
            result.append(INSIDE)
        elif threshold is not None and n >= threshold:
            result.append(out)
        else:
            result.append(AFTER)
    return result


def _base(frame):
    return frame.obj if isinstance(frame, memoryview) else frame


def joined(frames: list, where: list) -> list:
    """Per frame: whether it is a shard of the same buffer as the frame before, both going the
    same way out of the block (AFTER or MPI)."""
    out = [False] * len(frames)
    for i in range(1, len(frames)):
        if where[i] != INSIDE and where[i] == where[i - 1] and _base(frames[i]) is _base(frames[i - 1]):
            out[i] = True
    return out


_SIZES: dict[int, struct.Struct] = {}


def _sizes(n: int) -> struct.Struct:
    st = _SIZES.get(n)
    if st is None:
        st = _SIZES[n] = struct.Struct(f"<{n}Q")
    return st


def pack_block(
    frames: list, sizes: list, where: list, join: list | None = None, addresses: list | None = None
) -> bytes:
    """The length prefix and the block (the inside frames copied in); addresses: with CMA frames,
    their guard's address and token, then theirs in order. On the path of every message: no
    Python-level loop per frame where C can do it (a message costs what it costs on tcp://)."""
    n = len(sizes)
    if not any(where):  # every frame inside (most messages: INSIDE is 0, nothing joined)
        body = b"".join([COUNT.pack(n), _sizes(n).pack(*sizes), bytes(n), *frames])
    else:
        codes = bytes([w | JOINED if j else w for w, j in zip(where, join)] if join and any(join) else where)
        addrs = _sizes(len(addresses)).pack(*addresses) if addresses else b""
        body = b"".join(
            [COUNT.pack(n), _sizes(n).pack(*sizes), codes, addrs, *[f for f, w in zip(frames, where) if w == INSIDE]]
        )
    return LENGTH.pack(len(body)) + body


def parse_block(block: memoryview) -> tuple[list, list, list, list, list]:
    """(sizes, where, joined, inside frames as views of block in order, the CMA frames' guard and
    token and addresses) of a block without its prefix."""
    (n,) = COUNT.unpack_from(block, 0)
    off = COUNT.size
    sizes = list(_sizes(n).unpack_from(block, off))
    off += 8 * n
    codes = bytes(block[off : off + n])
    off += n
    inside: list = []
    addresses: list = []
    if not any(codes):  # every frame inside
        where = [INSIDE] * n
        join = [False] * n
        for size in sizes:
            inside.append(block[off : off + size])
            off += size
    else:
        where = [c & ~JOINED for c in codes]
        join = [bool(c & JOINED) for c in codes]
        if any(w not in (INSIDE, AFTER, MPI, CMA) for w in where):
            raise ValueError("malformed tcp+mpi block: unknown frame placement")
        if any(j and (i == 0 or where[i] == INSIDE or where[i] != where[i - 1]) for i, j in enumerate(join)):
            raise ValueError("malformed tcp+mpi block: a joined frame does not continue the one before")
        k = where.count(CMA) + 2
        if k > 2:
            if off + 8 * k > len(block):
                raise ValueError("malformed tcp+mpi block: frame sizes do not add up")
            addresses = list(_sizes(k).unpack_from(block, off))
            off += 8 * k
        for size, w in zip(sizes, where):
            if w == INSIDE:
                inside.append(block[off : off + size])
                off += size
    if off != len(block):
        raise ValueError("malformed tcp+mpi block: frame sizes do not add up")
    return sizes, where, join, inside, addresses


def buffers(sizes: list, where: list, join: list, host_array) -> list:
    """Fresh receive buffers for the frames going out of the block (None for the inside ones):
    one host_array per run of joined frames, each frame a view of it."""
    out: list = [None] * len(sizes)
    i = 0
    while i < len(sizes):
        if where[i] == INSIDE:
            i += 1
            continue
        j = i + 1
        while j < len(sizes) and join[j]:
            j += 1
        buf = host_array(sum(sizes[i:j]))
        off = 0
        for k in range(i, j):
            out[k] = buf[off : off + sizes[k]]
            off += sizes[k]
        i = j
    return out
