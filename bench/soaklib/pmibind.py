"""Binds that must be refused, for the soak's "pmi-injection" and "foreign-pmi-binder" faults.

Each payload goes to the sidecar's PMI port on a connection of its own, and what came back is
read until the server closes the connection (or `wait` s pass): the server must answer rc=-1 and
close, and bind nothing. The payloads carry a real member's PMI_ID (GET /v1/jobs/{id}/env/{worker})
while the soak holds that member's own rank back, so the credential is unbound when they arrive: a
server that took one would bind the rank (and, for the injections, run the commands behind it),
and the real rank would then be refused and its job fail.

Run as another uid it is a script (/usr/bin/python3 pmibind.py PLAN_JSON; stdlib only, since that
user may not reach the soak's interpreter) that prints one JSON line: {"uid", "answers"}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def frame2(body: str) -> str:
    """A PMI-2 command: its length in 6 characters, then the command."""
    return f"{len(body.encode('latin1')):6d}{body}"


def _fullinit(pmi_id: str, key: str = "pmirank") -> str:
    # PMI-2 names the credential pmirank (MPICH >= 4.1) or srcid (src/pmi/pmi2-session.ts).
    return frame2(f"cmd=fullinit;pmi-version=2;pmi-subversion=0;{key}={pmi_id};")


def injections(pmi_id: str) -> dict[str, str]:
    """The credential with commands behind it, in one write (issue 31, item 1): PMI-1 binds with
    finalize, barrier and put appended, PMI-2 fullinits with a finalize and a put behind them."""
    return {
        "pmi1_finalize": f"cmd=initack pmiid={pmi_id}\ncmd=finalize\n",
        "pmi1_barrier": f"cmd=initack pmiid={pmi_id}\ncmd=barrier_in\n",
        "pmi1_put": f"cmd=initack pmiid={pmi_id}\ncmd=put kvsname=x key=soak value=injected\n",
        "pmi2_finalize": _fullinit(pmi_id) + frame2("cmd=finalize;"),
        "pmi2_put": _fullinit(pmi_id) + frame2("cmd=kvs-put;key=soak;value=injected;"),
    }


def binds(pmi_id: str) -> dict[str, str]:
    """Plain binds with a member's credential, as its binder sends them (PMI-1) and as a PMI-2 client would."""
    return {
        "pmi1": f"cmd=initack pmiid={pmi_id}\n",
        "pmi2": _fullinit(pmi_id),
        "pmi2_srcid": _fullinit(pmi_id, "srcid"),
    }


def exchange(host: str, port: int, payload: str, wait: float = 3.0) -> dict:
    """Sends `payload` and reads until the server closes: {"text", "closed"} (or {"error"})."""
    out: dict = {}
    try:
        s = socket.create_connection((host, port), timeout=wait)
    except OSError as e:
        return {"error": f"connect: {e}"}
    try:
        s.sendall(payload.encode("latin1"))
        got = b""
        deadline = time.monotonic() + wait
        closed = False
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(4096)
            except TimeoutError:
                break
            except OSError as e:  # a reset is a close
                out["reset"] = str(e)
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
        out.update(text=got[:600].decode("latin1"), closed=closed)
    except OSError as e:
        out["error"] = str(e)
    finally:
        s.close()
    return out


def refused(answer: dict) -> bool:
    """Whether an answer is the refusal the server promises: one reply with rc=-1, nothing that
    succeeded, and the connection closed behind it."""
    text = answer.get("text", "")
    if answer.get("error"):
        return False
    lines = [x for x in text.splitlines() if x.strip()]
    first = lines[0] if lines else ""
    pmi1 = first.startswith("cmd=initack rc=-1")
    pmi2 = "cmd=fullinit-response;rc=-1;" in first
    return (pmi1 or pmi2) and "rc=0" not in text and answer.get("closed", False)


def harmful(answers: dict[str, dict]) -> list[str]:
    """What the binds got that they must not have: anything but a refusal and a close."""
    return [f"{name}: {a.get('error') or repr(a.get('text', ''))[:160]}"
            + ("" if a.get("closed") or a.get("error") else " (left open)")
            for name, a in answers.items() if not refused(a)]


def main(plan: dict) -> dict:
    host, _, port = plan["port"].rpartition(":")
    return {"uid": os.getuid(),
            "answers": {name: exchange(host, int(port), payload, plan.get("wait", 3.0))
                        for name, payload in plan["payloads"].items()}}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
