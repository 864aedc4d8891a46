"""The transport negotiation at the start of every tcp+mpi connection, over its TCP stream, before
Dask's own handshake: does this connection move frames over MPI, on which path (paths.py), over
which pair communicator, and with which tags?

    connector -> listener   {"epoch": E, "rank": r, "local": [...], "fabric": f,
                             "nonce": n, "mac": H(hello | this message)}       ({"epoch": None}: not in a pool)
    listener  -> connector  {"mpi": true, "path": p, "rank": r', "local": [...], "fabric": f',
                             "pairs": [names it holds with r], "tag": t', "nonce": n',
                             "mac": H(answer | this message | n)}
                            or {"mpi": false, "why": ..., "epoch": E' or None, "starting": bool}
    connector -> listener   {"mpi": true, "pair": name, "tag": t, "mac": H(choice | this message | n')}
                            or {"mpi": false, "why": ...}
    listener  -> connector  {"committed": true}   (after an MPI choice: it builds its side too)
    connector -> listener   {"use": "mpi"} once the pair communicator exists here, or {"use": "tcp"}

H is HMAC-SHA256 keyed with the pool epoch's secret, which the sidecar hands only to the epoch's
members, in their join answers (link.PoolLink.secret), over the canonical encoding of the message
without its "mac" (_mac). Without it, any process that reaches a listener could replay a member's
description, get an MPI answer and make the listener build a pair communicator with that member
that the member never calls, so that the real pair fell back to TCP. Now a hello whose MAC is
missing or wrong while it claims the listener's epoch is answered as one from outside the pool
(mpi false, why "unauthenticated", counted as tcp_fallback:unauthenticated, logged without the
secret), before a tag, a reservation or a construction is given to it; a listener whose answer
does not prove the secret gets the same from the connector.

Replay: the hello's MAC proves who made the description, not that it is fresh, and telling a
replayed hello apart in the first message would need a listener challenge first (a round trip
more for every connection) or clocks that agree. So each end puts a fresh nonce in its first
message and the other's next MAC covers it: the listener's answer covers the connector's nonce
(an old answer proves nothing to a new connector) and the connector's choice, after which the
listener commits, covers the listener's (a replayed hello gets an MPI answer at most, and then
nothing: the listener drops the connection at the choice, holding no construction). That is the
same number of messages as before. The messages after the choice travel in the same TCP
connection between two ends that have proved the secret and are not MACed. Between hosts the
hello travels in clear (as Dask's own frames do on tcp://): the secret never does, and the nonces
keep what can be read from being replayed.

The connection waits for the pair communicator's construction for at most PAIR_WAIT: one that
takes longer (a loaded host, or an Open MPI 5.0.x construction that never returns: see
worker/activation.py) goes on in the background, this connection carries its frames in the TCP
stream, and the connector's comm renegotiates once the communicator exists (Revisit). A Dask
transfer never waits for MPI's construction longer than that, and never fails because of it.

Both ends choose the path from the same two descriptions (paths.choose is symmetric), so a pair
without an MPI path is answered at once and stays a plain TCP connection: no pair communicator,
no progress engine. One round trip more than tcp:// for every connection (scheduler and clients
included, whose connections to workers are few and pooled), one and a half between pool ranks
with an MPI path, plus building the pair's communicator the first time two processes meet.
The connector starts its side of that construction as it sends its choice, without waiting for
the listener's: when the connection dies before the listener commits, the construction is
cancelled (pairs.PairRegistry.cancel), as it is when it does not complete within the timeout.

A TCP answer may only be for now: the connector was not in the pool yet but the listener is
(epoch E'), or the listener is still joining ("starting"). The connector's comm then remembers
when to revisit (Revisit): once due, an idle connection reports itself closed, so that Dask's
connection pool opens a new one, which negotiates again (workers join the pool a few seconds
after they start, and Dask keeps its connections).
On the single-copy path ("cma", paths.py) nothing is built: the hello and the answer each carry a
probe, the address in the sender's memory of a copy of its nonce, and each end copies the other's
probe out of its memory (cma.py) before it goes on, so a pair whose kernel forbids the copy (Yama,
another user) stays TCP. The listener answers only an authenticated hello and probes before it
answers; the connector probes the answer, then its choice ({"mpi": true, "path": "cma"}, MACed
over the listener's nonce) ends the negotiation at both ends.

Each message: b"DPMX", a 4-byte length, msgpack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import logging
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ..worker.activation import GATE
from . import cma, stats
from .engine import Engine
from .link import PoolLink, current_link, pool_starting
from .pairs import PairCancelled, peer_index, registry_for
from .paths import Path, choose, describe, why_not

logger = logging.getLogger(__name__)

MAGIC = b"DPMX"
_HEAD = struct.Struct("<4sI")
MAX_HELLO = 1 << 20


class HelloError(ConnectionError):
    """The peer does not speak this negotiation (not a tcp+mpi end), or broke it off."""


# What reading a peer's message with fields of the wrong type raises (a rank that is a list, local
# peers that are a number, ...): the connection is dropped as for any broken negotiation.
MALFORMED = (ValueError, TypeError, KeyError, AttributeError)


REVISIT_AFTER = 2.0  # seconds before asking a listener that was joining its pool again
PAIR_WAIT = 2.0  # seconds a connection waits for its pair communicator before it goes TCP


@dataclass
class Revisit:
    """When a TCP connection may be worth negotiating again."""

    epoch: str | None = None  # once this process is in this epoch
    after: float | None = None  # or after this time.monotonic()
    pair: concurrent.futures.Future | None = None  # or once this pair communicator exists

    def due(self) -> bool:
        if self.pair is not None:
            return self.pair.done() and self.pair.exception() is None
        if self.after is not None:
            return time.monotonic() >= self.after
        link = current_link()
        return link is not None and link.epoch == self.epoch


@dataclass
class Route:
    """Where one connection's MPI frames go: the pair communicator, the peer's rank in it, the
    tag the peer receives on (chosen by the peer), and the tag this end receives on."""

    engine: Engine
    comm: Any
    peer: int
    send_tag: int
    recv_tag: int
    pair: str
    peer_rank: int
    path: Path
    peer_pid: int | None = None  # on the sm path (one host): the peer's process, to tell a death at once


@dataclass
class CopyRoute:
    """A connection whose receiver copies the large frames out of the sender's memory (cma.py)."""

    path: Path
    peer_pid: int


