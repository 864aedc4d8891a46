"""Another local user against the sidecar, for the soak's "stranger" fault: run as another uid
(/usr/bin/python3 stranger.py PLAN_JSON; stdlib only, since that user may not reach the soak's
interpreter), it holds silent connections to every TCP port of the plan and sends each port every
payload on a connection of its own, and tries each UNIX socket path; prints one JSON line of what
came back. `payloads()` builds the PMIx handshakes it sends (as libpmix 5.0.11's client writes
them: src/pmix/handshake.ts), and `harmful()` judges the answers."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

NOBODY = 65534


def handshake(*, nspace: str | None, rank: int = 0, uid: int, gid: int, flag: int = 0) -> bytes:
    """A PMIx connection handshake: flag 0 a client naming (nspace, rank); 3 a tool asking for an
    identity, 4 a tool naming one; `uid`/`gid` its native credential (and stated ids for a tool)."""
    body = b"native\0" + struct.pack(">I", 8) + struct.pack("<II", uid, gid) + bytes([flag])
    if flag != 0:
        body += struct.pack(">II", uid, gid)
    if nspace is not None:
        body += nspace.encode() + b"\0" + struct.pack(">I", rank)
    body += b"5.0.11\0v41\0" + bytes([1]) + b"hash\0"
    return struct.pack("<iIII", -1, 0xFFFFFFFF, len(body), 0) + body


def payloads(namespace: str, pool_namespace: str | None) -> dict[str, bytes]:
    """What the stranger sends every port: handshakes naming a job's (and the pool's) rank with its
    own uid and lying about it, tools, PMI commands, HTTP and junk."""
    out = {
        "client_own_uid": handshake(nspace=namespace, uid=NOBODY, gid=NOBODY),
        "client_lying_uid": handshake(nspace=namespace, uid=0, gid=0),
        "tool_own_uid": handshake(nspace=None, uid=NOBODY, gid=NOBODY, flag=3),
        "pmi1": b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_my_kvsname\n",
        "http": b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n",
        "junk": b"\xab" * 4096,
    }
    if pool_namespace:
        out["pool_rank_lying_uid"] = handshake(nspace=pool_namespace, uid=0, gid=0)
        out["tool_lying_naming_pool"] = handshake(nspace=pool_namespace, uid=0, gid=0, flag=4)
    return out


def harmful(report: dict) -> list[str]:
    """What the stranger got that it must not have: a PMIx handshake answered success, an HTTP 2xx,
    a PMI command past init answered rc=0, a connection to a UNIX socket of the sidecar's."""
    bad = []
    for port, answers in report.get("ports", {}).items():
        for name, a in answers.items():
            text = a.get("text", "")
            if name.startswith(("client", "pool", "tool")) and a.get("status") == 0:
                bad.append(f"port {port}: {name} was admitted")
            if text.startswith("HTTP/1.1 2"):
                bad.append(f"port {port}: {name} got {text[:40]!r}")
            if "cmd=my_kvsname rc=0" in text:
                bad.append(f"port {port}: {name} got a PMI answer: {text[:80]!r}")
    for path, a in report.get("paths", {}).items():
        if not a.get("error"):
            bad.append(f"{path}: connected")
    return bad


def _exchange(addr, payload: bytes, wait: float) -> dict:
    family = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    out: dict = {}
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(wait)
    try:
        s.connect(addr)
        s.sendall(payload)
        got = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            got += chunk
        out.update(bytes=len(got), text=got[:400].decode("latin1"),
                   status=struct.unpack(">i", got[:4])[0] if len(got) >= 4 else None)
    except OSError as e:
        out["error"] = e.__class__.__name__ if not e.errno else os.strerror(e.errno)
    finally:
        s.close()
    return out


def main(plan: dict) -> dict:
    held = []
    for port in plan["ports"]:
        for _ in range(plan.get("silent", 0)):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                pass
    report: dict = {"uid": os.getuid(), "held": len(held), "ports": {}, "paths": {}}
    for port in plan["ports"]:
        report["ports"][str(port)] = {name: _exchange(("127.0.0.1", port), bytes.fromhex(hexed), plan.get("wait", 2.0))
                                      for name, hexed in plan["payloads"].items()}
    for path in plan.get("paths", []):
        report["paths"][path] = _exchange(path, b"\0", 1.0)
    for s in held:
        s.close()
    return report


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
