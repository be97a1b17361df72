"""The C kernel on the CPU: float64 numpy references on tensors large enough for its threads
and chunks, for every copy of it (instruction set) this CPU runs, agreement across thread counts
and dtypes, the row it writes, and the threads it runs on.

Building it at install time, loading, and the fallbacks are in test_native_build.py.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
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

from layerscope._limits import MAX_LINEAR_BINS
from layerscope.stats import (
    Field,
    LinearHistogram,
    Log2Histogram,
    _native,
    _partials,
    _torch_kernels,
    finalize,
    tensor_partials,
)
from layerscope.stats._layout import WIDTH, c_names
from layerscope.stats._partials import write_partials

pytestmark = pytest.mark.skipif(
    _native.library() is None, reason=f"no C kernel: {_native.problem()}"
)

SOURCE = _native.SOURCE.read_text()
PARALLEL_MIN = 1 << 16  # from _native.c
CHUNK = 64 * 1024
FP8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]


def _runnable_isas() -> list[str]:
    if _native.library() is None:
        return []
    best = _native.select_isa(None)
    return list(_native.ISAS[: _native.ISAS.index(best) + 1])


ISAS = _runnable_isas()


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each copy of the kernel this CPU runs, then back to the best one."""
    assert _native.select_isa(request.param) == request.param
    try:
        yield request.param
    finally:
        _native.select_isa(None)


def test_sizes_here_match_the_c_source():
    for line in (
        "#define BLOCK 1024",
        "#define CHUNK (64 * BLOCK)",
        "#define PARALLEL_MIN (1 << 16)",
        "#define MAX_LINEAR_BINS (1 << 30)",
    ):
        assert line in SOURCE
    assert _native.MAX_LINEAR_BINS == 1 << 30


def test_the_c_row_holds_layouts_fields_name_by_name():
    lib = _native.library()
    assert lib.layerscope_fields().decode() == c_names()
    assert c_names().split()[Field.NAN] == "NANS"  # math.h takes NAN
    assert len(c_names().split()) == WIDTH


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_a_library_whose_fields_are_in_another_order_is_refused(tmp_path):
    # The row's width alone would not see two fields swapped: the loader compares every name.
    source = tmp_path / "_native.c"  # it includes itself, once per instruction set
    swapped = SOURCE.replace("X(NEG) X(POS)", "X(POS) X(NEG)")
    assert swapped != SOURCE
    source.write_text(swapped)
    library = tmp_path / "swapped.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", library, source, "-lm"], check=True)
    with pytest.raises(RuntimeError, match=r"its row holds .* POS NEG"):
        _native._open(library)


def test_the_best_copy_this_cpu_runs_is_the_default():
    flags = ""
    if Path("/proc/cpuinfo").exists():
        flags = next(
            (line for line in Path("/proc/cpuinfo").read_text().splitlines() if "flags" in line),
            "",
        )
    words = set(flags.split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"} <= words:
        expected = "native-avx512"
    elif {"avx2", "fma"} <= words:
        expected = "native-avx2"
    elif sys.platform == "linux":
        expected = "native"
    else:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    assert _partials.kernel_name("cpu") == expected
    assert _native.select_isa("portable") == "portable"
    try:
        assert _partials.kernel_name("cpu") == "native"
    finally:
        _native.select_isa(None)
    assert _partials.kernel_name("cpu") == expected


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", SIZES)
def test_large_tensors_match_float64_numpy(n, kind, dtype):
    _check_against_float64(torch.from_numpy(_values(kind, n, np.random.default_rng(n))).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8])
@pytest.mark.parametrize("kind", ["specials_everywhere", "wide"])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_copy_matches_float64_numpy(isa, kind, dtype, threads):
    x = torch.from_numpy(_values(kind, 3 * CHUNK + 17, np.random.default_rng(7))).to(dtype)
    with _threads(threads):
        _check_against_float64(x)


def _check_against_float64(x: torch.Tensor) -> None:
    """The kernel's partials and histogram of ``x`` against numpy in float64."""
    assert _partials._native_reads(x.reshape(-1), Log2Histogram())
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
def test_blocks_of_every_exponent_span_count_exactly(isa, tail):
    # Blocks spanning up to 32 exponents are counted by byte compares in the AVX2 and AVX-512
    # copies, wider ones one value at a time.
    a = _blocks_of_every_span(tail)
    row, hist = tensor_partials(torch.from_numpy(a), Log2Histogram())
    _check_partials(a, row.numpy(), hist.numpy())


