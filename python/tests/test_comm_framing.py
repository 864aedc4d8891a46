"""tcp+mpi:// framing (dask_pmix.comm.framing): where each frame goes, and the receive buffers: the
shards of one sender buffer land in one buffer (Dask joins them without a copy), frames of
different objects never share one."""

from __future__ import annotations

import numpy as np
import pytest
from distributed.protocol import dumps, loads, to_serialize
from distributed.protocol.utils import host_array
from distributed.utils import nbytes

from dask_pmix.comm import framing


def roundtrip(frames, threshold):
    sizes = [nbytes(f) for f in frames]
    where = framing.placement(sizes, threshold)
    block = framing.pack_block(frames, sizes, where, framing.joined(frames, where))
    (n,) = framing.LENGTH.unpack_from(block, 0)
    return sizes, where, framing.parse_block(memoryview(block)[framing.LENGTH.size:framing.LENGTH.size + n])


@pytest.mark.parametrize("threshold", [None, 1 << 20])  # the TCP stream, or MPI
def test_the_shards_of_one_array_share_a_receive_buffer_and_two_arrays_do_not(threshold):
    a, b = np.arange(40 << 20, dtype="u1"), np.ones(3 << 20, dtype="u1")
    frames = dumps({"a": to_serialize(a), "b": to_serialize(b)}, frame_split_size=16 << 20)
    sizes, where, (sizes2, where2, join, inside, _) = roundtrip(frames, threshold)
    assert (sizes2, where2) == (sizes, where)
    big = [i for i, w in enumerate(where) if w != framing.INSIDE]
    assert [sizes[i] for i in big] == [16 << 20, 16 << 20, 8 << 20, 3 << 20]
    assert [join[i] for i in big] == [False, True, True, False]
    bufs = framing.buffers(sizes, where, join, host_array)
    assert bufs[big[0]].obj is bufs[big[1]].obj is bufs[big[2]].obj
    assert bufs[big[3]].obj is not bufs[big[0]].obj
    # what a receiver does: copy each frame into its buffer, keep the inside ones, deserialize
    it = iter(inside)
    got = []
    for f, w, buf in zip(frames, where, bufs):
        if w == framing.INSIDE:
            got.append(next(it))
        else:
            np.frombuffer(buf, "u1")[:] = np.frombuffer(f, "u1")
            got.append(buf)
    out = loads(got)
    assert (out["a"] == a).all() and (out["b"] == b).all()
    # joined without a copy: the array's memory is the receive buffer itself
    assert np.shares_memory(out["a"], np.frombuffer(bufs[big[0]].obj, "u1"))


def test_a_block_whose_joined_frame_continues_nothing_is_refused():
    frames = [b"x" * 10, memoryview(bytearray(1 << 17))]
    sizes = [nbytes(f) for f in frames]
    block = framing.pack_block(frames, sizes, [framing.INSIDE, framing.AFTER], [False, False])
    body = bytearray(block[framing.LENGTH.size:])
    body[framing.COUNT.size + 16 + 1] |= framing.JOINED  # the AFTER frame claims to continue the inside one
    with pytest.raises(ValueError, match="joined frame"):
        framing.parse_block(memoryview(bytes(body)))
