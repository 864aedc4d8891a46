"""`dask-pmix-exec PROGRAM`, the command the docs give for a plain MPICH / Intel MPI program, is
the native binder itself in the environment that runs these tests, as in an installed wheel
(python/setup.py installs it into bin/; scripts/setup.sh links the checkout's build into each
venv): no Python starts in front of a rank. test_wheel checks the wheel's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_dask_pmix_exec_in_this_environment_is_the_native_binder():
    exe = Path(sys.executable).parent / "dask-pmix-exec"
    assert exe.is_file(), f"{exe} is missing: run scripts/setup.sh (it links the binder into each venv)"
    assert exe.read_bytes()[:4] == b"\x7fELF", f"{exe} is not the native binder"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMI")}
    # Without a member's environment it just runs the program.
    out = subprocess.run([str(exe), "/bin/sh", "-c", "echo plain; exit 7"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert (out.returncode, out.stdout) == (7, "plain\n"), out.stderr
