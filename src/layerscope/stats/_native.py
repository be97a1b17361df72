"""The CPU statistics kernel in C: built when layerscope is installed, loaded with ctypes.

On the CPU, one pass of ``_native.c`` over a float32 tensor's memory computes its partials and
log2 histogram 6 to 15 times faster than the compiled torch kernel, which spends most of its
time on the histogram (``benchmarks/kernel.py``), and needs neither inductor's compile time
nor its memory; another pass gives the sentinel's minimum and maximum. It reads float32,
bfloat16, float16 and the 8-bit floats where they lie, and counts the log2 histogram (split by
sign where asked) or a linear one.

``setup.py`` builds it into ``libnative.so`` beside this file (``pip install``, ``pip install
-e``, ``pip wheel``), without ``-march=native``: the library holds a copy of the kernel per
instruction set and ``layerscope_select`` picks the best one this CPU runs. Its threads are
torch's: it calls torch's OpenMP runtime, whose entry points this module finds, and links no
runtime of its own. ctypes releases the GIL for each call.

Where the library is missing (installed with no compiler) or does not load, ``library()`` is
None, ``problem()`` says why, and the torch kernels do the work; ``_partials`` warns once.
``LAYERSCOPE_BUILD_NATIVE=1`` builds it at first use instead, into a private per-user cache,
under a lock, at most once per process; ``LAYERSCOPE_NATIVE=0`` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path

import torch
from torch import Tensor

from layerscope.stats import _native_build as native_build
from layerscope.stats._histogram import HistogramSpec, LinearHistogram
from layerscope.stats._layout import WIDTH, c_names

LIBRARY = Path(__file__).with_name("libnative.so")  # where setup.py builds it
SOURCE = Path(__file__).with_name("_native.c")
_ABI = 100 * WIDTH + 4  # the C file's ABI: its row width and a version
# The kernel's codes of the dtypes it reads; the 8-bit floats are _BYTE, decoded by a table.
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_BYTE = 3
ISAS = ("portable", "avx2", "avx512")  # layerscope_select's levels
MAX_LINEAR_BINS = 1 << 30  # from _native.c
_HIST_OFFSET = WIDTH * 8  # bytes from a row's start to its histogram

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_state = "untried"  # "untried", "ready" or "absent"
_problem: str | None = None  # why there is no kernel; None where it is turned off
_decode: dict[torch.dtype, Tensor] = {}  # float32 bits of each byte of an 8-bit float dtype


def library() -> ctypes.CDLL | None:
    """The loaded kernel, loading it on first use; None where there is none. Never warns."""
    global _library, _state, _problem
    if _state == "untried":
        with _lock:
            if _state == "untried":
                _library, _problem = _find()
                _state = "ready" if _library is not None else "absent"
    return _library


def problem() -> str | None:
    """Why there is no kernel (once ``library()`` has looked), or None: it is there or off."""
    library()
    return _problem


def kernel_name() -> str | None:
    """``"native-avx512"``, ``"native-avx2"`` or ``"native"`` (portable), or None: no kernel."""
    lib = library()
    if lib is None:
        return None
    isa = lib.layerscope_isa().decode()
    return "native" if isa == "portable" else f"native-{isa}"


def select_isa(name: str | None) -> str:
    """Use the copy of the kernel for ``name`` (``ISAS``), or the best one for None.

    A set the CPU lacks gives the best one it has. Returns the set in use. For tests and
    benchmarks: the choice holds for the whole process.
    """
    lib = library()
    assert lib is not None, "select_isa needs library()"
    return ISAS[lib.layerscope_select(-1 if name is None else ISAS.index(name))]


def reads(dtype: torch.dtype) -> bool:
    """Whether the kernel reads tensors of ``dtype`` (float64 is left to torch's kernels)."""
    return dtype in DTYPES or (dtype.is_floating_point and dtype.itemsize == 1)


def reads_histogram(histogram: HistogramSpec | None) -> bool:
    """Whether the kernel counts ``histogram``: all but linear ones of over 2**30 bins."""
    return not isinstance(histogram, LinearHistogram) or histogram.bins <= MAX_LINEAR_BINS


def owns_memory(x: Tensor) -> bool:
    """Whether ``x`` is a plain tensor whose values lie in its own memory.

    Wrapper subclasses (DTensor, FakeTensor, ``__torch_dispatch__`` wrappers) report the CPU
    but have no data pointer the kernel could read.
    """
    return type(x) in (Tensor, torch.nn.Parameter) and x.data_ptr() != 0


def partials_into(x: Tensor, rows: Tensor, index: int, histogram: HistogramSpec | None) -> None:
    """Write the partials of ``x`` to the start of ``rows[index]``, its histogram after.

    ``x`` must be a non-empty CPU tensor of a dtype the kernel ``reads``; ``rows`` is a
    contiguous float64 CPU matrix of ``WIDTH`` columns, or ``WIDTH + histogram.slots``, such
    as the recorder's buffer. This runs once per recorded tensor: it works on pointers, with
    no tensor views.
    """
    lib = library()
    assert lib is not None, "partials_into needs library()"
    x = _readable(x)
    row = rows.data_ptr() + index * rows.stride(0) * rows.element_size()
    code, decode = _code(x.dtype)
    threads = torch.get_num_threads()
    if isinstance(histogram, LinearHistogram):
        lo, hi, bins = histogram.lo, histogram.hi, histogram.bins
        # as _torch_kernels.linear_bin_index computes them
        scale, width = bins / (hi - lo), (hi - lo) / bins
        status = lib.layerscope_partials_linear(
            x.data_ptr(), x.numel(), code, decode, row, row + _HIST_OFFSET, lo, hi, scale,
            width, bins, threads,
        )  # fmt: skip
    else:
        hist = None if histogram is None else row + _HIST_OFFSET
        signed = histogram is not None and histogram.signed
        status = lib.layerscope_partials(
            x.data_ptr(), x.numel(), code, decode, row, hist, signed, threads
        )
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
    code, decode = _code(x.dtype)
    status = lib.layerscope_extremes(
        x.data_ptr(), x.numel(), code, decode, pairs.data_ptr() + 16 * index,
        torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(f"layerscope_extremes returned {status} for dtype {x.dtype}")


def _code(dtype: torch.dtype) -> tuple[int, int | None]:
    """The kernel's code of ``dtype`` and, for an 8-bit float, the address of its table."""
    code = DTYPES.get(dtype)
    if code is not None:
        return code, None
    table = _decode.get(dtype)
    if table is None:  # torch's own decoding of each of the 256 bytes, as float32 bits
        table = torch.arange(256, dtype=torch.uint8).view(dtype).float().view(torch.int32)
        _decode[dtype] = table
    return _BYTE, table.data_ptr()


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


# Finding, loading and (opted into) building the library --------------------------------------


def _find() -> tuple[ctypes.CDLL | None, str | None]:
    """The library and None, or None and why there is none (None again where it is off)."""
    if os.environ.get("LAYERSCOPE_NATIVE", "1") == "0":
        return None, None
    if LIBRARY.exists():
        try:
            return _open(LIBRARY), None
        except (OSError, RuntimeError, AttributeError) as error:  # AttributeError: a symbol
            why = f"{LIBRARY} does not load ({error})"
    else:
        why = "it was not built when layerscope was installed (no C compiler there?)"
    if os.environ.get("LAYERSCOPE_BUILD_NATIVE") != "1":
        return None, why
    try:
        return native_build.build(SOURCE, LIBRARY.name, _open), None
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as error:
        return None, f"{why}, and building it with LAYERSCOPE_BUILD_NATIVE=1 failed ({error})"


def _open(path: Path) -> ctypes.CDLL:
    """Load the library at ``path``, check that it is this version's, and set it up."""
    lib = ctypes.CDLL(str(path))
    if lib.layerscope_abi() != _ABI:
        raise RuntimeError(f"ABI {lib.layerscope_abi()}, expected {_ABI}")
    lib.layerscope_fields.restype = ctypes.c_char_p
    fields = lib.layerscope_fields().decode()
    if fields != c_names():
        raise RuntimeError(f"its row holds {fields}, layerscope's {c_names()}")
    lib.layerscope_source_id.restype = ctypes.c_char_p
    built_from = lib.layerscope_source_id().decode()
    if built_from and SOURCE.exists() and built_from != native_build.source_id(SOURCE.read_bytes()):
        # an in-place build (pip install -e) that predates an edit of _native.c
        raise RuntimeError("it was built from another _native.c: run `pip install -e .` again")
    lib.layerscope_isa.restype = ctypes.c_char_p
    lib.layerscope_select.argtypes = [ctypes.c_int]
    lib.layerscope_partials.restype = ctypes.c_int
    lib.layerscope_partials.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    lib.layerscope_partials_linear.restype = ctypes.c_int
    lib.layerscope_partials_linear.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double,
        ctypes.c_int64, ctypes.c_int,
    ]  # fmt: skip
    lib.layerscope_extremes.restype = ctypes.c_int
    lib.layerscope_extremes.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int,
    ]  # fmt: skip
    lib.layerscope_use_threads.restype = None
    lib.layerscope_use_threads.argtypes = [ctypes.c_void_p] * 3
    lib.layerscope_select(-1)
    lib.layerscope_use_threads(*(_torch_openmp() or (None, None, None)))
    return lib


