"""/dev/shm files of the soak's own processes, told apart from everyone else's.

Other engineers' MPI jobs create and remove /dev/shm files on this machine all the time, so the
soak runs in a mount namespace of its own with a private tmpfs on /dev/shm: every file there was
created by one of the soak's processes (the clusters, the sidecars, the ranks), and nothing of
theirs lands in the machine's /dev/shm. A file is *orphaned* when no live process maps it or
holds it open; a file that is orphaned between jobs, or any file left once the clusters have
stopped, is a leak. Where no mount namespace can be made (no privilege for it), the soak
compares snapshots of the shared /dev/shm and attributes a new file to itself when one of its
processes was seen holding it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SHM = Path("/dev/shm")
MARK = "DASK_PMIX_SOAK_PRIVATE_SHM"


def enter_private_shm(argv: list[str]) -> None:
    """Re-executes this program in a new mount namespace with a private /dev/shm (once); returns
    in the namespace, or at once when it cannot be made (then `private()` is False)."""
    if os.environ.get(MARK):
        return
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return
    script = 'mount -t tmpfs -o mode=1777,size=4g dask-pmix-soak /dev/shm && exec "$@"'
    probe = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        return
    env = {**os.environ, MARK: "1"}
    os.execve(unshare, [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", sys.executable,
                        *argv], env)


def private() -> bool:
    return os.environ.get(MARK) == "1"


def _mnt_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def soak_pids() -> list[int]:
    """The soak's live processes: in the private namespace, every process in it; otherwise this
    process and its descendants."""
    me = os.getpid()
    if private():
        ns = _mnt_ns(me)
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and _mnt_ns(p) == ns]
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = [], [me]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def fd_targets(pid: int) -> list[str]:
    """What process `pid`'s file descriptors point at (paths, socket:[inode], ...)."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def files() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir()}
    except OSError:
        return set()


def held() -> dict[str, list[int]]:
    """/dev/shm file name -> the soak's processes that map it or hold it open."""
    out: dict[str, list[int]] = {}
    prefix = str(SHM) + "/"
    for pid in soak_pids():
        names = set()
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                i = line.find(prefix)
                if i >= 0:
                    names.add(line[i + len(prefix):].split(" (deleted)")[0].strip())
        except OSError:
            continue
        for target in fd_targets(pid):
            if target.startswith(prefix):
                names.add(target[len(prefix):].split(" (deleted)")[0])
        for name in names:
            out.setdefault(name, []).append(pid)
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120].strip()
    except OSError:
        return "?"


class ShmLedger:
    """Snapshot before, the soak's files seen since (with who held them when last seen, and at
    which sample they appeared), and what is left orphaned."""

    def __init__(self) -> None:
        self.before = files()
        self.seen_ours: set[str] = set()
        self.max_files = 0
        self.history: dict[str, dict] = {}  # file -> {"first": label, "holders": [pid cmd, ...]}

    def sample(self, label: str = "") -> dict:
        now = files()
        holders = held()
        self.seen_ours |= {f for f in now if f in holders and f not in self.before}
        ours = now - self.before if private() else {f for f in now if f in self.seen_ours}
        self.max_files = max(self.max_files, len(ours))
        for f in ours:
            h = self.history.setdefault(f, {"first": label, "holders": []})
            if f in holders:
                h["holders"] = [f"{p} {_cmd(p)}" for p in holders[f][:3]]
        return {"files": len(ours), "orphaned": sorted(f for f in ours if f not in holders)}

    def describe(self, names: list[str]) -> dict[str, dict]:
        return {f: self.history.get(f, {}) for f in names}

    def left_after_stop(self) -> list[str]:
        now = files()
        return sorted(now - self.before if private() else now & self.seen_ours)
