"""The `dask-pmix` console script: `serve` and `--version` run the sidecar's CLI on Node, `demo`
runs the demo in this Python environment, `exec PROGRAM ...` becomes the native binder that
starts a plain MPICH / Intel MPI program as a job member (no Node, nothing else imported)."""

from __future__ import annotations

import os
import sys

from .errors import SidecarError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["exec"]:
        from .launcher import binder

        try:
            path = binder()
        except SidecarError as e:
            print(f"dask-pmix: {e}", file=sys.stderr)
            return 1
        sys.stdout.flush()
        os.execv(path, [path, *argv[1:]])
    if argv[:1] == ["demo"]:
        from .demo import main as demo

        return demo(argv[1:])
    from . import config
    from .launcher import sidecar_command

    try:
        command, env = sidecar_command(argv, node=config.get("sidecar.node"))
    except SidecarError as e:
        print(f"dask-pmix: {e}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    os.execve(command[0], command, env)  # signals reach the sidecar itself


if __name__ == "__main__":
    sys.exit(main())
