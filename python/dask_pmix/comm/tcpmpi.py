"""The tcp+mpi:// scheme: Dask connections that are TCP connections, whose bulk frames move over
MPI point-to-point when both ends are ranks of the same pool epoch and MPI has a path between them
that beats the TCP stream, or with a single copy out of the sender's memory between ranks of one
host that MPI cannot put in shared memory (paths.py, cma.py).

The TCP connection stays open for the connection's whole life. It carries the negotiation
(hello.py), Dask's handshake, every message's block (framing.py) and so the order of messages;
and it is the connection's lifeline: close() and abort() close it, which the peer sees as on
tcp://, and a peer process that dies has its socket closed by its kernel, which a read waiting for
MPI frames notices (within LIVENESS_POLL) even though MPI alone may never report it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import struct
import time

from distributed.comm.core import CommClosedError
from distributed.comm.tcp import TCP, BaseTCPBackend, TCPConnector, TCPListener, convert_stream_closed_error
from distributed.comm.utils import from_frames, to_frames
from distributed.protocol.utils import host_array
from distributed.utils import ensure_memoryview, nbytes
from tornado.iostream import StreamClosedError

from . import cma, config, framing, held, hello, stats
from .engine import INLINE_RECV_MAX, Transfer

logger = logging.getLogger(__name__)

PREFIX = "tcp+mpi://"
LIVENESS_POLL = 0.25  # how often a read waiting for MPI frames looks at the TCP connection
READ_SLICE = 2**31 - 1  # largest single socket read
_TCP_ESTABLISHED = 1
COPY_INLINE_MAX = 1 << 20  # single copies up to this size run on the event loop; larger in a thread
HOLD_MAX = 1 << 31  # bytes a connection's sender holds for single copies not yet acknowledged


_copier: concurrent.futures.ThreadPoolExecutor | None = None


def _copy_executor() -> concurrent.futures.ThreadPoolExecutor:
    """Where large single copies run, off the event loop (the copy releases the GIL): one thread,
    as one TCP stream is read by one loop."""
    global _copier
    if _copier is None:
        _copier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-pmix-copy")
    return _copier


def _peer_connected(stream) -> bool:
    """Whether the peer still holds its end of the TCP connection (Linux TCP_INFO state; a FIN or
    RST from the peer's kernel moves it out of ESTABLISHED even with unread data in the socket)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_ESTABLISHED
    except (OSError, AttributeError):
        return True  # cannot tell here: rely on MPI's own errors and the TCP read path


async def _read_into(stream, buf: memoryview) -> None:
    """Fills buf from the stream."""
    for start in range(0, buf.nbytes, READ_SLICE):
        chunk = buf[start : start + READ_SLICE]
        got = await stream.read_into(chunk)
        assert got == chunk.nbytes


def _write_after(stream, block: bytes, frames: list, sizes: list, where: list) -> int:
    """The block and the frames that follow it in the stream, queued together and written with one
    call, as distributed's TCP.write does (one write per frame costs a future and a send attempt
    each). Returns the bytes queued."""
    buf = stream._write_buffer
    if buf is None:
        raise StreamClosedError()
    buf.append(block)
    stream._total_write_index += len(block)
    total = len(block)
    for f, n, w in zip(frames, sizes, where):
        if w == framing.AFTER:
            view = ensure_memoryview(f)
            for start in range(0, n, READ_SLICE):  # tornado writes at most a C int at a time
                chunk = view[start : start + READ_SLICE]
                buf.append(chunk)
                stream._total_write_index += chunk.nbytes
            total += n
    stream.write(b"")
    return total


def _retrieved(fut) -> None:
    if not fut.cancelled():
        fut.exception()


def _settle_from_thread(loop, fut):
    def done(error):
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(error))

    return done


