"""The sidecar process the scheduler plugin starts when no sidecar URL is configured.

Everything here is awaited on the scheduler's event loop without a thread: the sidecar says it is
listening by writing one line to a pipe it is given (`serve --ready-fd`), and its exit is seen
through a pidfd that the loop watches."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable
from typing import Any

from .. import config
from ..errors import SidecarError
from ..launcher import sidecar_command


def serve_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """`dask-pmix <args>`: the configured command (dask-pmix.sidecar.command, or DASK_PMIX_BIN), else
    the sidecar bundled with this package, run on Node directly. Never a setup or a build."""
    command = config.get("sidecar.command")
    if command:
        argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        return [*argv, *args], dict(os.environ)
    return sidecar_command(args, node=config.get("sidecar.node"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def _read_to_end(fd: int, deadline: float) -> bytes:
    """Everything written to the pipe `fd` until its writers close it (or the deadline)."""
    loop = asyncio.get_running_loop()
    out = bytearray()
    done = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            out.extend(chunk)
        elif not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(done, max(0.0, deadline - loop.time()))
    finally:
        loop.remove_reader(fd)
    return bytes(out)


class EmbeddedSidecar:
    """A sidecar process owned by the scheduler; stopped (SIGTERM) with it, restarted if it dies.

    Its token reaches it through the environment (never argv, which `ps` shows); its state
    directory (pset definitions and job history in SQLite) outlives each process, so that a
    restarted sidecar finds what the previous one knew.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        token: str | None = None,
        extra_args: list[str] | None = None,
        log_path: str | None = None,
        state_dir: str | None = None,
    ):
        self.host = host
        self.port = port or free_port(host)
        self.token = token
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self.state_dir = state_dir
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._exited: asyncio.Future | None = None
        self._pidfd: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, timeout: float | None = None) -> str:
        """Starts the process and returns its URL once it listens."""
        loop = asyncio.get_running_loop()
        timeout = timeout or config.seconds("timeouts.start") or 120.0
        state = ["--state-dir", self.state_dir] if self.state_dir else []
        ready_r, ready_w = os.pipe()
        args, env = serve_command(
            [
                "serve",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--parent-pid",
                str(os.getpid()),
                "--ready-fd",
                str(ready_w),
                *state,
                *self.extra_args,
            ]
        )
        env.pop("DASK_PMIX_TOKEN_FILE", None)
        if self.token:
            env["DASK_PMIX_TOKEN"] = self.token
        else:
            env.pop("DASK_PMIX_TOKEN", None)
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                args,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if self.log_path else None,
                start_new_session=True,
                pass_fds=(ready_w,),
            )
        finally:
            os.close(ready_w)
            if out is not subprocess.DEVNULL:
                out.close()
        self._watch_exit(loop)
        try:
            line = await _read_to_end(ready_r, loop.time() + timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise SidecarError(0, f"dask-pmix serve did not start within {timeout:.0f} s") from None
        finally:
            os.close(ready_r)
        if b"listening on" not in line:
            assert self._exited is not None and self.proc is not None
            await asyncio.wait([self._exited], timeout=5)
            status = self.proc.poll()
            raise SidecarError(0, f"dask-pmix serve exited with {status} during start-up")
        return self.url

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Settles self._exited with the exit status when the process ends (reaping it)."""
        proc, exited = self.proc, loop.create_future()
        assert proc is not None
        self._exited = exited

        def reap() -> None:
            status = proc.poll()
            if status is None:
                return
            if self._pidfd is not None:
                loop.remove_reader(self._pidfd)
                os.close(self._pidfd)
                self._pidfd = None
            if not exited.done():
                exited.set_result(status)

        self._pidfd = os.pidfd_open(proc.pid)
        loop.add_reader(self._pidfd, reap)

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Calls `callback(status)` on the loop when the running process ends."""
        if self._exited is not None:
            self._exited.add_done_callback(lambda f: callback(f.result()))

    def exited(self) -> int | None:
        """The exit status of a sidecar that ended, None while it runs."""
        return None if self.proc is None else self.proc.poll()

    async def restart(self, timeout: float | None = None) -> str:
        """Starts a new process in place of one that ended, on the same port with the same token."""
        if self.proc is not None and self.proc.poll() is None:
            raise SidecarError(0, "the sidecar is still running")
        url = await self.start(timeout)
        self.restarts += 1
        return url

    async def stop(self, timeout: float = 15.0) -> None:
        proc, exited = self.proc, self._exited
        self.proc = None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        if exited is not None:
            await asyncio.wait([exited], timeout=timeout)
        if proc.poll() is None:
            proc.kill()
            if exited is not None:
                await asyncio.wait([exited], timeout=5)