def _probe_of(nonce: bytes | None):
    """A copy of this end's nonce that stays put while the peer reads it (None: no single copy)."""
    return bytearray(nonce) if nonce and cma.available() else None


def _probed(desc: dict) -> bool:
    """Whether this process can copy out of the peer's memory: it reads the peer's probe, which
    must be the peer's nonce."""
    pid, addr, nonce = _pid(desc), desc.get("probe"), desc.get("nonce")
    if pid is None or not isinstance(addr, int) or not isinstance(nonce, bytes) or not nonce:
        return False
    got = bytearray(len(nonce))
    try:
        cma.read(pid, [memoryview(got)], [addr])
    except (OSError, ValueError) as e:
        logger.info("tcp+mpi: cannot copy out of pid %s's memory (%s): this pair keeps its frames in TCP", pid, e)
        return False
    return hmac.compare_digest(bytes(got), nonce)


async def _write(stream, body: dict) -> None:
    data = msgpack.packb(body)
    await stream.write(_HEAD.pack(MAGIC, len(data)) + data)


async def _read(stream) -> dict:
    head = await stream.read_bytes(_HEAD.size)
    magic, n = _HEAD.unpack(head)
    if magic != MAGIC or n > MAX_HELLO:
        raise HelloError("the peer is not a tcp+mpi endpoint (no transport hello)")
    body = msgpack.unpackb(await stream.read_bytes(n)) if n else {}
    if not isinstance(body, dict):
        raise HelloError("malformed transport hello")
    return body


async def _comm_of(fut: concurrent.futures.Future, timeout: float):
    """Wait for a pair communicator without cancelling its construction on timeout (the other
    connections of the pair may still want it)."""
    if fut.done():
        return fut.result()
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(f):
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    fut.add_done_callback(settle)
    await asyncio.wait_for(asyncio.shield(done), timeout)
    return fut.result()


def _engine(link: PoolLink, chunk_bytes: int) -> Engine:
    from .engine import engine_for

    return engine_for(link.MPI, chunk_bytes)


def _fallback(why: str) -> None:
    stats.note(f"tcp_fallback:{why}")


