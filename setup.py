"""Builds the Python package with the project's CMake build (pyproject.toml names this file's setuptools).

The extension `attnprobe._core` links libattnprobe (a shared library); both come from a CMake build directory and
land in the package folder together, where the module finds the library through its $ORIGIN run path
(python/CMakeLists.txt). The build directory is $ATTNPROBE_BUILD_DIR when set (an existing build is reused: only
the extension target is brought up to date), else build-pip/ in the source tree, configured here for this
interpreter without CUDA and MPI.
"""

import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

SOURCE = pathlib.Path(__file__).resolve().parent


def build_directory() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ATTNPROBE_BUILD_DIR") or SOURCE / "build-pip").resolve()


def run(command):
    print("attnprobe:", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True)


class BuildWithCMake(build_py):
    """Copies the package the CMake build makes (the .py files and _core) plus libattnprobe into the wheel."""

    def run(self):
        build = build_directory()
        if not (build / "CMakeCache.txt").exists():
            run(["cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DATTNPROBE_PYTHON=ON",
                 "-DATTNPROBE_CUDA=OFF", "-DATTNPROBE_MPI=OFF", f"-DPython3_EXECUTABLE={sys.executable}"])
        run(["cmake", "--build", build, "--target", "attnprobe_python", "-j", str(os.cpu_count() or 2)])
        built = build / "python" / "attnprobe"
        modules = list(built.glob("_core*.so"))
        if not modules:
            raise RuntimeError(f"the CMake build in {build} made no attnprobe/_core module: is the Python package "
                               "enabled there (ATTNPROBE_PYTHON=ON, python3-dev and pybind11-dev installed)?")
        target = pathlib.Path(self.build_lib) / "attnprobe"
        target.mkdir(parents=True, exist_ok=True)
        for source in list((SOURCE / "python" / "attnprobe").glob("*.py")) + modules:
            shutil.copy2(source, target / source.name)
        library = build / "lib" / "libattnprobe.so.0"  # the extension's DT_NEEDED name (the SONAME)
        shutil.copy2(library.resolve(), target / library.name)


class BinaryDistribution(Distribution):
    """The wheel holds compiled code: tag it for this platform and interpreter."""

    def has_ext_modules(self):
        return True


setup(packages=["attnprobe"], package_dir={"attnprobe": "python/attnprobe"}, cmdclass={"build_py": BuildWithCMake},
      distclass=BinaryDistribution, zip_safe=False)
