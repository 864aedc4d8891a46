"""Starts `dask-pmix serve` as a child process when no sidecar URL is configured."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time

from .. import config
from ..errors import SidecarError
from ..launcher import sidecar_command
from ..rest import SidecarClient


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


class EmbeddedSidecar:
    """A sidecar process owned by the scheduler; stopped (SIGTERM) with it, restarted if it dies.

    Its token reaches it through the environment (never argv, which `ps` shows); its state
    directory (pset definitions and job history in SQLite) outlives each process, so that a
    restarted sidecar finds what the previous one knew.
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, token: str | None = None,
                 extra_args: list[str] | None = None, log_path: str | None = None, state_dir: str | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.token = token
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self.state_dir = state_dir
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float | None = None) -> str:
        timeout = timeout or config.seconds("timeouts.start") or 120.0
        state = ["--state-dir", self.state_dir] if self.state_dir else []
        args, env = serve_command(["serve", "--host", self.host, "--port", str(self.port),
                                   "--parent-pid", str(os.getpid()), *state, *self.extra_args])
        env.pop("DASK_PMIX_TOKEN_FILE", None)
        if self.token:
            env["DASK_PMIX_TOKEN"] = self.token
        else:
            env.pop("DASK_PMIX_TOKEN", None)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT if self.log_path else None,
                                         start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        client = SidecarClient(self.url, self.token)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise SidecarError(0, f"dask-pmix serve exited with {self.proc.returncode} during start-up")
                try:
                    client.health(timeout=2)
                    return self.url
                except SidecarError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise SidecarError(0, f"dask-pmix serve did not answer within {timeout:.0f} s") from None
                    time.sleep(0.1)
        finally:
            client.close()

    def exited(self) -> int | None:
        """The exit status of a sidecar that died (reaping it), None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def restart(self, timeout: float | None = None) -> str:
        """Starts a new process in place of one that died, on the same port with the same token."""
        if self.proc is not None and self.proc.poll() is None:
            raise SidecarError(0, "the sidecar is still running")
        url = self.start(timeout)
        self.restarts += 1
        return url

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