class TCPMPI(TCP):
    """One Dask connection. Without a route (a peer outside this process's pool epoch, or one that
    MPI reaches no faster than TCP) it is a plain TCP connection with this module's framing; with
    one, frames of at least the path's threshold go over the pair communicator."""

    def __init__(self, stream, local_addr: str, peer_addr: str, deserialize: bool = True):
        super().__init__(stream, local_addr, peer_addr, deserialize)
        self._route = None
        self._torn = False
        self._revisit = None  # connector side: when a TCP connection should negotiate again
        self._ops = 0  # reads and writes in progress
        self._last_op = time.monotonic()
        self._held = held.Held()  # single-copy route: frames the peer has yet to copy
        if hasattr(stream, "_dask_pmix_route"):  # negotiated by the listener before the comm existed
            self._use(stream._dask_pmix_route)

    def _use(self, route, revisit=None) -> None:
        self._route = route
        self._revisit = revisit
        stats.add(self.transport, connections=1)

    IDLE_BEFORE_REVISIT = 1.0

    def closed(self) -> bool:
        """Also True, once, for an idle TCP connection that would now negotiate MPI: Dask's
        connection pool then drops it and opens a new one. Idle: no read or write in progress and
        none for a second (a conversation always has one in progress, but for the instant between
        a write and its reply's read, where no other coroutine can run)."""
        if self._revisit is None:  # every connection but a few TCP ones of a worker joining its pool
            return self._closed
        if (
            not self._closed
            and self._ops == 0
            and time.monotonic() - self._last_op >= self.IDLE_BEFORE_REVISIT
            and self._revisit.due()
        ):
            self._revisit = None
            stats.note("tcp_connections_renegotiated")
            self.abort()
        return self._closed

    def __repr__(self) -> str:  # never the revisiting closed(): a log line must not close a connection
        state = " (closed)" if self._closed else ""
        return f"<{type(self).__name__}{state} {self.name or ''} local={self.local_address} remote={self.peer_address}>"

    @property
    def transport(self) -> str:
        """ "mpi" when this connection's bulk frames go over MPI, "cma" when the receiver copies them
        out of the sender's memory, else "tcp"."""
        route = self._route
        if route is None:
            return "tcp"
        return "cma" if isinstance(route, hello.CopyRoute) else "mpi"

    async def write(self, msg, serializers=None, on_error="message"):
        stream = self.stream
        if stream is None:
            raise CommClosedError()
        self._ops += 1
        try:
            frames = await to_frames(
                msg,
                allow_offload=self.allow_offload,
                serializers=serializers,
                on_error=on_error,
                context={"sender": self.local_info, "recipient": self.remote_info, **self.handshake_options},
            )
            sizes = [nbytes(f) for f in frames]
            route = self._route
            if route is None:
                where = framing.placement(sizes, None)
            elif isinstance(route, hello.CopyRoute):
                # Past the bound (a peer that does not read its replies), the frames go in the stream.
                threshold = route.path.threshold if self._held.nbytes < HOLD_MAX else None
                where = framing.placement(sizes, threshold, framing.CMA)
            else:
                where = framing.placement(sizes, route.path.threshold)
            tcp_bytes = mpi_bytes = copy_bytes = 0
            addresses = None
            try:
                if self.stream is None:
                    raise StreamClosedError()
                if framing.CMA in where:  # held before the block goes: the peer copies when it reads it
                    kept = [ensure_memoryview(f) for f, w in zip(frames, where) if w == framing.CMA]
                    guard = self._held.hold(kept, sum(f.nbytes for f in kept))
                    if guard is None:  # no guard free: in the stream
                        where = [framing.AFTER if w == framing.CMA else w for w in where]
                    else:
                        addresses = [*guard, *(cma.address(f) for f in kept)]
                        copy_bytes = sum(f.nbytes for f in kept)
                if framing.MPI in where:  # posted first: the receiver posts its receive when the block arrives
                    mpi_frames = [ensure_memoryview(f) for f, w in zip(frames, where) if w == framing.MPI]
                    mpi_bytes = sum(f.nbytes for f in mpi_frames)
                    send = Transfer(
                        True,
                        route.comm,
                        route.peer,
                        route.send_tag,
                        mpi_frames,
                        self._sent_callback(asyncio.get_running_loop()),
                    )
                    if not route.engine.post_now(send):
                        route.engine.submit(send)
                block = framing.pack_block(
                    frames, sizes, where, framing.joined(frames, where) if any(where) else None, addresses
                )
                if framing.AFTER in where:
                    tcp_bytes = _write_after(stream, block, frames, sizes, where)
                else:
                    stream.write(block)
                    tcp_bytes = len(block)
            except StreamClosedError as e:
                self.stream = None
                self._closed = True
                self._teardown()
                convert_stream_closed_error(self, e)
            except BaseException:
                self.abort()
                raise
            stats.sent(tcp_bytes, mpi_bytes, copy_bytes)
            return tcp_bytes + mpi_bytes + copy_bytes
        finally:
            self._ops -= 1
            self._last_op = time.monotonic()

    def _sent_callback(self, loop):
        def done(error):
            if error is not None:  # the peer died under an MPI send (Open MPI ft reports it)
                logger.info("%r: MPI send failed: %s", self, error)
                loop.call_soon_threadsafe(self.abort)

        return done

    async def read(self, deserializers=None):
        stream = self.stream
        if stream is None:
            raise CommClosedError()
        self._ops += 1
        transfer = None
        try:
            try:
                (n,) = framing.LENGTH.unpack(await stream.read_bytes(framing.LENGTH.size))
                while n & framing.ACK:  # the peer has copied this end's oldest held message
                    if n != framing.ACK:
                        raise ValueError("tcp+mpi: a malformed acknowledgement")
                    self._held.release()
                    (n,) = framing.LENGTH.unpack(await stream.read_bytes(framing.LENGTH.size))
                block = host_array(n)
                if n <= READ_SLICE:
                    await stream.read_into(block)
                else:
                    await _read_into(stream, block)
                sizes, where, join, inside, addresses = framing.parse_block(block)
                tcp_bytes = framing.LENGTH.size + n
                mpi_bytes = copy_bytes = 0
                if len(inside) == len(sizes):
                    frames = inside
                else:
                    frames = framing.buffers(sizes, where, join, host_array)
                    transfer, arrived = self._post_receives(frames, where)
                    inside_iter = iter(inside)
                    for i, (size, w) in enumerate(zip(sizes, where)):
                        if w == framing.INSIDE:
                            frames[i] = next(inside_iter)
                        elif w == framing.AFTER:
                            await _read_into(stream, frames[i])
                            tcp_bytes += size
                        elif w == framing.MPI:
                            mpi_bytes += size
                        else:
                            copy_bytes += size
                    if transfer is not None:
                        await self._await_mpi(arrived, transfer)
                    if addresses:
                        await self._copy(frames, where, addresses, copy_bytes)
            except (StreamClosedError, OSError) as e:
                if transfer is not None:
                    self._route.engine.cancel(transfer)
                self.stream = None
                self._closed = True
                self._teardown()
                if isinstance(e, CommClosedError):
                    raise
                convert_stream_closed_error(self, e)
            except BaseException:
                if transfer is not None:
                    self._route.engine.cancel(transfer)
                self.abort()
                raise
            stats.received(tcp_bytes, mpi_bytes, copy_bytes)
            try:
                return await from_frames(
                    frames, deserialize=self.deserialize, deserializers=deserializers, allow_offload=self.allow_offload
                )
            except EOFError:
                self.abort()
                raise CommClosedError("aborted stream on truncated data") from None
        finally:
            self._ops -= 1
            self._last_op = time.monotonic()

    async def _copy(self, frames, where, addresses, nbytes_) -> None:
        """Copies a message's CMA frames out of the sender's memory, then lets it release them."""
        route = self._route
        if not isinstance(route, hello.CopyRoute):
            raise ValueError("tcp+mpi: the peer sent single-copy frames on a connection without that route")
        bufs = [f for f, w in zip(frames, where) if w == framing.CMA]
        guard, token, places = addresses[0], addresses[1], addresses[2:]
        if len(bufs) != len(places):
            raise ValueError("tcp+mpi: a block's single-copy addresses do not match its frames")
        pid = route.peer_pid
        try:
            if nbytes_ <= COPY_INLINE_MAX:
                cma.read(pid, bufs, places)
            else:
                await asyncio.get_running_loop().run_in_executor(_copy_executor(), cma.read, pid, bufs, places)
            held_all_along = held.still_held(pid, guard, token)
        except cma.CopyError as e:
            # The sender died (or its memory went), which the connection's end reports to Dask.
            raise CommClosedError(f"in {self!r}: the single copy from the peer failed: {e}") from e
        if not held_all_along:
            raise CommClosedError(
                f"in {self!r}: the peer let its frames go before they were copied (it closed the "
                f"connection {held.LINGER:g} s or more before this end read them)"
            )
        stream = self.stream
        if self._torn or stream is None:
            raise CommClosedError(f"in {self!r}: closed here while copying frames")
        try:
            stream.write(framing.ACK_PREFIX).add_done_callback(_retrieved)
        except StreamClosedError:
            pass  # the message is whole; the sender learns of the close instead

    def _post_receives(self, frames, where):
        """The receives of a message's MPI frames (fresh buffers), posted at once (the sender
        posted its sends before it wrote the block)."""
        bufs = [f for f, w in zip(frames, where) if w == framing.MPI]
        if not bufs:
            return None, None
        route = self._route
        if route is None or isinstance(route, hello.CopyRoute):
            raise ValueError("tcp+mpi: the peer sent MPI frames on a connection without an MPI route")
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()
        transfer = Transfer(False, route.comm, route.peer, route.recv_tag, bufs, _settle_from_thread(loop, arrived))
        if sum(b.nbytes for b in bufs) > INLINE_RECV_MAX or not route.engine.post_now(transfer):
            route.engine.submit(transfer)
        return transfer, arrived

    async def _await_mpi(self, arrived, transfer) -> None:
        """Wait for a message's MPI frames while watching the TCP connection: once the peer has
        closed it, the frames get config "liveness" seconds more, which a clean close needs (its
        sends complete as the receives are posted); a peer on this host whose process has ended
        fails the read at once (Open MPI's shared-memory transport does not report it)."""
        stream = self.stream
        while not arrived.done():
            await asyncio.wait([arrived], timeout=LIVENESS_POLL)
            if arrived.done():
                break
            if self._torn:
                raise CommClosedError(f"in {self!r}: closed while receiving MPI frames")
            if not _peer_connected(stream):
                if self._route is not None and cma.process_gone(self._route.peer_pid):
                    raise CommClosedError(f"in {self!r}: the peer process died with MPI frames in flight")
                grace = config.get("liveness")
                await asyncio.wait([arrived], timeout=grace)
                if not arrived.done():
                    raise CommClosedError(
                        f"in {self!r}: the peer closed the connection or died with MPI frames in flight "
                        f"(nothing arrived for {grace} s after)"
                    )
        error = arrived.result()
        if error is not None:
            raise CommClosedError(f"in {self!r}: MPI receive failed: {error}")

    def _teardown(self) -> None:
        """Once per connection: stray MPI messages on this connection's receive tag get drained, and
        what the peer has not acknowledged copying goes after held.LINGER."""
        if self._torn:
            return
        self._torn = True
        self._held.linger()
        route = self._route
        if route is not None and not isinstance(route, hello.CopyRoute):
            route.engine.drain(route.comm, route.peer, route.recv_tag, config.get("drain"))

    async def close(self):
        self._teardown()
        await super().close()

    def abort(self) -> None:
        self._teardown()
        super().abort()


