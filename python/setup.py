"""The wheel carries the built sidecar (a Node-API addon for Linux x86-64), so it is a platform
wheel for any Python 3: py3-none-<platform>."""

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution


class SidecarDistribution(Distribution):
    def has_ext_modules(self):
        return True


class SidecarWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(distclass=SidecarDistribution, cmdclass={"bdist_wheel": SidecarWheel})
