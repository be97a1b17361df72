"""Float64 numpy references and hypothesis strategies shared by the stats tests.

Nothing here calls layerscope: every expected value is computed from the tensor's stored values
(``x.double().numpy()``, so fp16 and bf16 are taken after their rounding) in numpy float64.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from layerscope.stats import LOG2_BINS, Field
from layerscope.stats._layout import WIDTH

# Partials that merging and every kernel must reproduce exactly: counts and extremes.
EXACT_FIELDS = (
    Field.NUMEL,
    Field.COUNT,
    Field.MIN,
    Field.MAX,
    Field.ZEROS,
    Field.NAN,
    Field.INF,
    Field.NEG,
    Field.POS,
    Field.E4M3_OVER,
    Field.E4M3_UNDER,
    Field.E5M2_OVER,
    Field.E5M2_UNDER,
    Field.FP16_OVER,
    Field.FP16_UNDER,
    Field.BF16_OVER,
    Field.BF16_UNDER,
)

#: Each low-precision format's largest finite value and smallest positive subnormal, from the
#: formats' definitions (sign, exponent bits, mantissa bits, bias), not from layerscope.
FORMAT_LIMITS = {
    "E4M3": (1.75 * 2.0**8, 2.0 ** (1 - 7 - 3)),  # no Inf: all-ones exponent is normal but NaN
    "E5M2": (1.75 * 2.0**15, 2.0 ** (1 - 15 - 2)),
    "FP16": ((2 - 2.0**-10) * 2.0**15, 2.0 ** (1 - 15 - 10)),
    "BF16": ((2 - 2.0**-7) * 2.0**127, 2.0 ** (1 - 127 - 7)),
}


def headroom_reference(a: np.ndarray) -> dict[str, int]:
    """Per format: finite values with ``|x| > max`` and values with ``0 < |x| < smallest``."""
    magnitude = np.abs(a.astype(np.float64))
    counts = {}
    for name, (largest, smallest) in FORMAT_LIMITS.items():
        counts[f"{name}_OVER"] = int(
            np.count_nonzero(np.isfinite(magnitude) & (magnitude > largest))
        )
        counts[f"{name}_UNDER"] = int(np.count_nonzero((magnitude > 0) & (magnitude < smallest)))
    return counts


#: Deterministic, no example database, no per-example deadline (first calls warm torch up).
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
COUNT_DTYPES = (torch.int32, torch.int64, torch.bool)
ALL_DTYPES = FLOAT_DTYPES + COUNT_DTYPES

#: Values sprinkled into tensors; fp16 turns +-1e30 into +-inf and +-1e-30 into +-0.
SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, -1e-30)

#: (loc, scale) of the normal families: plain, "mean 1e4 std 1" (and 1e6, where float32 means
#: round by ~ulp(1e6) = 0.06 and only the correction terms keep std right), huge, tiny, constant.
FAMILIES = ((0.0, 1.0), (1e4, 1.0), (1e6, 1.0), (-1e4, 1e-2), (0.0, 1e30), (0.0, 1e-30), (3.0, 0.0))

# A finite element: zero, or a magnitude in [1e-30, 1e30]. Tensors whose every finite value is
# a float32 subnormal are left to a dedicated test in test_partials.py.
_ELEMENT = st.one_of(
    st.floats(-1e30, 1e30).map(lambda v: 0.0 if abs(v) < 1e-30 else v),
    st.sampled_from(SPECIALS),
)


def values_of(x: torch.Tensor) -> np.ndarray:
    """The flat values of ``x`` as stored: float64 for floating dtypes, else numpy's own."""
    x = x.detach().reshape(-1)
    return x.double().numpy() if x.is_floating_point() else x.numpy()


def counts_only(x: torch.Tensor) -> bool:
    return not x.is_floating_point()


def _finite(a: np.ndarray, only_counts: bool) -> np.ndarray:
    return np.empty(0) if only_counts else a[np.isfinite(a)].astype(np.float64)


def reference_row(a: np.ndarray, only_counts: bool = False) -> np.ndarray:
    """The row of partials the layout describes, computed in numpy float64."""
    finite = _finite(a, only_counts)
    n = finite.size
    mean = finite.mean() if n else 0.0
    row = np.zeros(WIDTH)
    row[Field.NUMEL] = a.size
    row[Field.COUNT] = n
    row[Field.MEAN] = mean
    row[Field.M2] = np.sum((finite - mean) ** 2) if n else 0.0
    row[Field.MIN] = finite.min() if n else math.inf
    row[Field.MAX] = finite.max() if n else -math.inf
    row[Field.ZEROS] = np.count_nonzero(a == 0)
    row[Field.NAN] = 0 if only_counts else np.count_nonzero(np.isnan(a))
    row[Field.INF] = 0 if only_counts else np.count_nonzero(np.isinf(a))
    row[Field.NEG] = np.count_nonzero(a < 0)
    row[Field.POS] = np.count_nonzero(a > 0)
    if not only_counts:
        for name, count in headroom_reference(a).items():
            row[Field[name]] = count
    return row


