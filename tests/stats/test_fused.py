"""The compiled kernel agrees with the eager one, and falls back to it when compiling fails."""

import subprocess
import sys

import pytest
import torch

from layerscope import LayerscopeWarning
from layerscope.stats import _torch_kernels

CASES = {
    "normal": torch.randn(10_000),
    "one": torch.tensor([3.5]),
    "two": torch.tensor([1.0, -2.0]),
    "offset": torch.randn(100_000) + 1e4,
    "huge": torch.randn(1000) * 1e30,
    "tiny": torch.randn(1000) * 1e-30,
    "subnormal": torch.tensor([1e-39, -1e-39, 0.0]),
    "non_finite": torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0, -3.0]),
    "all_nan": torch.full((7,), float("nan")),
    "signed_zeros_and_nan": torch.tensor([-0.0, 0.0, -1e-39, -float("nan"), float("nan"), -2.0]),
    "strided": torch.randn(64, 64).t()[::2].reshape(-1)[::3],
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_and_eager_kernels_agree(name):
    x = CASES[name]
    eager, eager_bins = _torch_kernels.float32_partials_and_bins(x.contiguous())
    fused, fused_bins = _torch_kernels.fused_float32(x, with_bins=True)
    assert _torch_kernels.compile_state == "ready"
    assert torch.equal(fused_bins, eager_bins)
    # The signed bins: the same slots, 256 more where the sign bit is set.
    _, eager_signed = _torch_kernels.float32_partials_and_signed_bins(x.contiguous())
    _, fused_signed = _torch_kernels.fused_float32(x, with_bins=True, signed=True)
    assert torch.equal(fused_signed, eager_signed)
    sign = torch.signbit(x.contiguous()).to(torch.int16)
    assert torch.equal(fused_signed, eager_bins.to(torch.int16) + 256 * sign)
    # The kernel without bins is another compiled kernel: its sums may run in another order
    # (inductor's cache may hold one made for another thread count), so it is held to the same
    # bounds, not to the same bits.
    for row in (fused, _torch_kernels.fused_float32(x, with_bins=False)):
        counts = [0, 1, 6, 7, 8, 9, 10]  # numel, count, zeros, nan, inf, neg, pos
        assert torch.equal(row[counts], eager[counts])
        assert torch.equal(row[4:6], eager[4:6])  # min and max are exact
        scale = max(float(eager[4:6].abs().nan_to_num(0, 0, 0).max()), 1e-300)
        assert abs(float(row[2] - eager[2])) <= 1e-12 * scale  # mean
        # M2: float64 sums in a different order; relative error, floored by the scale of x**2.
        assert torch.isclose(row[3], eager[3], rtol=1e-10, atol=1e-20 * scale**2 * x.numel())


def test_a_failing_compile_warns_once_and_falls_back_to_eager(monkeypatch):
    def broken(x):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(_torch_kernels, "_compiled", dict.fromkeys(_torch_kernels.KERNELS, broken))
    monkeypatch.setattr(_torch_kernels, "compile_state", "ready")
    x = torch.randn(100)
    with pytest.warns(LayerscopeWarning, match="no C compiler"):
        row = _torch_kernels.fused_float32(x, with_bins=False)
    assert torch.equal(row, _torch_kernels.float32_partials(x))
    assert _torch_kernels.compile_state == "failed"
    assert torch.equal(_torch_kernels.fused_float32(x, with_bins=False), row)  # no second warning


def test_layerscope_compile_0_keeps_the_eager_kernel():
    code = (
        "import torch; from layerscope.stats import _torch_kernels as k; "
        "k.fused_float32(torch.randn(10), False); print(k.compile_state)"
    )
    environment = {"LAYERSCOPE_COMPILE": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
    )
    assert out.stdout.strip() == "failed"
