"""Binding an MPICH / Intel MPI rank's PMI connection before MPI starts.

The sidecar hands each member of an MPICH or Intel MPI job ``PMI_PORT`` and ``PMI_ID``, a
128-bit credential. MPICH and Intel MPI read ``PMI_ID`` as an int, so they cannot send it
themselves: the process that starts the rank connects, binds the connection with the credential
(a PMI-1 ``initack``), and hands it to MPI as ``PMI_FD`` with ``PMI_RANK`` and ``PMI_SIZE``, the
way hydra hands its ranks a socketpair. MPI then speaks PMI on it without a handshake of its own.
A rank on the sidecar's host also gets ``DASK_PMIX_PMI_SOCKET``, a UNIX socket tried first (the
same protocol, cheaper than TCP on loopback).

In a process that initialises MPI itself (a Dask worker's rank)::

    os.environ.update(env)
    pmi_connect.bind(os.environ)     # before MPI_Init / MPI_Session_init

For a program started by hand with a member's env: ``dask-pmix-exec PROGRAM ARGS``, the native
binder (no interpreter on the way; ``dask-pmix exec`` reaches it through the console script's
Python start); ``python -m dask_pmix.pmi_connect PROGRAM ARGS`` does the same.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import MutableMapping

TIMEOUT = 60.0
#: A credential: 128 bits as 32 lower-case hex digits (src/pmi/credential.ts).
CREDENTIAL_DIGITS = 32
_HEX = frozenset("0123456789abcdef")


class PMIConnectError(RuntimeError):
    pass


def _line(sock: socket.socket, deadline: float) -> str:
    """One reply line, read byte by byte so that nothing meant for MPI is read ahead."""
    out = bytearray()
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            b = sock.recv(1)
        except TimeoutError:
            raise PMIConnectError(f"no reply from the PMI server within {TIMEOUT:.0f} s") from None
        if not b:
            raise PMIConnectError(f"the PMI server closed the connection: {out.decode('latin1')}")
        if b == b"\n":
            return out.decode("latin1")
        out += b


def _field(line: str, key: str) -> str:
    for tok in line.split(" "):
        if tok.startswith(key + "="):
            return tok[len(key) + 1 :]
    raise PMIConnectError(f"PMI server reply without {key}=: {line}")


def check_pmi_id(pmi_id: str) -> str:
    """Returns ``pmi_id`` if it is a credential; raises PMIConnectError saying what is wrong.

    The value goes onto the wire as it is: a newline in it would send commands of its own
    (``\\ncmd=finalize`` finalizing the rank before MPI starts), so it is checked before any
    connection. The value itself is not repeated in the message."""
    for i, c in enumerate(pmi_id):
        if c not in _HEX:
            what = "a newline" if c == "\n" else "a control character" if ord(c) < 0x20 or c == "\x7f" else repr(c)
            raise PMIConnectError(
                f"PMI_ID is not a dask-pmix credential: character {i + 1} is {what}, and a credential is "
                f"{CREDENTIAL_DIGITS} lower-case hex digits; nothing was sent"
            )
    if len(pmi_id) != CREDENTIAL_DIGITS:
        raise PMIConnectError(
            f"PMI_ID is not a dask-pmix credential: {len(pmi_id)} hex digits, not {CREDENTIAL_DIGITS}; nothing was sent"
        )
    return pmi_id


def bind(environ: MutableMapping[str, str] = os.environ, timeout: float = TIMEOUT) -> int | None:
    """If ``environ`` holds ``PMI_PORT`` and ``PMI_ID``, binds a connection and replaces them with
    ``PMI_FD``, ``PMI_RANK`` and ``PMI_SIZE``. Returns the fd (left open, inheritable), or None
    when there is nothing to bind. Raises PMIConnectError with the server's reason otherwise, and
    before connecting for a ``PMI_ID`` that is not a credential (check_pmi_id)."""
    port, pmi_id = environ.get("PMI_PORT"), environ.get("PMI_ID")
    if not port and not pmi_id:
        return None
    if not port or not pmi_id:
        # MPICH would start on half of it and say only "PMI_Get_appnum returned -1".
        have, lack = ("PMI_PORT", "PMI_ID") if port else ("PMI_ID", "PMI_PORT")
        raise PMIConnectError(
            f"{have} is set but {lack} is not: a rank needs the whole environment of its member "
            "(GET /v1/jobs/{id}/env/{worker}); nothing was sent"
        )
    check_pmi_id(pmi_id)
    host, sep, num = port.rpartition(":")
    if not sep or not num.isdigit():
        raise PMIConnectError(f"PMI_PORT {port!r} is not host:port")
    deadline = time.monotonic() + timeout
    sock = _connect_local(environ.get("DASK_PMIX_PMI_SOCKET"), timeout)
    if sock is None:
        try:
            sock = socket.create_connection((host, int(num)), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise PMIConnectError(f"cannot reach the PMI server at {port}: {exc}") from exc
    try:
        sock.sendall(f"cmd=initack pmiid={pmi_id}\n".encode("latin1"))
        first = _line(sock, deadline)
        if not first.startswith("cmd=initack rc=0"):
            msg = first.partition(" msg=")[2] or first
            raise PMIConnectError(f"the PMI server refused this rank: {msg.replace('_', ' ')}")
        size = _field(_line(sock, deadline), "size")
        rank = _field(_line(sock, deadline), "rank")
        _line(sock, deadline)  # cmd=set debug=
        # MPI reads and writes it blocking.
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()
    os.set_inheritable(fd, True)
    environ["PMI_FD"] = str(fd)
    environ["PMI_RANK"] = rank
    environ["PMI_SIZE"] = size
    del environ["PMI_PORT"]
    del environ["PMI_ID"]
    environ.pop("DASK_PMIX_PMI_SOCKET", None)
    return fd


def _connect_local(path: str | None, timeout: float) -> socket.socket | None:
    """The sidecar's UNIX socket, if this process is on its host; None to use TCP."""
    if not path or not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m dask_pmix.pmi_connect PROGRAM ARGS...", file=sys.stderr)
        return 2
    try:
        bind(os.environ)
    except PMIConnectError as exc:
        print(f"dask_pmix.pmi_connect: {exc}", file=sys.stderr)
        return 3
    os.execvp(args[0], args)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