def test_the_copies_agree():
    x = torch.from_numpy(_blocks_of_every_span(65))
    results = {}
    for name in ISAS:
        _native.select_isa(name)
        results[name] = tensor_partials(x, Log2Histogram())
    _native.select_isa(None)
    portable_row, portable_hist = results["portable"]
    exact = [int(field) for field in EXACT_FIELDS]
    for row, hist in results.values():
        assert torch.equal(hist, portable_hist)
        assert torch.equal(row[exact], portable_row[exact])
        # the sums of squares are fused where the copy can: equal to rounding
        assert row[Field.MEAN].item() == pytest.approx(portable_row[Field.MEAN].item(), rel=1e-12)
        assert row[Field.M2].item() == pytest.approx(portable_row[Field.M2].item(), rel=1e-12)


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("n", [PARALLEL_MIN, 1_000_003])
def test_thread_counts_agree_and_each_repeats_itself_exactly(n):
    x = torch.from_numpy(_values("specials_everywhere", n, np.random.default_rng(1))).float()
    results = {}
    for count in (1, 2, 3):
        with _threads(count):
            first = tensor_partials(x, Log2Histogram())
            again = tensor_partials(x, Log2Histogram())
        assert torch.equal(first[0], again[0])
        assert torch.equal(first[1], again[1])
        results[count] = first
    one_row, one_hist = results[1]
    exact = [int(field) for field in EXACT_FIELDS]
    for row, hist in results.values():
        assert torch.equal(hist, one_hist)
        assert torch.equal(row[exact], one_row[exact])
        # float64 sums added in another order: equal to rounding
        assert row[Field.MEAN].item() == pytest.approx(one_row[Field.MEAN].item(), rel=1e-12)
        assert row[Field.M2].item() == pytest.approx(one_row[Field.M2].item(), rel=1e-12)


def _openmp_files() -> set[str]:
    maps = Path("/proc/self/maps").read_text().splitlines()
    names = ("libgomp", "libomp", "libiomp")
    return {line.split()[-1] for line in maps if any(f"/{name}" in line for name in names)}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_it_runs_on_torchs_openmp_threads_and_loads_no_runtime_of_its_own():
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch's threads are not OpenMP's here")
    assert _native._torch_openmp() is not None
    _native.library()
    # torch's runtime (other libraries a test process loaded may bring their own); the
    # kernel's ELF needs none (test_native_build)
    runtimes = _openmp_files()
    assert runtimes
    with _threads(2):
        torch.randn(1 << 20).exp().sum()  # torch's pool has its threads
        before = {task.name for task in Path("/proc/self/task").iterdir()}
        x = torch.randn(1 << 20)
        serial = _partials.tensor_partials(x, Log2Histogram())
        after = {task.name for task in Path("/proc/self/task").iterdir()}
    assert after - before == set()  # no thread of its own (another test's may have ended)
    assert _openmp_files() == runtimes
    with _threads(1):
        one = _partials.tensor_partials(x, Log2Histogram())
    # two threads add their float64 sums in another order than one: it did run on two
    assert not torch.equal(one[0], serial[0])
    assert torch.equal(one[1], serial[1])


def test_bfloat16_float16_and_fp8_are_read_as_they_are_and_as_float32_alike():
    x = torch.randn(200_001) * 3
    for dtype in (torch.bfloat16, torch.float16, *FP8):
        stored = x.to(dtype)
        assert _native.reads(dtype)
        direct = tensor_partials(stored, Log2Histogram())
        widened = tensor_partials(stored.float(), Log2Histogram())
        assert torch.equal(direct[0], widened[0]), dtype
        assert torch.equal(direct[1], widened[1]), dtype
    assert not _native.reads(torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, *FP8])