TINY = 2.0**-126  # smallest normal float32


def log2_reference(a: np.ndarray) -> np.ndarray:
    """Bin counts from np.frexp: |x| = m * 2**e with m in [0.5, 1), so 2**(e-1) <= |x| < 2**e.

    Bin k covers [2**(k-127), 2**(k-126)), so k = e + 126; |x| < 2**-126 is bin 0, non-finite
    bin 255, and finite float64 values beyond float32's range stay in bin 254.
    """
    index = np.full(a.shape, 255, dtype=np.int64)
    finite = np.isfinite(a)
    magnitude = np.abs(a[finite])
    _, exponent = np.frexp(magnitude)
    index[finite] = np.where(magnitude < TINY, 0, np.clip(exponent + 126, 1, 254))
    return np.bincount(index, minlength=LOG2_BINS)


def signed_log2_reference(a: np.ndarray) -> np.ndarray:
    """The log2 histogram split by sign: ``log2_reference`` of each sign's values, + first.

    The sign is the sign bit (``np.signbit``): -0.0, -inf and a NaN with the bit set count as
    negative.
    """
    negative = np.signbit(a)
    return np.concatenate([log2_reference(a[~negative]), log2_reference(a[negative])])


def reference_stats(a: np.ndarray, only_counts: bool = False) -> dict[str, float]:
    """What ``finalize`` should report for the values ``a``, straight from numpy."""
    finite = _finite(a, only_counts)
    n = finite.size
    numel = a.size
    nan = math.nan
    absmax = float(np.abs(finite).max()) if n else nan
    if n and absmax > 0:
        l2 = absmax * math.sqrt(np.sum((finite / absmax) ** 2))  # scaled: no overflow
    else:
        l2 = 0.0 if n else nan
    return {
        "numel": numel,
        "count": n,
        "mean": float(finite.mean()) if n else nan,
        "std": float(finite.std(ddof=1)) if n > 1 else nan,
        "mad": float(np.abs(finite - finite.mean()).mean()) if n else nan,
        "min": float(finite.min()) if n else nan,
        "max": float(finite.max()) if n else nan,
        "absmax": absmax,
        "l2": l2,
        "zero_frac": np.count_nonzero(a == 0) / numel if numel else nan,
        "neg_frac": np.count_nonzero(a < 0) / numel if numel else nan,
        "pos_frac": np.count_nonzero(a > 0) / numel if numel else nan,
        "nan_count": 0 if only_counts else int(np.count_nonzero(np.isnan(a))),
        "inf_count": 0 if only_counts else int(np.count_nonzero(np.isinf(a))),
        **{
            name.lower(): 0 if only_counts else count
            for name, count in headroom_reference(a).items()
        },
        **{
            f"{name.lower()}_scale_exp": brute_force_scale(absmax, largest)
            for name, (largest, _) in FORMAT_LIMITS.items()
        },
    }


def brute_force_scale(absmax: float, largest: float) -> float:
    """The largest k with absmax * 2**k <= largest, by stepping k (ldexp is exact here)."""
    if not (0 < absmax < math.inf):
        return math.nan
    k = 0
    while math.ldexp(absmax, k) > largest:
        k -= 1
    while math.ldexp(absmax, k + 1) <= largest:
        k += 1
    return float(k)


def _same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or got == want