# What each MAC is of: a MAC of one message never stands for another kind.
HELLO, ANSWER, CHOICE = b"dask-pmix tcp+mpi hello 1", b"dask-pmix tcp+mpi answer 1", b"dask-pmix tcp+mpi choice 1"
NONCE_BYTES = 16


def _mac(secret: bytes, what: bytes, body: dict, *bound: Any) -> bytes:
    """HMAC-SHA256 of a message without its "mac", its fields in key order (msgpack encodes what
    the peer unpacked as the sender packed it), and of the nonces it answers."""
    fields = sorted(((k, v) for k, v in body.items() if k != "mac"), key=lambda kv: str(kv[0]))
    return hmac.new(secret, msgpack.packb([what, fields, *bound]), hashlib.sha256).digest()


def _signed(link: PoolLink | None, what: bytes, body: dict, *bound: Any) -> dict:
    if link is not None and link.secret:
        body["mac"] = _mac(link.secret, what, body, *bound)
    return body


def _authentic(link: PoolLink, what: bytes, body: dict, *bound: Any) -> bool:
    """Whether the peer holds this epoch's secret: its message's MAC is ours of it."""
    mac = body.get("mac")
    if not link.secret or not isinstance(mac, bytes):
        return False
    return hmac.compare_digest(mac, _mac(link.secret, what, body, *bound))


_warned_at: float | None = None
WARN_EVERY = 60.0  # seconds: the rest at debug (a process outside the pool must not fill the log)


def _refused(stream, what: str, claim: dict) -> None:
    """Says that a peer failed to prove the epoch's secret: what it claimed, never a MAC or the secret."""
    global _warned_at
    _fallback("unauthenticated")
    now = time.monotonic()
    level = logging.DEBUG
    if _warned_at is None or now - _warned_at >= WARN_EVERY:
        _warned_at, level = now, logging.WARNING
    try:
        peer = stream.socket.getpeername()
    except Exception:  # noqa: BLE001 - closed already
        peer = "?"
    logger.log(
        level,
        "tcp+mpi: the %s of %s claims pool rank %s of this worker's epoch but %s; treated as outside the pool (TCP)",
        what,
        peer,
        claim.get("rank"),
        "carries no MAC" if "mac" not in claim else "its MAC is not of this epoch's secret",
    )


