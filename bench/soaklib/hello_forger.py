"""The soak's "forged-hello" fault: a transport hello (dask_pmix.comm.hello) sent to a tcp+mpi
worker's listener by a process that is not the worker it describes.

Framed as the comm backend frames it (b"DPMX", a 4-byte little-endian length, msgpack), without
importing dask_pmix.comm (which would bring the pool's MPI into the soak's process). What the
listener sends back is read until a message answers the hello ("mpi" in it), the listener
closes, or `wait` s pass; a message before the answer (a challenge of an authenticated hello) is
kept, and not answered: the forger has no secret to answer it with. An answer mpi:true is turned
down ({"mpi": false}), so that the listener builds nothing for the forger either way."""

from __future__ import annotations

import socket
import struct
import time

import msgpack

MAGIC = b"DPMX"
HEAD = struct.Struct("<4sI")


def _frame(body: dict) -> bytes:
    data = msgpack.packb(body)
    return HEAD.pack(MAGIC, len(data)) + data


def _read_exact(s: socket.socket, n: int, deadline: float) -> bytes | None:
    got = b""
    while len(got) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = s.recv(n - len(got))
        if not chunk:
            return None
        got += chunk
    return got


def forge(host: str, port: int, description: dict, wait: float = 5.0) -> dict:
    """Sends `description` as this connection's hello: {"answer": the listener's reply or None,
    "before": messages before it, "closed": whether the listener closed first}."""
    out: dict = {"answer": None, "before": [], "closed": False}
    deadline = time.monotonic() + wait
    try:
        s = socket.create_connection((host, port), timeout=wait)
    except OSError as e:
        return {**out, "error": f"connect: {e}"}
    try:
        s.sendall(_frame(description))
        while time.monotonic() < deadline and len(out["before"]) < 3:
            head = _read_exact(s, HEAD.size, deadline)
            if head is None:
                out["closed"] = True
                break
            magic, n = HEAD.unpack(head)
            body = _read_exact(s, n, deadline) if magic == MAGIC and n < 1 << 20 else None
            if body is None:
                out["closed"] = magic == MAGIC
                out["other"] = head.hex()
                break
            msg = msgpack.unpackb(body) if n else {}
            if isinstance(msg, dict) and "mpi" in msg:
                out["answer"] = msg
                if msg.get("mpi"):
                    s.sendall(_frame({"mpi": False, "why": "soak-forged-hello"}))
                break
            out["before"].append(msg)
    except TimeoutError:
        out["timed_out"] = True
    except OSError as e:
        out["error"] = str(e)
        out["closed"] = True
    finally:
        s.close()
    # The reply's own description is not needed in the record: what it chose is.
    if isinstance(out["answer"], dict):
        out["answer"] = {k: v for k, v in out["answer"].items() if k in ("mpi", "why", "path", "epoch", "starting")}
    return out
