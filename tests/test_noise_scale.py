"""The gradient noise scale: watch(noise_scale=) against a float64 estimator by hand."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import layerscope

K, B = 4, 8  # micro-batches per step, examples per micro-batch


def _by_hand(micro_grads, batch):
    """McCandlish et al.'s estimator, in float64 numpy, from each micro-batch's gradient."""
    k = len(micro_grads)
    small = np.mean([g @ g for g in micro_grads])
    mean = np.mean(micro_grads, axis=0)
    big = mean @ mean
    grad_norm_sq = (k * batch * big - batch * small) / (k * batch - batch)
    trace_cov = (small - big) / (1 / batch - 1 / (k * batch))
    return {
        "grad_norm_sq": grad_norm_sq,
        "trace_cov": trace_cov,
        "B_simple": trace_cov / grad_norm_sq,
    }


def _flat_grads(params, loss):
    grads = torch.autograd.grad(loss, params, retain_graph=True)
    return torch.cat([g.reshape(-1) for g in grads]).detach().double().numpy()


def _scalars(scope):
    frame = scope.frame("scalars")
    return {(int(row.step), row.name): row.value for row in frame.itertuples()}


def _mlp(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)


def _accumulate(model, optimizer, batches, expected=None):
    """One step of K micro-batches, each loss divided by K; the hand estimates of it too."""
    # The micro-batches' own gradients, by autograd on an unwatched copy of the model.
    reference = _mlp(next(model.parameters()).dtype)
    reference.load_state_dict(model.state_dict())
    modules = {"": list(reference.parameters()), "0": list(reference[0].parameters()),
               "2": list(reference[2].parameters())}  # fmt: skip
    for x, y in batches:
        if expected is not None:
            loss = (reference(x) - y).pow(2).mean()
            for name, params in modules.items():
                expected.setdefault(name, []).append(_flat_grads(params, loss))
        ((model(x) - y).pow(2).mean() / K).backward()
    optimizer.step()
    optimizer.zero_grad()


def _batches(generator, dtype):
    draw = lambda width: torch.randn(B, width, generator=generator, dtype=dtype)  # noqa: E731
    return [(draw(3), draw(2)) for _ in range(K)]


@pytest.mark.parametrize(
    ("dtype", "rel", "noise_scale"),
    [(torch.float64, 1e-9, B), (torch.float32, 2e-3, B), (torch.float64, 1e-9, True)],
)
def test_estimates_per_module_and_model_match_float64_by_hand(dtype, rel, noise_scale):
    model = _mlp(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    hand = {}
    with layerscope.watch(model, optimizer=optimizer, every=1, noise_scale=noise_scale) as scope:
        for step in range(3):
            expected = {}
            _accumulate(model, optimizer, _batches(generator, dtype), expected)
            for module, grads in expected.items():
                hand[step, module] = _by_hand(grads, B)
    recorded = _scalars(scope)
    for (step, module), estimates in hand.items():
        for name, value in estimates.items():
            key = f"noise/{module}/{name}" if module else f"noise/{name}"
            assert recorded[step, key] == pytest.approx(value, rel=rel), (step, key)
    assert scope.config.to_dict()["noise_scale"] == noise_scale


def test_without_an_optimizer_scope_step_ends_the_accumulated_step():
    model = _mlp(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(2)
    expected = {}
    with layerscope.watch(model, every=1, noise_scale=B) as scope:
        _accumulate(model, optimizer, _batches(generator, torch.float64), expected)
        scope.step()
    recorded = _scalars(scope)
    assert recorded[0, "noise/B_simple"] == pytest.approx(
        _by_hand(expected[""], B)["B_simple"], rel=1e-9
    )


def test_linear_regression_approaches_the_population_noise_scale():
    # y = x.w* + eps, x ~ N(0, I_d), eps ~ N(0, s^2), weights held at w: with d = w - w*,
    # the per-example gradient r x (r = x.d - eps) has mean d and covariance
    # (|d|^2 + s^2) I + d d^T, so |G|^2 = |d|^2 and tr(Sigma) = dim (|d|^2 + s^2) + |d|^2.
    dim, sigma, steps = 4, 0.5, 300
    generator = torch.Generator().manual_seed(3)
    w_star = torch.randn(dim, 1, generator=generator, dtype=torch.float64)
    model = nn.Linear(dim, 1, bias=False).double()
    delta = (model.weight.detach().T - w_star).reshape(-1)
    grad_norm_sq = float(delta @ delta)
    trace_cov = dim * (grad_norm_sq + sigma**2) + grad_norm_sq
    with layerscope.watch(model, every=1, kinds=("weight",), noise_scale=B) as scope:
        for _ in range(steps):
            for _ in range(K):
                x = torch.randn(B, dim, generator=generator, dtype=torch.float64)
                y = x @ w_star + sigma * torch.randn(B, 1, generator=generator, dtype=torch.float64)
                # Half the squared error: the per-example gradient is r x.
                (0.5 * (model(x) - y).pow(2).mean() / K).backward()
            scope.step()
            model.zero_grad()
    recorded = _scalars(scope)
    mean_g2 = np.mean([recorded[s, "noise/grad_norm_sq"] for s in range(steps)])
    mean_trace = np.mean([recorded[s, "noise/trace_cov"] for s in range(steps)])
    assert mean_g2 == pytest.approx(grad_norm_sq, rel=0.05)
    assert mean_trace == pytest.approx(trace_cov, rel=0.05)
    assert mean_trace / mean_g2 == pytest.approx(trace_cov / grad_norm_sq, rel=0.08)


def _hooks_on(params):
    return sum(len(param._backward_hooks or {}) for param in params)


def test_hooks_only_on_recorded_steps_and_training_unchanged():
    def train(watched, noise_scale):
        model = _mlp(torch.float32)
        params = list(model.parameters())
        optimizer = torch.optim.SGD(params, lr=0.1)
        generator = torch.Generator().manual_seed(4)
        losses, hooks = [], []
        scope = None
        if watched:
            scope = layerscope.watch(model, optimizer=optimizer, every=2, noise_scale=noise_scale)
        with scope or contextlib.nullcontext():
            for _ in range(4):
                hooks.append(_hooks_on(params))  # in the step, before its micro-batches
                for x, y in _batches(generator, torch.float32):
                    loss = (model(x) - y).pow(2).mean() / K
                    loss.backward()
                    losses.append(loss.detach().clone())
                optimizer.step()
                optimizer.zero_grad()
        return torch.stack(losses), hooks, scope and _scalars(scope)

    plain, _, _ = train(False, False)
    noisy, hooks, recorded = train(True, True)
    quiet, quiet_hooks, quiet_recorded = train(True, False)
    assert torch.equal(plain, noisy)  # bit for bit
    assert torch.equal(plain, quiet)
    # One per parameter on the recorded steps 0 and 2, else none; beside them, every step,
    # the one hook that checks a parameter's gradient was cleared (accumulating_grad).
    assert quiet_hooks == [1, 1, 1, 1]
    assert [n - q for n, q in zip(hooks, quiet_hooks, strict=True)] == [4, 0, 4, 0]
    assert {step for step, name in recorded if name.startswith("noise/")} == {0, 2}
    assert not [name for _, name in quiet_recorded if name.startswith("noise/")]


def test_a_step_of_one_backward_records_no_estimate_and_hooks_go_at_close():
    model = _mlp(torch.float32)
    params = list(model.parameters())
    with layerscope.watch(model, every=1, noise_scale=B) as scope:
        model(torch.randn(B, 3)).sum().backward()
        scope.step()
        assert _hooks_on(params) == 4
    assert _hooks_on(params) == 0
    assert not [name for _, name in _scalars(scope) if name.startswith("noise/")]


def test_unknown_micro_batch_size_warns_once_and_training_goes_on():
    model = _mlp(torch.float32)
    with layerscope.watch(model, every=1, noise_scale=True) as scope:
        for _ in range(K):  # backward passes with no forward of the model in the step
            model[0].weight.sum().backward()
        with pytest.warns(layerscope.LayerscopeWarning, match="noise_scale=<examples"):
            scope.step()
    assert not [name for _, name in _scalars(scope) if name.startswith("noise/")]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [("8", TypeError, "noise_scale: expected False, True or"), (0, ValueError, ">= 1, got 0")],
)
def test_bad_noise_scale_is_refused_by_name(value, error, match):
    with pytest.raises(error, match=match):
        layerscope.watch(nn.Linear(2, 2), noise_scale=value)


def test_the_steps_page_snippet_prints_what_the_page_shows(tmp_path):
    pytest.importorskip("pandas")
    snippets = Path(__file__).resolve().parents[1] / "docs" / "snippets"
    done = subprocess.run(
        [sys.executable, str(snippets / "noise_scale.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        # This layerscope, wherever the test found it (an installed copy, or src/).
        env={**os.environ, "PYTHONPATH": str(Path(layerscope.__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (snippets / "noise_scale.out").read_text()


def test_scalars_are_in_the_run_store(tmp_path):
    model = _mlp(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(5)
    expected = {}
    with layerscope.watch(model, optimizer=optimizer, run=tmp_path / "run", every=1,
                          noise_scale=B):  # fmt: skip
        _accumulate(model, optimizer, _batches(generator, torch.float64), expected)
    run = layerscope.load(tmp_path / "run")
    scalars = run.scalars.query("step == 0").set_index("name")["value"]
    by_hand = _by_hand(expected["2"], B)
    for name, value in by_hand.items():
        assert scalars[f"noise/2/{name}"] == pytest.approx(value, rel=1e-9)
    assert run.meta["config"]["noise_scale"] == B