async def offer(stream, timeout: float, chunk_bytes: int) -> tuple[Route | CopyRoute | None, Revisit | None]:
    """Connector side: the MPI route, or None for a TCP connection and when to revisit that."""
    link = current_link()
    mine = describe(link)
    nonce = os.urandom(NONCE_BYTES) if link is not None and link.secret else None
    probe = _probe_of(nonce) if mine.get("host") else None
    body = {**mine, "nonce": nonce} if nonce else dict(mine)
    if probe is not None:
        body["probe"] = cma.address(probe)
    await _write(stream, _signed(link, HELLO, body))
    reply = await asyncio.wait_for(_read(stream), timeout)
    if not reply.get("mpi"):
        why = str(reply.get("why", "peer"))
        _fallback(why)
        if link is not None and reply.get("epoch") is not None:
            stats.path("tcp")  # two pool workers without an MPI path between them
        if reply.get("starting"):
            return None, Revisit(after=time.monotonic() + REVISIT_AFTER)
        if link is None and reply.get("epoch") is not None:
            return None, Revisit(epoch=str(reply["epoch"]))
        return None, None
    if link is None or nonce is None or not _authentic(link, ANSWER, reply, nonce):
        # Not a member of this epoch: building a pair with the rank it names would wait for good.
        await _write(stream, {"mpi": False, "why": "unauthenticated"})
        _refused(stream, "answer", reply)
        return None, None
    peer = int(reply["rank"])
    path = choose(mine, reply)
    if path is None or path.name != reply.get("path"):
        # The two ends see the pair differently (settings that differ between workers): TCP.
        await _write(stream, {"mpi": False, "why": "path-mismatch"})
        _fallback("path-mismatch")
        stats.path("tcp")
        return None, None
    if path.name == "cma":
        if not _probed(reply):
            await _write(stream, {"mpi": False, "why": "cma-refused"})
            _fallback("cma-refused")
            stats.path("tcp")
            return None, None
        await _write(stream, _signed(link, CHOICE, {"mpi": True, "path": "cma"}, reply.get("nonce")))
        stats.path("cma")
        del probe  # the listener read it before it answered
        return CopyRoute(path, int(reply["pid"])), None
    assert link is not None  # a path needs both ends in one epoch
    reg = registry_for(link)
    tag = None if reg.broken(peer) else reg.alloc_tag(peer)
    if tag is None:
        await _write(stream, {"mpi": False, "why": "connector"})
        _fallback("pair-unusable")
        return None, None
    theirs = set(reply.get("pairs", ()))
    name = next((n for n in reg.names(peer) if n in theirs), None)
    reserved = None
    if name is None:
        # A new pair communicator is built only while neither process runs a job (activation.py);
        # otherwise this connection stays TCP and a later one builds it.
        reserved = GATE.reserve_pair() if reply.get("can_build", True) else None
        if reserved is None:
            await _write(stream, {"mpi": False, "why": "job"})
            _fallback("job")
            return None, None
        name = reg.new_name(peer)
    ours = reg.building_new(name, peer)  # not one the listener holds already
    fut = reg.start(name, peer, reserved=reserved)
    try:
        await _write(stream, _signed(link, CHOICE, {"mpi": True, "pair": name, "tag": tag}, reply.get("nonce")))
        committed = await asyncio.wait_for(_read(stream), timeout)
        if not committed.get("committed"):
            raise HelloError(f"the listener did not commit to the pair communicator: {committed!r}")
    except BaseException as exc:
        # The listener may never call the construction started here: it would wait forever.
        if ours:
            reg.cancel(name, peer, f"the connection ended before the listener committed to it ({exc!r})")
        raise
    try:
        comm = await _comm_of(fut, min(timeout, PAIR_WAIT))
    except asyncio.TimeoutError:
        await _write(stream, {"use": "tcp"})
        _fallback("pair-slow")
        if ours:
            _give_up_later(reg, fut, peer, timeout)
        return None, Revisit(pair=fut)
    except Exception as exc:  # not CancelledError: a connect given up on says nothing about the pair
        if not isinstance(exc, PairCancelled):
            reg.mark_broken(peer)
        await _write(stream, {"use": "tcp"})
        _fallback("pair-failed")
        logger.info("tcp+mpi: building the MPI communicator with pool rank %s failed: %r", peer, exc)
        return None, None
    await _write(stream, {"use": "mpi"})
    stats.path(path.name)
    return Route(
        _engine(link, chunk_bytes),
        comm,
        peer_index(link.rank, peer),
        int(reply["tag"]),
        tag,
        name,
        peer,
        path,
        _pid(reply),
    ), None


async def answer(stream, timeout: float, chunk_bytes: int) -> Route | CopyRoute | None:
    """Listener side. Returns the MPI route, or None for a TCP connection."""
    hello = await asyncio.wait_for(_read(stream), timeout)
    link = current_link()
    me = describe(link)
    status = {"epoch": me["epoch"], "starting": link is None and pool_starting()}
    path = choose(me, hello)
    if path is None:
        why = why_not(me, hello)
        await _write(stream, {"mpi": False, "why": why, **status})
        _fallback(why)
        if me["epoch"] is not None and hello.get("epoch") is not None:
            stats.path("tcp")  # two pool workers without an MPI path between them
        return None
    assert link is not None  # a path needs both ends in one epoch
    if not _authentic(link, HELLO, hello):
        # Before anything is handed out to it: a tag, a reservation, a construction.
        await _write(stream, {"mpi": False, "why": "unauthenticated", **status})
        _refused(stream, "hello", hello)
        return None
    if path.name == "cma":
        return await _answer_copy(stream, link, me, hello, status, path, timeout)
    peer = int(hello["rank"])
    reg = registry_for(link)
    tag = None if reg.broken(peer) else reg.alloc_tag(peer)
    if tag is None:
        await _write(stream, {"mpi": False, "why": "listener", **status})
        _fallback("pair-unusable")
        return None
    # Whether a new pair communicator may be built here now (no job runs: activation.py); held
    # until the connector's choice says whether it is needed.
    reserved = GATE.reserve_pair()
    nonce = os.urandom(NONCE_BYTES)
    try:
        await _write(
            stream,
            _signed(
                link,
                ANSWER,
                {
                    "mpi": True,
                    "path": path.name,
                    **me,
                    "pairs": reg.names(peer),
                    "tag": tag,
                    "can_build": reserved is not None,
                    "nonce": nonce,
                },
                hello.get("nonce"),
            ),
        )
        choice = await asyncio.wait_for(_read(stream), timeout)
    except BaseException:
        GATE.pair_done(reserved)
        raise
    if not choice.get("mpi"):
        GATE.pair_done(reserved)
        _fallback(str(choice.get("why", "connector")))
        return None
    if not _authentic(link, CHOICE, choice, nonce):
        # A replayed hello (its MAC was right) whose sender cannot answer this nonce: nothing is
        # committed, and the connection, which no member opened, goes.
        GATE.pair_done(reserved)
        _refused(stream, "choice", {**choice, "rank": peer})
        raise HelloError("the connector's choice does not prove the pool's secret")
    name = str(choice["pair"])
    # start() lets the reservation go when the communicator exists or another connection builds it.
    fut = reg.start(name, peer, reserved=reserved)
    await _write(stream, {"committed": True})
    # The connector says whether it got the communicator in time (else: TCP, the build goes on).
    use = await asyncio.wait_for(_read(stream), timeout + PAIR_WAIT)
    if use.get("use") != "mpi":
        _fallback("pair-slow")
        return None
    comm = await _built(reg, fut, peer, timeout)
    stats.path(path.name)
    return Route(
        _engine(link, chunk_bytes),
        comm,
        peer_index(link.rank, peer),
        int(choice["tag"]),
        tag,
        name,
        peer,
        path,
        _pid(hello),
    )


