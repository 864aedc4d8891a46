"""What a sender keeps in its memory for its peer's single copies (cma.py), and the guard that
tells the peer whether it still does.

The receiver copies a message's CMA frames out of the sender's memory after it has read the
message's block, which can be any time after the sender's write returned: tornado may hold the
block in its buffer, and a receiver that saw the sender's close goes on with what it had read. So
nothing the sender sees tells it for sure that the copy is over, except the receiver's
acknowledgement (framing.ACK in the TCP stream). The sender therefore holds each message's frames
until that acknowledgement, and when the connection ends first, for LINGER seconds more. A
receiver that copies after that must not get other bytes without an error, so every held message
has a guard: a word in a table this process never frees, set to a token that is never reused when
the frames are held, and cleared before they are let go. The block names the guard and its token;
the receiver reads the guard after it has copied the frames, and if the token is gone, the frames
may have been reused under its copy and the read fails (CommClosedError), as a read of a peer that
died mid-message does. The order (the sender clears, then frees; the receiver copies, then checks)
makes an unchanged token after the copy a proof that the frames were held all along.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import itertools
import threading

from . import cma

LINGER = 10.0  # seconds a closed connection's held frames stay for a copy already under way
SLOTS = 1 << 14  # guards per process: past them, frames go in the TCP stream


class _Guards:
    """The per-process guard table (a C array that lives as long as the process)."""

    def __init__(self) -> None:
        self._words = (ctypes.c_uint64 * SLOTS)()
        self._base = ctypes.addressof(self._words)
        self._free = list(range(SLOTS - 1, -1, -1))
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int, int] | None:
        """(slot, its address, token), or None when every slot is in use."""
        with self._lock:
            if not self._free:
                return None
            slot = self._free.pop()
            token = next(self._tokens)
        self._words[slot] = token
        return slot, self._base + 8 * slot, token

    def give(self, slot: int) -> None:
        self._words[slot] = 0
        with self._lock:
            self._free.append(slot)


_guards: _Guards | None = None


def guards() -> _Guards:
    global _guards
    if _guards is None:
        _guards = _Guards()
    return _guards


def still_held(pid: int, guard: int, token: int) -> bool:
    """Whether the sender pid still holds the frames that guard/token stand for (read after the
    copy)."""
    word = (ctypes.c_uint64 * 1)()
    cma.read(pid, [memoryview(word).cast("B")], [guard])
    return word[0] == token


class Held:
    """One connection's held messages, oldest first."""

    def __init__(self) -> None:
        self._messages: collections.deque = collections.deque()
        self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    def hold(self, frames: list, nbytes: int) -> tuple[int, int] | None:
        """Holds a message's frames; returns (guard address, token) for its block, or None (no
        guard free: send the frames in the stream instead)."""
        taken = guards().take()
        if taken is None:
            return None
        slot, address, token = taken
        self._messages.append((frames, nbytes, slot))
        self.nbytes += nbytes
        return address, token

    def release(self) -> None:
        """The peer has copied the oldest held message."""
        if not self._messages:
            raise ValueError("tcp+mpi: an acknowledgement for nothing this end holds")
        _, n, slot = self._messages.popleft()
        guards().give(slot)  # cleared before the frames go
        self.nbytes -= n

    def linger(self) -> None:
        """The connection has ended: what is held goes in LINGER seconds (a copy the peer has
        begun may finish), and at once without an event loop to wait on."""
        if not self._messages:
            return
        messages, self._messages = self._messages, collections.deque()
        self.nbytes = 0

        def drop() -> None:
            for _, _, slot in messages:
                guards().give(slot)
            messages.clear()

        try:
            asyncio.get_running_loop().call_later(LINGER, drop)
        except RuntimeError:
            drop()
