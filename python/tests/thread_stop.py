"""Stops one thread of another process and nothing else, the way a wedged library would hold it:
PTRACE_SEIZE then PTRACE_INTERRUPT on that thread's id, from a helper process (this file run as a
script) that stays its tracer. The other threads of the target run on. The thread runs again
when the stop is released, or when the helper exits; if the target dies meanwhile (SIGKILL works
on a stopped thread) the helper reaps the thread, so that its process can be reaped in turn.

Needs CAP_SYS_PTRACE over the target (the tests run as root)."""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys
import time

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: the tracee is a thread, not a child


def thread_named(pid: int, name: str, timeout: float = 30.0) -> int:
    """The id of the thread of `pid` called `name` (/proc/<pid>/task/*/comm)."""
    deadline = time.monotonic() + timeout
    while True:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().strip() == name:
                        return int(tid)
            except FileNotFoundError:
                continue
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} has no thread called {name!r}")
        time.sleep(0.1)


def thread_state(pid: int, tid: int) -> str:
    """The thread's state letter in /proc (t: stopped by its tracer)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class ThreadStop:
    """``with ThreadStop(tid):`` the thread is stopped inside the block."""

    def __init__(self, tid: int):
        self.tid = tid
        self.helper: subprocess.Popen | None = None

    def __enter__(self) -> "ThreadStop":
        self.helper = subprocess.Popen([sys.executable, __file__, str(self.tid)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
        line = self.helper.stdout.readline().strip()
        if line != "stopped":
            self.helper.kill()
            self.helper.wait()
            raise AssertionError(f"could not stop thread {self.tid}: {line or 'the helper exited'}")
        return self

    def release(self) -> None:
        if self.helper is not None and self.helper.poll() is None:
            self.helper.stdin.close()  # the helper lets the thread go and exits
            try:
                self.helper.wait(10)
            except subprocess.TimeoutExpired:
                self.helper.kill()  # its exit detaches it too
                self.helper.wait()
        self.helper = None

    def __exit__(self, *exc) -> None:
        self.release()


def _stop(tid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def ptrace(request: int, data: int = 0) -> None:
        if libc.ptrace(request, tid, None, ctypes.c_void_p(data)) == -1:
            err = ctypes.get_errno()
            raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")

    try:
        ptrace(PTRACE_SEIZE)
        ptrace(PTRACE_INTERRUPT)
        _, status = os.waitpid(tid, WALL)
    except OSError as e:
        print(e, flush=True)
        sys.exit(1)
    if not os.WIFSTOPPED(status):
        print(f"thread {tid} ended instead of stopping (status {status:#x})", flush=True)
        sys.exit(1)
    print("stopped", flush=True)
    while True:
        # Until the test lets go (stdin closed), or the thread ends (its process was killed).
        ready, _, _ = select.select([sys.stdin], [], [], 0.1)
        if ready and not sys.stdin.readline():
            try:
                ptrace(PTRACE_DETACH)
            except OSError:
                pass
            return
        pid, status = os.waitpid(tid, WALL | os.WNOHANG)
        if pid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            return


if __name__ == "__main__":
    _stop(int(sys.argv[1]))