def test_every_16_and_8_bit_value_is_decoded_as_torch_decodes_it(isa, dtype):
    bits = 16 if dtype == torch.float16 else 8
    codes = torch.arange(2**bits, dtype=torch.int32)
    stored = codes.to(torch.int16 if bits == 16 else torch.uint8).view(dtype)
    stored = torch.cat([stored] * (1 + PARALLEL_MIN // stored.numel()))  # also on two threads
    widened = stored.float()
    for threads in (1, 2):
        with _threads(threads):
            direct = tensor_partials(stored, Log2Histogram())
        torch_row, torch_bins = _torch_kernels.float32_partials_and_bins(widened)
        assert torch.equal(direct[1], _torch_kernels.count_bins(torch_bins, 256))
        exact = [int(field) for field in EXACT_FIELDS]
        assert torch.equal(direct[0][exact], torch_row[exact])
        pairs = torch.zeros(1, 2, dtype=torch.float64)
        with _threads(threads):
            _partials.write_extremes(stored, pairs, 0)
        assert pairs.isnan().all()  # every code includes a NaN
        finite = widened[widened.isfinite()]
        check_stats(row_stats(finalize(direct[0][None]), 0), reference_stats(values_of(stored)))
        assert direct[0][Field.MIN] == finite.min()
        assert direct[0][Field.MAX] == finite.max()


def test_float16_subnormals_survive_flush_denormal():
    x = torch.tensor([2.0**-24, -(2.0**-20), 6e-5, 0.0, 1.0], dtype=torch.float16)
    x = x.repeat(20_000)
    torch.set_flush_denormal(True)
    try:
        row, hist = tensor_partials(x, Log2Histogram())
    finally:
        torch.set_flush_denormal(False)
    _, hist_ref = tensor_partials(x.float(), Log2Histogram())
    assert torch.equal(hist, hist_ref)
    assert row[Field.MIN].item() == -(2.0**-20)
    assert row[Field.ZEROS].item() == 20_000


# The linear histogram --------------------------------------------------------------------


def _linear_cases() -> list[tuple[str, LinearHistogram]]:
    return [
        ("one bin", LinearHistogram(-1.0, 1.0, 1)),
        ("tenths", LinearHistogram(0.0, 1.0, 10)),  # edges that float64 does not hold
        ("64 bins", LinearHistogram(-4.0, 4.0, 64)),
        ("more bins than a log2 row", LinearHistogram(-3.0, 3.0, 1000)),
        ("beyond float32", LinearHistogram(-(2.0**130), 2.0**130, 4)),
        ("narrow", LinearHistogram(0.0, 1e-46, 4)),
    ]


def _near_edges(spec: LinearHistogram, rng: np.random.Generator, n: int) -> np.ndarray:
    """Values on, just below and just above the float64 edges, and the float32 next to them."""
    width = (spec.hi - spec.lo) / spec.bins
    edges = spec.lo + np.arange(spec.bins + 1) * width
    picked = rng.choice(edges, n)
    values = np.concatenate([picked, np.nextafter(picked, -np.inf), np.nextafter(picked, np.inf)])
    values = np.concatenate([values, rng.uniform(spec.lo - width, spec.hi + width, n)])
    special = rng.random(values.size) < 0.02
    values[special] = rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0], special.sum())
    return values


