"""The C kernel on the CPU: float64 numpy references on tensors large enough for its threads
and chunks, agreement across thread counts, the row it writes, and its build and fallbacks."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from stats_reference import (
    EXACT_FIELDS,
    check_stats,
    log2_reference,
    reference_row,
    reference_stats,
    row_stats,
    values_of,
)

from layerscope.stats import WIDTH, Field, Log2Histogram, _native, finalize, tensor_partials
from layerscope.stats._partials import _native_input, write_partials

pytestmark = pytest.mark.skipif(
    _native.library() is None, reason="no C compiler here: the torch kernels do the work"
)

SOURCE = _native.SOURCE.read_text()
PARALLEL_MIN = 1 << 16  # from _native.c
CHUNK = 64 * 1024


def test_sizes_here_match_the_c_source():
    for line in (
        "#define BLOCK 1024",
        "#define CHUNK (64 * BLOCK)",
        "#define PARALLEL_MIN (1 << 16)",
    ):
        assert line in SOURCE


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    a = rng.standard_normal(n)
    if kind == "offset":  # float32's ulp at 1e4 is 1e-3: only the float64 sums keep std
        a += 1e4
    elif kind == "specials_late":  # in the last chunk, which the second thread reads
        for offset, value in zip((1, 7, 8, 100), (math.nan, math.inf, -math.inf, 0.0), strict=True):
            a[n - offset] = value
    elif kind == "specials_everywhere":
        where = rng.random(n) < 0.01
        a[where] = rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40], where.sum())
    elif kind == "first_is_nan":  # the shift falls back to 0
        a[0] = math.nan
        a += 5.0
    elif kind == "wide":
        a *= 10.0 ** rng.integers(-30, 30, n)
    return a


SIZES = (PARALLEL_MIN - 1, PARALLEL_MIN, 3 * CHUNK + 17, 1_000_003)
KINDS = ("normal", "offset", "specials_late", "specials_everywhere", "first_is_nan", "wide")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", SIZES)
def test_large_tensors_match_float64_numpy(n, kind, dtype):
    _check_against_float64(torch.from_numpy(_values(kind, n, np.random.default_rng(n))).to(dtype))


def _check_against_float64(x: torch.Tensor) -> None:
    """The kernel's partials and histogram of ``x`` against numpy in float64."""
    row, hist = tensor_partials(x, Log2Histogram())
    a = values_of(x)
    want = reference_row(a)
    for field in EXACT_FIELDS:
        assert row[field].item() == want[field], field.name
    np.testing.assert_array_equal(hist.numpy(), log2_reference(a))
    check_stats(row_stats(finalize(row[None]), 0), reference_stats(a))


def _blocks_of_every_span(tail: int) -> np.ndarray:
    """Block k spans k exponents, around 2**(k - 20), with zeros, subnormals, Inf and NaN in
    some blocks, and a short block at the end."""
    rng = np.random.default_rng(tail)
    blocks = []
    for span in range(1, 41):
        exponents = rng.integers(0, span, 1024) + span - 20
        block = rng.uniform(1.0, 2.0, 1024) * 2.0**exponents * rng.choice([-1.0, 1.0], 1024)
        if span % 3 == 0:
            block[rng.integers(0, 1024, 5)] = [0.0, -0.0, 1e-42, math.inf, math.nan]
        blocks.append(block)
    return np.concatenate([*blocks, rng.standard_normal(tail)]).astype(np.float32)


def _check_partials(a: np.ndarray, row: np.ndarray, hist: np.ndarray) -> None:
    np.testing.assert_array_equal(hist, log2_reference(a.astype(np.float64)))
    want = reference_row(a.astype(np.float64))
    for field in EXACT_FIELDS:
        assert row[field] == want[field], field.name


