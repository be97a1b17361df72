"""The CPU statistics kernel in C: built with the system's compiler on first use, then cached.

On the CPU, one pass of ``_native.c`` over a float32 tensor's memory computes its partials and
log2 histogram 7 to 14 times faster than the compiled torch kernel, which spends most of its
time on the histogram (``benchmarks/kernel.py``), and needs neither inductor's compile time
nor its memory; another pass gives the sentinel's minimum and maximum. The library is built
once per source, machine and flags, into ``$LAYERSCOPE_CACHE`` (default
``~/.cache/layerscope``), and loaded with ctypes, whose calls release the GIL.

Where there is no C compiler, or ``LAYERSCOPE_NATIVE=0``, ``library()`` is None and the torch
kernels do the work. A compiler that fails gives one ``LayerscopeWarning``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

from layerscope._errors import LayerscopeWarning
from layerscope.stats._layout import WIDTH

SOURCE = Path(__file__).with_name("_native.c")
_ABI = 100 * WIDTH + 2  # the C file's ABI: its row width and a version
DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the kernel's codes of the dtypes it reads
_HIST_OFFSET = WIDTH * 8  # bytes from a row's start to its histogram
# From most to least capable; OpenMP is left out where the compiler has none (Apple's clang).
# On x86, 512-bit vectors where the CPU has them: about 10% faster than gcc's default 256.
_WIDE = ("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ()
_FLAG_SETS = tuple(
    ("-O3", "-fno-strict-aliasing", *flags)  # the kernel reads floats' bits through uint32_t
    for flags in (
        ("-march=native", *_WIDE, "-fopenmp"),
        ("-march=native", "-fopenmp"),
        ("-fopenmp",),
        ("-march=native",),
        (),
    )
)

_library: ctypes.CDLL | None = None
_state = "untried"  # "untried", "ready" or "absent"


def library() -> ctypes.CDLL | None:
    """The loaded kernel, building it on first use; None where it cannot be had."""
    global _library, _state
    if _state == "untried":
        _state = "absent"
        try:
            _library = _load()
        except Exception as error:  # a broken compiler or cache must not stop training
            warnings.warn(
                f"layerscope: building the CPU statistics kernel failed ({error}); "
                "using torch's kernels, which are slower",
                LayerscopeWarning,
                stacklevel=2,
            )
        if _library is not None:
            _state = "ready"
    return _library


def owns_memory(x: Tensor) -> bool:
    """Whether ``x`` is a plain tensor whose values lie in its own memory.

    Wrapper subclasses (DTensor, FakeTensor, ``__torch_dispatch__`` wrappers) report the CPU
    but have no data pointer the kernel could read.
    """
    return type(x) in (Tensor, torch.nn.Parameter) and x.data_ptr() != 0


def partials_into(x: Tensor, rows: Tensor, index: int, with_histogram: bool) -> None:
    """Write the partials of ``x`` to the start of ``rows[index]``, its log2 histogram after.

    ``x`` must be a non-empty float32 or bfloat16 CPU tensor (``DTYPES``); ``rows`` is a
    contiguous float64 CPU matrix of ``WIDTH`` columns, or of ``WIDTH + LOG2_BINS`` with the
    histogram, such as the recorder's buffer.
    This runs once per recorded tensor: it works on pointers, with no tensor views.
    """
    lib = library()
    assert lib is not None, "partials_into needs library()"
    x = _readable(x)
    row = rows.data_ptr() + index * rows.stride(0) * rows.element_size()
    status = lib.layerscope_partials(
        x.data_ptr(), x.numel(), DTYPES[x.dtype], row,
        row + _HIST_OFFSET if with_histogram else None, torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(f"layerscope_partials returned {status} for dtype {x.dtype}")


def extremes_into(x: Tensor, pairs: Tensor, index: int) -> None:
    """Write the minimum and maximum of ``x`` to ``pairs[index]``, as ``aminmax`` gives them.

    A NaN anywhere makes both NaN. ``x`` as for ``partials_into``; ``pairs`` is a contiguous
    ``(n, 2)`` float64 CPU matrix, such as the recorder's buffer of the sentinel's readings.
    """
    lib = library()
    assert lib is not None, "extremes_into needs library()"
    x = _readable(x)
    status = lib.layerscope_extremes(
        x.data_ptr(), x.numel(), DTYPES[x.dtype], pairs.data_ptr() + 16 * index,
        torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(f"layerscope_extremes returned {status} for dtype {x.dtype}")


def _readable(x: Tensor) -> Tensor:
    """``x``, or a copy, whose ``numel()`` values fill its memory from ``data_ptr()`` on.

    The order does not matter to statistics: a transpose or another permutation of a
    contiguous tensor (attention's batch-first output) is read where it lies, uncopied.
    """
    if x.is_neg() or not (x.is_contiguous() or _dense(x)):  # a negative view's memory holds -x
        return x.detach().resolve_neg().contiguous()
    return x


def _dense(x: Tensor) -> bool:
    """Whether ``x``'s values fill one block of memory, without gaps or repeats."""
    expected = 1
    for stride, size in sorted(zip(x.stride(), x.shape, strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _load() -> ctypes.CDLL | None:
    if os.environ.get("LAYERSCOPE_NATIVE", "1") == "0":
        return None
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "gcc"]
    if shutil.which(compiler[0]) is None:
        return None
    source = SOURCE.read_bytes()
    errors = []
    for flags in _FLAG_SETS:
        path = _cache_dir() / f"stats-{_key(source, compiler, flags)}.so"
        try:
            if not path.exists():
                _compile(compiler, flags, path)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:  # a damaged file in the cache: build it again, once
                path.unlink(missing_ok=True)
                _compile(compiler, flags, path)
                lib = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            errors.append(str(error))
            continue  # fewer flags may do: no OpenMP, no -march=native
        if lib.layerscope_abi() != _ABI:
            raise RuntimeError(f"{path} has ABI {lib.layerscope_abi()}, expected {_ABI}")
        lib.layerscope_partials.restype = ctypes.c_int
        lib.layerscope_partials.argtypes = [
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int,
        ]  # fmt: skip
        lib.layerscope_extremes.restype = ctypes.c_int
        lib.layerscope_extremes.argtypes = [
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
        ]  # fmt: skip
        return lib
    raise RuntimeError(errors[-1])


def _compile(compiler: list[str], flags: tuple[str, ...], path: Path) -> None:
    """Build in a fresh folder beside ``path``, then rename it into place.

    Processes racing are safe, and the library keeps the compiler's usual permissions, so
    whoever shares the cache can load it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(dir=path.parent)
    built = os.path.join(folder, path.name)
    try:
        command = [*compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", built]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{' '.join(command)}: {last}")
        os.replace(built, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _cache_dir() -> Path:
    configured = os.environ.get("LAYERSCOPE_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layerscope"


def _key(source: bytes, compiler: list[str], flags: tuple[str, ...]) -> str:
    """Source, compiler, flags and CPU: ``-march=native`` code must not meet another CPU."""
    digest = hashlib.sha256(source)
    for part in (" ".join(compiler), " ".join(flags), platform.machine(), _cpu_identity()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def _cpu_identity() -> str:
    """The model and feature flags of this CPU, where the system says (Linux); else ''."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(wanted)))