def check_stats(
    got: dict[str, float], ref: dict[str, float], *, float64: bool = False, slack: float = 1.0
) -> None:
    """Assert finalize's output for one row against ``reference_stats``.

    Counts, fractions and extremes are exact. Moments are reduced in float32 (float64 inputs in
    float64) over values pre-scaled by a power of two, so the bounds are relative to the data's
    own scale (A = absmax, s = std, mad = mean absolute deviation; u = unit roundoff, 2**-24):

    - mean: the float32 mean is corrected by the float32 sum of the deviations from it, then
      added in float64, so what is left is the rounding of that sum, ~u*log2(n)*mad, plus
      second-order terms ~u**2*log2(n)*A: ``|mean - ref| <= 1e-5*mad + 1e-11*A``;
    - std: all terms of the float32 sum of squared deviations are >= 0, relative error
      ~u*log2(n); the subtracted (sum of deviations)**2/n carries the mean's rounding, an
      absolute floor ~u**1.5*A on std when the data are constant: ``<= 1e-4*s + 1e-10*A``
      (without that correction "mean 1e6 std 1" data come out percents off: a floor like
      1e-8*A would let that pass, this one does not);
    - l2 = sqrt(M2 + n*mean**2) adds two non-negative terms: ``<= 1e-4*l2``.

    ``slack`` widens the moment bounds for merged rows (each piece brings its own rounding).
    """
    for key in ("numel", "nan_count", "inf_count"):
        assert got[key] == ref[key], key
    for key in ("min", "max", "absmax", "zero_frac", "neg_frac", "pos_frac"):
        assert _same(got[key], ref[key]), (key, got[key], ref[key])
    for key in ref.keys() & got.keys():  # the formats' counts and scales: exact
        if key.startswith(("e4m3_", "e5m2_", "fp16_", "bf16_")):
            assert _same(got[key], ref[key]), (key, got[key], ref[key])
    for key in ("mean", "std", "l2"):
        assert math.isnan(got[key]) == math.isnan(ref[key]), (key, got[key], ref[key])
    if math.isnan(ref["mean"]):
        return
    a, mad, s = ref["absmax"], ref["mad"], ref["std"]
    if float64:
        mean_tol, std_tol, l2_tol = 1e-12 * mad + 1e-15 * a, 1e-10 * s + 1e-15 * a, 1e-12
    else:
        mean_tol, std_tol, l2_tol = 1e-5 * mad + 1e-11 * a, 1e-4 * s + 1e-10 * a, 1e-4
    assert abs(got["mean"] - ref["mean"]) <= slack * mean_tol, ("mean", got["mean"], ref)
    assert abs(got["l2"] - ref["l2"]) <= slack * l2_tol * ref["l2"], ("l2", got["l2"], ref)
    if not math.isnan(s):
        assert abs(got["std"] - s) <= slack * std_tol, ("std", got["std"], ref)


def row_stats(out: dict[str, torch.Tensor], i: int) -> dict[str, float]:
    """Row ``i`` of finalize's output as plain Python numbers."""
    return {key: value[i].item() for key, value in out.items()}


def _float_values(draw: st.DrawFn, numel: int) -> np.ndarray:
    if draw(st.booleans()):
        return np.array(draw(st.lists(_ELEMENT, min_size=numel, max_size=numel)), np.float64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    loc, scale = draw(st.sampled_from(FAMILIES))
    values = loc + scale * rng.standard_normal(numel)
    special = rng.random(numel) < draw(st.sampled_from((0.0, 0.05, 0.3)))
    values[special] = rng.choice(SPECIALS, size=int(special.sum()))
    return values


def _count_values(draw: st.DrawFn, numel: int, dtype: torch.dtype) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == torch.bool:
        return rng.integers(0, 2, numel).astype(bool)
    info = torch.iinfo(dtype)
    low, high = draw(st.sampled_from(((-3, 4), (0, 2), (info.min, info.max))))
    return rng.integers(low, high, numel, dtype=np.int64, endpoint=True)


@st.composite
def shapes(draw: st.DrawFn, max_dims: int = 3, max_side: int = 6) -> tuple[int, ...]:
    """0-d, empty and multi-dimensional shapes, plus the odd long vector."""
    if draw(st.integers(0, 9)) == 0:
        return (draw(st.integers(100, 3000)),)
    dims = draw(st.sampled_from((0, *range(1, max_dims + 1), *range(2, max_dims + 1))))
    return tuple(draw(st.lists(st.integers(0, max_side), min_size=dims, max_size=dims)))


@st.composite
def tensors(
    draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = ALL_DTYPES, max_dims: int = 3
) -> torch.Tensor:
    """A tensor of any drawn dtype and shape, contiguous, transposed or strided."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(max_dims=max_dims))
    numel = math.prod(shape)
    if dtype.is_floating_point:
        values = _float_values(draw, numel)
    else:
        values = _count_values(draw, numel, dtype)
    x = torch.from_numpy(values).to(dtype).reshape(shape)
    layout = draw(st.sampled_from(("contiguous", "transposed", "strided")))
    if layout == "transposed" and x.dim() >= 2:
        x = x.permute(*reversed(range(x.dim())))
    elif layout == "strided" and x.dim() >= 1:
        wide = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
    return x
