"""The wheel carries the built sidecar (a Node-API addon for Linux x86-64), so it is a platform
wheel for any Python 3: py3-none-<platform>. The sidecar's binder is also installed as the
command `dask-pmix-exec`: `dask-pmix exec` without a Python start in front of it."""

import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution


class SidecarDistribution(Distribution):
    def has_ext_modules(self):
        return True


class SidecarWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


# Present only in the staging tree that scripts/build-wheel.sh assembles.
BINDER = "dask_pmix/_sidecar/native/build/Release/dask-pmix-exec"

setup(
    distclass=SidecarDistribution,
    cmdclass={"bdist_wheel": SidecarWheel},
    # A binary, so not `scripts` (setuptools reads those as text): the environment's bin/.
    data_files=[("bin", [BINDER])] if os.path.exists(BINDER) else [],
)