def _connect_timeout() -> float:
    import dask.config
    from dask.utils import parse_timedelta

    return parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")


class TCPMPIConnector(TCPConnector):
    prefix = PREFIX
    comm_class = TCPMPI

    async def connect(self, address, deserialize=True, **connection_args):
        comm = await super().connect(address, deserialize=deserialize, **connection_args)
        try:
            route, revisit = await hello.offer(comm.stream, _connect_timeout(), config.get("chunk"))
        except StreamClosedError as e:
            comm.abort()
            convert_stream_closed_error(self, e)
        except (hello.HelloError, asyncio.TimeoutError, struct.error, *hello.MALFORMED) as e:
            comm.abort()
            raise OSError(f"tcp+mpi negotiation with {address} failed: {e}") from e
        except BaseException:
            comm.abort()
            raise
        comm._use(route, revisit)
        return comm


class TCPMPIListener(TCPListener):
    prefix = PREFIX
    comm_class = TCPMPI

    async def start(self):
        await super().start()
        _report_metrics(self.comm_handler)

    async def _prepare_stream(self, stream, address):
        try:
            route = await hello.answer(stream, _connect_timeout(), config.get("chunk"))
        except (
            StreamClosedError,
            hello.HelloError,
            asyncio.TimeoutError,
            OSError,
            struct.error,
            *hello.MALFORMED,
        ) as e:
            logger.info("tcp+mpi: connection from %s dropped during the transport negotiation: %s", address, e)
            stream.close()
            return None
        stream._dask_pmix_route = route
        return stream


def _report_metrics(handler) -> None:
    """Workers send their metrics to the scheduler with each heartbeat: add ours."""
    server = getattr(handler, "__self__", None)
    metrics = getattr(server, "metrics", None)
    if isinstance(metrics, dict):
        metrics.setdefault("dask_pmix_comm", lambda worker: stats.comm_stats())


class TCPMPIBackend(BaseTCPBackend):
    _connector_class = TCPMPIConnector
    _listener_class = TCPMPIListener