@pytest.mark.parametrize("tail", [0, 1, 31, 32, 33, 63, 64, 65, 1000])
def test_blocks_of_every_exponent_span_count_exactly(tail):
    # Blocks spanning up to 32 exponents are counted by byte compares where the CPU has AVX2 or
    # AVX-512, wider ones one value at a time.
    a = _blocks_of_every_span(tail)
    row, hist = tensor_partials(torch.from_numpy(a), Log2Histogram())
    _check_partials(a, row.numpy(), hist.numpy())


_ISA_PROBE = """
import sys, numpy as np, torch
from layerscope.stats import _native, tensor_partials, Log2Histogram
assert _native.library() is not None
a = np.load(sys.argv[1])
row, hist = tensor_partials(torch.from_numpy(a), Log2Histogram())
np.save(sys.argv[2], row.numpy()); np.save(sys.argv[3], hist.numpy())
"""


@pytest.mark.parametrize("flags", ["-mno-avx512f", "-mno-avx2 -mno-avx512f"])
def test_each_instruction_set_counts_the_same(tmp_path, flags):
    # The AVX-512, AVX2 and scalar histograms, built as a CPU without the others would get them.
    compiler = shutil.which("cc") or shutil.which("gcc")
    a = _blocks_of_every_span(65)
    np.save(tmp_path / "a.npy", a)
    outputs = [str(tmp_path / name) for name in ("row.npy", "hist.npy")]
    env = {**os.environ, "LAYERSCOPE_CACHE": str(tmp_path / "cache"), "CC": f"{compiler} {flags}"}
    done = subprocess.run(
        [sys.executable, "-c", _ISA_PROBE, str(tmp_path / "a.npy"), *outputs],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    _check_partials(a, np.load(outputs[0]), np.load(outputs[1]))


@pytest.mark.parametrize("n", [PARALLEL_MIN, 1_000_003])
def test_thread_counts_agree_and_each_repeats_itself_exactly(n):
    x = torch.from_numpy(_values("specials_everywhere", n, np.random.default_rng(1))).float()
    threads = torch.get_num_threads()
    results = {}
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            first = tensor_partials(x, Log2Histogram())
            again = tensor_partials(x, Log2Histogram())
            assert torch.equal(first[0], again[0])
            assert torch.equal(first[1], again[1])
            results[count] = first
    finally:
        torch.set_num_threads(threads)
    one_row, one_hist = results[1]
    exact = [int(field) for field in EXACT_FIELDS]
    for row, hist in results.values():
        assert torch.equal(hist, one_hist)
        assert torch.equal(row[exact], one_row[exact])
        # float64 sums added in another order: equal to rounding
        assert row[Field.MEAN].item() == pytest.approx(one_row[Field.MEAN].item(), rel=1e-12)
        assert row[Field.M2].item() == pytest.approx(one_row[Field.M2].item(), rel=1e-12)


def test_bfloat16_is_read_as_it_is_and_as_float32_alike():
    x = torch.randn(200_001).to(torch.bfloat16)
    direct = tensor_partials(x, Log2Histogram())
    widened = tensor_partials(x.float(), Log2Histogram())
    assert torch.equal(direct[0], widened[0])
    assert torch.equal(direct[1], widened[1])


@pytest.mark.parametrize(
    ("view", "in_place"),
    [
        (lambda x: x.t(), True),  # a permutation of contiguous memory: read where it lies
        (lambda x: x.reshape(6, 50, 400).permute(2, 0, 1), True),
        (lambda x: x[:1].t(), True),  # size-1 dimensions have any stride
        (lambda x: x[:, ::3], False),  # gaps
        (lambda x: x[:, :1].expand(300, 7), False),  # repeats
        (lambda x: x.half(), False),
    ],
)
def test_views_are_read_in_place_where_their_values_fill_their_memory(view, in_place):
    x = torch.from_numpy(_values("specials_everywhere", 120_000, np.random.default_rng(5)))
    v = view(x.float().reshape(300, 400))
    assert (_native._readable(_native_input(v)) is _native_input(v)) == in_place
    _check_against_float64(v)


@pytest.mark.parametrize("histogram", [Log2Histogram(), None])
def test_write_partials_fills_its_row_and_nothing_else(histogram):
    slots = 0 if histogram is None else histogram.slots
    x = torch.randn(70_000)
    rows = torch.full((3, WIDTH + slots), -7.0, dtype=torch.float64)
    write_partials(x, histogram, rows, 1)
    row, hist = tensor_partials(x, histogram)
    assert torch.equal(rows[1, :WIDTH], row)
    if hist is not None:
        assert torch.equal(rows[1, WIDTH:], hist.double())
    assert (rows[0] == -7.0).all()
    assert (rows[2] == -7.0).all()


def test_the_torch_kernel_computes_the_same_row():
    x = torch.from_numpy(_values("specials_everywhere", 50_000, np.random.default_rng(2))).float()
    native = tensor_partials(x, Log2Histogram())
    from layerscope.stats import _partials

    torch_row, torch_bins = _partials._float32_partials_and_bins(x)
    assert torch.equal(native[1], _partials._count_bins(torch_bins, 256))
    exact = [int(field) for field in EXACT_FIELDS]
    assert torch.equal(native[0][exact], torch_row[exact])
    assert native[0][Field.MEAN].item() == pytest.approx(torch_row[Field.MEAN].item(), rel=1e-12)
    assert native[0][Field.M2].item() == pytest.approx(torch_row[Field.M2].item(), rel=1e-10)


# Building and falling back, in fresh processes with caches of their own ---------------------

_PROBE = (
    "import torch, warnings; from layerscope import LayerscopeWarning;"
    "warnings.simplefilter('error', LayerscopeWarning);"
    "from layerscope.stats import _native, tensor_partials, Log2Histogram;"
    "row, hist = tensor_partials(torch.tensor([1.0, -2.0, float('nan'), 0.0]), Log2Histogram());"
    "print(_native.library() is not None, [round(v, 12) for v in row.tolist()],"
    " hist[[0, 127, 128, 255]].tolist())"
)
# numel, count, mean, M2, min, max, zeros, nan, inf, neg, pos; then 4 histogram slots
_EXPECTED = (
    "[4.0, 3.0, -0.333333333333, 4.666666666667, -2.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0] [1, 1, 1, 1]"
)


def _probe(cache: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAYERSCOPE_CACHE": str(cache), **environment}
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env)


def test_builds_once_into_the_cache_and_loads_from_it_after(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    log = tmp_path / "calls"
    counting = tmp_path / "counting-cc"  # a compiler that notes each time it runs
    counting.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{compiler}" "$@"\n')
    counting.chmod(0o755)
    cache = tmp_path / "cache"
    for _ in range(2):
        done = _probe(cache, CC=str(counting))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("True")
        assert _EXPECTED in done.stdout
    assert log.read_text() == "run\n"  # the second process loaded what the first built
    [built] = cache.iterdir()  # no temporary file left
    assert built.suffix == ".so"
    # the compiler's own permissions: whoever shares the cache can load it
    umask = os.umask(0)
    os.umask(umask)
    assert built.stat().st_mode & 0o777 == 0o777 & ~umask
    # a damaged library in the cache is built again
    built.write_bytes(b"not a library")
    done = _probe(cache, CC=str(counting))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True")
    assert log.read_text() == "run\nrun\n"


def test_without_a_compiler_the_torch_kernel_answers_silently(tmp_path):
    done = _probe(tmp_path, CC=str(tmp_path / "no-such-cc"))
    assert done.returncode == 0, done.stderr  # warnings are errors in the probe
    assert done.stdout.startswith("False")
    assert _EXPECTED in done.stdout


def test_layerscope_native_0_turns_it_off(tmp_path):
    done = _probe(tmp_path, LAYERSCOPE_NATIVE="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_failing_compiler_warns_once_and_falls_back(tmp_path):
    probe = _PROBE.replace("simplefilter('error'", "simplefilter('always'")
    probe += ";tensor_partials(torch.ones(3), None)"
    failing = shutil.which("false") or "false"
    env = {**os.environ, "LAYERSCOPE_CACHE": str(tmp_path), "CC": failing}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False")
    assert _EXPECTED in done.stdout
    assert done.stderr.count("building the CPU statistics kernel failed") == 1


def test_a_leading_nan_keeps_the_variance_of_offset_data():
    # The sums are shifted by the first finite value: with a shift of 0, squares - sum**2/n
    # would cancel to a few percent here.
    a = 1e4 + 0.01 * np.random.default_rng(3).standard_normal(300_000)
    a[0] = math.nan
    a[1] = -math.inf
    x = torch.from_numpy(a).float()
    want = reference_stats(values_of(x))
    from layerscope.stats import _partials

    for row in (tensor_partials(x, None)[0], _partials._float32_partials(x)):
        check_stats(row_stats(finalize(row[None]), 0), want)


def test_a_negative_view_is_read_as_its_values():
    x = torch.randn(100_000)
    view = torch._neg_view(x)
    assert view.is_neg()
    assert view.is_contiguous()
    got, got_hist = tensor_partials(view, Log2Histogram())
    want, want_hist = tensor_partials(-x, Log2Histogram())
    assert torch.equal(got, want)
    assert torch.equal(got_hist, want_hist)


class _Wrapper(torch.Tensor):
    """A __torch_dispatch__ wrapper: it reports the CPU but has no memory of its own."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device
        )

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.inner if isinstance(t, _Wrapper) else t

        return func(*pytree.tree_map(unwrap, args), **pytree.tree_map(unwrap, kwargs or {}))


def test_wrapper_subclasses_take_the_torch_kernel():
    x = torch.randn(70_000)
    wrapped = _Wrapper(x)
    assert wrapped.data_ptr() == 0
    assert not _native.owns_memory(wrapped)
    out = torch.zeros(1, WIDTH + 256, dtype=torch.float64)
    write_partials(wrapped, Log2Histogram(), out, 0)  # the kernel would read address 0
    want = torch.zeros_like(out)
    write_partials(x, Log2Histogram(), want, 0)
    exact = [int(field) for field in EXACT_FIELDS]
    assert torch.equal(out[0, exact], want[0, exact])
    assert torch.equal(out[0, WIDTH:], want[0, WIDTH:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 15, 1024, 1025, PARALLEL_MIN + 3, 5 * PARALLEL_MIN + 7])
@pytest.mark.parametrize("special", ["none", "inf", "nan_late", "negative_zero"])
@pytest.mark.parametrize("threads", [1, 2])
def test_extremes_match_aminmax(dtype, n, special, threads):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n) * 100
    if special == "inf":
        a[rng.integers(0, n, 2)] = [math.inf, -math.inf]
    elif special == "nan_late":  # in the last block, the last thread's run
        a[-1] = math.nan
    elif special == "negative_zero":
        a[:] = -0.0
    x = torch.from_numpy(a).to(dtype)
    pairs = torch.full((3, 2), 7.0, dtype=torch.float64)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _native.extremes_into(x, pairs, 1)
    finally:
        torch.set_num_threads(previous)
    low, high = torch.aminmax(x)
    expected = torch.stack([low, high]).double()
    assert torch.equal(pairs[1], expected) or (expected.isnan().all() and pairs[1].isnan().all())
    assert pairs[[0, 2]].eq(7.0).all()  # only its own row written


def test_extremes_of_views_read_their_values():
    base = torch.randn(64, 33)
    for view in (base.t(), base[:, ::2]):
        pairs = torch.zeros(1, 2, dtype=torch.float64)
        _native.extremes_into(view, pairs, 0)
        low, high = torch.aminmax(view)
        assert pairs[0].tolist() == [low.item(), high.item()]
    negated = torch._neg_view(base)
    assert negated.is_neg()
    pairs = torch.zeros(1, 2, dtype=torch.float64)
    _native.extremes_into(negated, pairs, 0)
    assert pairs[0].tolist() == [(-base).min().item(), (-base).max().item()]
