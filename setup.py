"""Build the CPU statistics kernel, ``stats/_native.c``, into ``layerscope/stats/libnative.so``.

The kernel is a plain shared library that ``stats/_native.py`` loads with ctypes, not a Python
extension: it does not depend on the CPython version, so a wheel is tagged ``py3-none-<platform>``
and one wheel serves every Python of a platform. It is compiled without ``-march=native``: one
library carries a copy of the kernel per instruction set and picks one at run time. It links no
OpenMP runtime (``-fopenmp-simd`` only; the threads are torch's).

The build is optional: where it fails (no compiler), installing still succeeds and the torch
kernels do the work, with one warning when the first tensor is recorded. ``pip install .``,
``pip install -e .`` (which builds it in place) and ``pip wheel .`` all build it. Everything
else is declared in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

KERNEL = "layerscope.stats.libnative"
SOURCE = Path("src/layerscope/stats/_native.c")
# The flags _native.py uses for the opt-in build at first use: keep the two alike.
# -fno-strict-aliasing: the kernel reads floats' bits through uint32_t;
# -ffp-contract=off: every instruction set rounds alike; -fno-trapping-math (clang's default):
# comparisons may be evaluated unconditionally, which lets the linear histogram's loop vectorise.
# -fno-wrapv undoes Python's CFLAGS' -fwrapv, which slows the histogram by 5%.
UNIX_FLAGS = [
    "-O3", "-g0", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-trapping-math",
    "-fno-wrapv", "-fvisibility=hidden",
]  # fmt: skip
OPTIONAL_FLAGS = ["-fopenmp-simd"]  # where the compiler has it: `#pragma omp simd`, no runtime


class BuildKernel(build_ext):
    """Build the kernel as a plain shared library, ``libnative.so`` beside ``_native.py``."""

    def get_ext_filename(self, fullname: str) -> str:
        """``libnative.so``, with no CPython suffix: ctypes loads it under that name."""
        # asked by full and by last name
        if fullname in (KERNEL, KERNEL.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        """None to add: the library has no ``PyInit_`` function."""
        return list(ext.export_symbols or [])

    def build_extension(self, ext: Extension) -> None:
        """Compile and link the kernel with its own flags, and its source's hash."""
        if ext.name != KERNEL:
            super().build_extension(ext)
            return
        source_id = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
        flags = ["/O2", "/fp:precise"]
        if self.compiler.compiler_type != "msvc":
            flags = UNIX_FLAGS + [flag for flag in OPTIONAL_FLAGS if self._accepts(flag)]
        objects = self.compiler.compile(
            [str(SOURCE)],
            output_dir=self.build_temp,
            macros=[("LAYERSCOPE_SOURCE_ID", f'"{source_id}"')],
            extra_postargs=flags,
            depends=ext.depends,
        )
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        self._drop_runpath()
        self.compiler.link_shared_object(
            objects, output, libraries=self.get_libraries(ext), target_lang="c"
        )

    def _drop_runpath(self) -> None:
        """Link without the RUNPATH that Python's own LDSHARED carries (its lib folder).

        The kernel needs only the C library; a wheel must not point at the build machine's paths.
        """
        linker = getattr(self.compiler, "linker_so", None)
        if isinstance(linker, list):
            rpath = ("-Wl,-rpath", "-Wl,-R", "-R")
            self.compiler.linker_so = [arg for arg in linker if not arg.startswith(rpath)]

    def _accepts(self, flag: str) -> bool:
        """Whether the compiler takes ``flag`` (Apple's clang, for one, may not)."""
        with tempfile.TemporaryDirectory() as folder:
            probe = os.path.join(folder, "probe.c")
            Path(probe).write_text("int main(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=folder, extra_postargs=[flag, "-Werror"])
            except Exception:  # CompileError, or a compiler that is not there at all
                return False
        return True


class PlatformWheel(bdist_wheel):
    """Tag wheels ``py3-none-<platform>``: the kernel is C with no Python ABI."""

    def get_tag(self) -> tuple[str, str, str]:
        """``py3``, ``none``, and the platform setuptools names."""
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    ext_modules=[
        Extension(
            KERNEL,
            sources=[str(SOURCE)],
            depends=[str(SOURCE)],
            libraries=[] if os.name == "nt" else ["m"],
            optional=True,  # no compiler: install anyway, the torch kernels do the work
        )
    ],
    cmdclass={"build_ext": BuildKernel, "bdist_wheel": PlatformWheel},
)
