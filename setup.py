"""Build glue: compile native_kernels/ into graphswap/libgraphswap_kernels.so at install time.

Everything declarative lives in setup.cfg; this file only adds the C build step.  The library is
built for baseline x86-64 with per-ISA paths chosen at run time, and links OpenBLAS from the
scipy-openblas32 wheel (a build and run dependency, see pyproject.toml / setup.cfg).
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


def _load_compiler():
    # Load graphswap/native/compiler.py without importing the package (which needs TensorFlow).
    spec = importlib.util.spec_from_file_location("_graphswap_compiler",
                                                  HERE / "graphswap" / "native" / "compiler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithKernels(build_py):
    def run(self):
        super().run()
        compiler = _load_compiler()
        target = Path(self.build_lib) / "graphswap" / compiler.LIBRARY_NAME
        compiler.build_shipped_library(HERE / "native_kernels", target)
        include_dir = Path(self.build_lib) / "graphswap" / "include"
        include_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / "native_kernels" / "include" / "graphswap_kernels.h", include_dir)


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library: mark it platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithKernels}, distclass=BinaryDistribution)
