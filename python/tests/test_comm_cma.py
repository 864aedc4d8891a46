"""The single-copy path of tcp+mpi:// (dask_pmix.comm.cma, held): a receiver copies large frames
straight out of the sender's memory, the sender keeps them until the receiver has copied them (for
a while even after it closed the connection), and a receiver that copies too late gets an error,
never other bytes. Two real tcp+mpi:// connections in this process, given
the route that hello.py negotiates between workers of one host (test_comm_cluster runs the
negotiation itself between real workers)."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import numpy as np
import pytest
from distributed.comm import connect, listen
from distributed.protocol import to_serialize

from dask_pmix.comm import cma, framing, held, hello, tcpmpi
from dask_pmix.comm.paths import Path

pytestmark = pytest.mark.skipif(not cma.available(), reason="no process_vm_readv here")


def _child_with(data: bytes):
    """A forked process holding data at the address it reports."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        buf = bytearray(data)
        os.write(w, str(cma.address(buf)).encode())
        time.sleep(30)
        os._exit(0)
    os.close(w)
    addr = int(os.read(r, 64))
    os.close(r)
    return pid, addr


def test_a_copy_out_of_another_process_has_its_bytes_and_a_dead_one_fails():
    data = np.random.default_rng(3).integers(0, 255, 5 << 20, "u1").tobytes()
    pid, addr = _child_with(data)
    try:
        # several frames, and more of them than one call of the kernel takes
        sizes = [1, 4095, 1 << 20] + [1000] * 1500
        bufs = [bytearray(n) for n in sizes]
        offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        cma.read(pid, [memoryview(b) for b in bufs], [addr + o for o in offsets])
        assert b"".join(bufs) == data[: sum(sizes)]
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    with pytest.raises(cma.CopyError) as e:
        cma.read(pid, [memoryview(bytearray(10))], [addr])
    assert "No such process" in str(e.value)
    with pytest.raises(ValueError, match="writable"):
        cma.read(os.getpid(), [memoryview(b"abc")], [addr])


def test_the_probe_proves_the_copy_works():
    nonce = os.urandom(16)
    probe = bytearray(nonce)
    assert hello._probed({"pid": os.getpid(), "probe": cma.address(probe), "nonce": nonce})
    # another nonce at that address, a dead process, no probe: no single copy
    assert not hello._probed({"pid": os.getpid(), "probe": cma.address(probe), "nonce": os.urandom(16)})
    pid, addr = _child_with(nonce)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert not hello._probed({"pid": pid, "probe": addr, "nonce": nonce})
    assert not hello._probed({"pid": os.getpid(), "nonce": nonce})


ROUTE = hello.CopyRoute(Path("cma", 1 << 20), os.getpid())


async def _pair():
    """(connector's comm, listener's comm) of one tcp+mpi:// connection, with a single-copy route."""
    accepted: asyncio.Queue = asyncio.Queue()
    listener = await listen("tcp+mpi://127.0.0.1", accepted.put)
    await listener.start()
    a = await connect(listener.contact_address)
    b = await asyncio.wait_for(accepted.get(), 10)
    listener.stop()
    for c in (a, b):
        c._use(ROUTE)
    return a, b


def test_large_frames_are_copied_and_released_when_acknowledged():
    async def main():
        a, b = await _pair()
        x = np.random.default_rng(5).integers(0, 255, 8 << 20, "u1")
        await a.write({"x": to_serialize(x), "small": to_serialize(np.arange(10))})
        assert len(a._held) == 1 and a._held.nbytes >= x.nbytes  # until b has copied it
        got = await b.read()
        assert (got["x"] == x).all() and (got["small"] == np.arange(10)).all()
        await b.write("OK")  # b's reply: a reads b's acknowledgement first
        assert await a.read() == "OK"
        assert len(a._held) == 0 and a._held.nbytes == 0
        assert a.transport == b.transport == "cma"
        slot_free = len(held.guards()._free)
        await a.write(to_serialize(x))
        assert len(held.guards()._free) == slot_free - 1  # a guard per held message
        await b.read()
        await b.write("OK")
        await a.read()
        assert len(held.guards()._free) == slot_free
        await a.close()
        await b.close()

    asyncio.run(main())


def test_frames_past_the_bound_go_in_the_stream(monkeypatch):
    monkeypatch.setattr(tcpmpi, "HOLD_MAX", 4 << 20)

    async def main():
        a, b = await _pair()
        xs = [np.full(3 << 20, i, "u1") for i in range(3)]
        for x in xs:  # b does not read yet: a holds the first two, the third goes in the stream
            await a.write(to_serialize(x))
        assert len(a._held) == 2
        assert a._held.nbytes >= 6 << 20
        for x in xs:
            assert (await b.read() == x).all()
        await a.close()
        await b.close()

    asyncio.run(main())


def _close_then_read(seed, pause):
    """a writes 16 MiB and closes at once (tcp://'s close would let the frames go); b reads
    `pause` s later, with the memory freed meanwhile reused; returns what b's read gave."""

    async def main():
        a, b = await _pair()
        await a.write({"x": to_serialize(np.random.default_rng(seed).integers(0, 255, 16 << 20, "u1"))})
        await a.close()
        gc.collect()
        await asyncio.sleep(pause)
        junk = [np.full(16 << 20, 1, "u1") for _ in range(4)]  # memory let go is reused here
        try:
            got = await b.read()
        except Exception as e:  # noqa: BLE001 - what it raised is the result
            return e
        finally:
            await b.close()
            del junk
        return got

    return asyncio.run(main())


def test_a_sender_that_closes_first_keeps_the_frames_until_they_are_copied():
    got = _close_then_read(7, 0.2)
    assert (got["x"] == np.random.default_rng(7).integers(0, 255, 16 << 20, "u1")).all()


def test_a_copy_after_the_sender_let_the_frames_go_fails_and_never_gives_other_bytes(monkeypatch):
    monkeypatch.setattr(held, "LINGER", 0.05)
    got = _close_then_read(9, 0.3)
    assert isinstance(got, Exception) and "let its frames go before they were copied" in str(got), got


def test_the_block_names_where_each_copied_frame_lies():
    frames = [b"head", memoryview(bytearray(2 << 20)), memoryview(bytearray(3 << 20))]
    sizes = [len(frames[0]), 2 << 20, 3 << 20]
    where = framing.placement(sizes, 1 << 20, framing.CMA)
    assert where == [framing.INSIDE, framing.CMA, framing.CMA]
    addrs = [cma.address(f) for f in frames[1:]]
    block = framing.pack_block(frames, sizes, where, framing.joined(frames, where), [1234, 5, *addrs])
    (n,) = framing.LENGTH.unpack_from(block, 0)
    _, where2, _, inside, addrs2 = framing.parse_block(memoryview(block)[framing.LENGTH.size : framing.LENGTH.size + n])
    assert where2 == where and bytes(inside[0]) == b"head" and addrs2 == [1234, 5, *addrs]
    # an acknowledgement is a bare length prefix with ACK set, never a block's length
    (ack,) = framing.LENGTH.unpack(framing.ACK_PREFIX)
    assert ack & framing.ACK and ack == framing.ACK