@pytest.mark.parametrize(("name", "spec"), _linear_cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_histogram_counts_as_the_torch_kernel(isa, name, spec, dtype):
    rng = np.random.default_rng(len(name))
    x = torch.from_numpy(_near_edges(spec, rng, 30_000)).to(dtype)
    flat = x.float()
    want_hist = _torch_kernels.histogram_counts(flat, spec)
    want_row = _torch_kernels.float32_partials(flat)
    for threads in (1, 2):
        with _threads(threads):
            assert _partials._native_reads(x, spec)
            row, hist = tensor_partials(x, spec)
        assert torch.equal(hist, want_hist), name
        exact = [int(field) for field in EXACT_FIELDS]
        assert torch.equal(row[exact], want_row[exact])
        check_stats(row_stats(finalize(row[None]), 0), reference_stats(values_of(x)))
        # and against the edges themselves, as numpy compares
        a = values_of(x)
        edges = spec.lo + (spec.hi - spec.lo) / spec.bins * np.arange(spec.bins + 1)
        edges[-1] = spec.hi
        slots = np.searchsorted(edges, a[~np.isnan(a)], side="right")
        np.testing.assert_array_equal(hist.numpy(), np.bincount(slots, minlength=spec.bins + 2))


def test_linear_edges_on_float32_values_round_as_the_torch_kernel_rounds(isa):
    # Ranges whose float64 edge k, lo + k * ((hi - lo) / bins), lands within an ulp or two of a
    # float32 value: which bin that value and its neighbours fall in hangs on each rounding
    # of the edge (a fused multiply-add there would move some).
    rng = np.random.default_rng(11)
    moved = 0
    for _ in range(400):
        lo, edge_value = np.sort(rng.standard_normal(2).astype(np.float32) * 4)
        bins = int(rng.integers(2, 50))
        k = int(rng.integers(1, bins))
        hi = float(lo) + (float(edge_value) - float(lo)) * bins / k
        spec = LinearHistogram(float(lo), hi, bins)
        near = np.nextafter(edge_value, [-np.inf, np.inf]).astype(np.float32)
        x = torch.from_numpy(np.array([edge_value, *near, lo], dtype=np.float32))
        x = x.repeat(300)
        want = _torch_kernels.histogram_counts(x, spec)
        _, hist = tensor_partials(x, spec)
        assert torch.equal(hist, want), (spec, x[:4].tolist(), hist.tolist(), want.tolist())
        width = (spec.hi - spec.lo) / spec.bins
        moved += float(edge_value) != spec.lo + k * width  # the edge is not the value itself
    assert moved > 20  # some edges round away from the value they were made from


def test_every_linear_histogram_watch_takes_is_one_the_kernel_takes():
    largest = LinearHistogram(0.0, 1.0, MAX_LINEAR_BINS)
    assert _native.reads_histogram(largest)
    assert _partials._native_reads(torch.ones(3), largest)


def test_a_linear_histogram_of_more_bins_than_the_kernel_takes_goes_to_torch(monkeypatch):
    # watch() bounds the bins below the kernel's own limit: lower that limit to reach the path.
    monkeypatch.setattr(_native, "MAX_LINEAR_BINS", 8)
    spec = LinearHistogram(0.0, 1.0, 9)
    assert not _native.reads_histogram(spec)
    assert not _partials._native_reads(torch.ones(3), spec)
    assert _native.reads_histogram(LinearHistogram(0.0, 1.0, 8))


@pytest.mark.parametrize(
    ("view", "in_place"),
    [
        (lambda x: x.t(), True),  # a permutation of contiguous memory: read where it lies
        (lambda x: x.reshape(6, 50, 400).permute(2, 0, 1), True),
        (lambda x: x[:1].t(), True),  # size-1 dimensions have any stride
        (lambda x: x[:, ::3], False),  # gaps
        (lambda x: x[:, :1].expand(300, 7), False),  # repeats
        (lambda x: x.half().t(), True),  # read as float16, where it lies
    ],
)
def test_views_are_read_in_place_where_their_values_fill_their_memory(view, in_place):
    x = torch.from_numpy(_values("specials_everywhere", 120_000, np.random.default_rng(5)))
    v = view(x.float().reshape(300, 400))
    assert (_native._readable(v) is v) == in_place
    _check_against_float64(v)


@pytest.mark.parametrize("histogram", [Log2Histogram(), LinearHistogram(-2.0, 2.0, 5), None])
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
    torch_row, torch_bins = _torch_kernels.float32_partials_and_bins(x)
    assert torch.equal(native[1], _torch_kernels.count_bins(torch_bins, 256))
    exact = [int(field) for field in EXACT_FIELDS]
    assert torch.equal(native[0][exact], torch_row[exact])
    assert native[0][Field.MEAN].item() == pytest.approx(torch_row[Field.MEAN].item(), rel=1e-12)
    assert native[0][Field.M2].item() == pytest.approx(torch_row[Field.M2].item(), rel=1e-10)


def test_a_leading_nan_keeps_the_variance_of_offset_data():
    # The sums are shifted by the first finite value: with a shift of 0, squares - sum**2/n
    # would cancel to a few percent here.
    a = 1e4 + 0.01 * np.random.default_rng(3).standard_normal(300_000)
    a[0] = math.nan
    a[1] = -math.inf
    x = torch.from_numpy(a).float()
    want = reference_stats(values_of(x))
    for row in (tensor_partials(x, None)[0], _torch_kernels.float32_partials(x)):
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
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
    with _threads(threads):
        _native.extremes_into(x, pairs, 1)
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