async def _answer_copy(stream, link, me: dict, hello: dict, status: dict, path: Path, timeout: float):
    """Listener side of the single-copy path, for an authenticated hello."""
    if not _probed(hello):
        await _write(stream, {"mpi": False, "why": "cma-refused", **status})
        _fallback("cma-refused")
        stats.path("tcp")
        return None
    nonce = os.urandom(NONCE_BYTES)
    probe = _probe_of(nonce)
    assert probe is not None  # _probed() read the peer's: this process has the call
    answer = {"mpi": True, "path": path.name, **me, "nonce": nonce, "probe": cma.address(probe)}
    await _write(stream, _signed(link, ANSWER, answer, hello.get("nonce")))
    choice = await asyncio.wait_for(_read(stream), timeout)
    if not choice.get("mpi"):
        _fallback(str(choice.get("why", "connector")))
        if choice.get("why") == "cma-refused":
            stats.path("tcp")
        return None
    if not _authentic(link, CHOICE, choice, nonce):
        _refused(stream, "choice", {**choice, "rank": hello.get("rank")})
        raise HelloError("the connector's choice does not prove the pool's secret")
    del probe  # read by the connector before its choice
    stats.path("cma")
    return CopyRoute(path, int(hello["pid"]))


def _pid(desc: dict) -> int | None:
    pid = desc.get("pid")
    return int(pid) if isinstance(pid, int) and pid > 0 else None


def _give_up_later(reg, fut, peer: int, timeout: float) -> None:
    """A construction still under way `timeout` s from now is not coming (its peer is gone or
    stuck): the pair is marked broken (later connections stay TCP at once) and nothing waits for
    it any longer, as _built does for a connection that waits the whole timeout."""

    def check() -> None:
        if not fut.done():
            reg.mark_broken(peer)
            reg.cancel_wait(fut, peer, f"not built within {timeout:g} s")

    asyncio.get_running_loop().call_later(timeout, check)


async def _built(reg, fut, peer: int, timeout: float):
    try:
        return await _comm_of(fut, timeout)
    except PairCancelled as exc:  # its connection ended early: the pair itself may be fine
        raise HelloError(f"building the MPI communicator with pool rank {peer} was cancelled: {exc}") from exc
    except Exception as exc:  # not CancelledError: a connect given up on says nothing about the pair
        reg.mark_broken(peer)
        if isinstance(exc, asyncio.TimeoutError):
            # Its peer is not coming (gone, or stuck): nothing here waits for it any longer.
            reg.cancel_wait(fut, peer, f"not built within {timeout:g} s")
        raise HelloError(f"building the MPI communicator with pool rank {peer} failed: {exc!r}") from exc