_OPENMP = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")


def _torch_openmp() -> tuple[int, int, int] | None:
    """The addresses of ``_OPENMP`` in the OpenMP runtime torch's threads run on, or None.

    Looked up from libtorch_cpu, whose dependencies hold the runtime torch loaded (libgomp on
    Linux, libomp on macOS: both have the GOMP entry points), and never loaded anew. None
    where torch's threads are not OpenMP's: the kernel then runs on one thread.
    """
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    torch_lib = Path(torch.__file__).parent / "lib"
    candidates = [*torch_lib.glob("libtorch_cpu.*"), *_mapped("libtorch_cpu")]
    for path in candidates:
        try:
            handle = ctypes.CDLL(str(path), mode=noload | os.RTLD_LAZY)
            found = [ctypes.cast(getattr(handle, name), ctypes.c_void_p).value for name in _OPENMP]
        except (OSError, AttributeError):
            continue
        if all(found):
            return found[0], found[1], found[2]  # type: ignore[return-value]  # all() checked
    return None


def _mapped(name: str) -> list[Path]:
    """Files mapped into this process whose name starts with ``name`` (Linux; else none)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths = {line.split(maxsplit=5)[-1] for line in lines if f"/{name}" in line}
    return [Path(path) for path in sorted(paths)]
