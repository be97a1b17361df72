"""The gradient rules on hand-made rows: an output gradient judged against its own past, and
modules never called as modules left out of the forward order the rules compare along."""

from __future__ import annotations

import pytest
import torch

from layerscope.health import Alert, HealthMonitor, parse_alerts
from layerscope.model import CallEvent, Form, Identities, Identity, Kind, ModuleInfo, StatsRows

CHAIN = ("fc1", "act1", "fc2", "act2", "head")
NUMEL = 64.0


def _infos(names: tuple[str, ...]) -> list[ModuleInfo]:
    root = ModuleInfo("", "Net", {}, 0, 0, names, True)
    return [root, *(ModuleInfo(n, "Linear", {}, 0, 0, (), True) for n in names)]


def _exits(names: tuple[str, ...]) -> list[CallEvent]:
    return [CallEvent(0, i, "exit", name, 0) for i, name in enumerate(names)]


def _flush(
    identities: Identities, step: int, rows: list[tuple[str, Kind, str, float]]
) -> list[StatsRows]:
    """One recorded training step's rows: (module, kind, tensor, root mean square) each."""
    codes = [identities.code(Identity("train", m, "Linear", k, t, 0)) for m, k, t, _ in rows]
    rms = torch.tensor([r for *_, r in rows], dtype=torch.float64)
    count = len(rows)
    stats = {
        "numel": torch.full((count,), NUMEL, dtype=torch.float64),
        "l2": rms * NUMEL**0.5,
        "nan_count": torch.zeros(count, dtype=torch.int64),
        "inf_count": torch.zeros(count, dtype=torch.int64),
    }
    form = identities.form_code(Form("float32", (8, 8)))
    step_column = torch.full((count,), step, dtype=torch.int64)
    codes_column = torch.tensor(codes, dtype=torch.int64)
    forms = torch.full((count,), form, dtype=torch.int64)
    return [StatsRows(step_column, codes_column, forms, identities, 0, stats)]


def _run(
    steps: dict[int, list[tuple[str, Kind, str, float]]], called: tuple[str, ...], names=CHAIN
) -> list[Alert]:
    monitor = HealthMonitor(parse_alerts(True), _infos(names))
    monitor.learn_calls(_exits(called))
    identities = Identities()
    alerts = []
    for step, rows in steps.items():
        alerts += monitor.observe(_flush(identities, step, rows), [])
    return [a for a in alerts if a.rule in ("vanishing_grad", "exploding_grad")]


def _outputs(scales: list[float]) -> list[tuple[str, Kind, str, float]]:
    return [(name, Kind.GRAD, "output", scale) for name, scale in zip(CHAIN, scales, strict=True)]


def test_a_gradient_grown_a_thousandfold_past_its_own_steps_explodes_where_it_starts():
    # Output gradients of a chain, the first layers' smaller (as backward leaves them). A
    # GradScaler's scale that doubles at step 3 moves them all twice over: no growth. At
    # step 100 a loss multiplied by 1,000 (with clipping, the parameters' gradients stay
    # as they were) grows every one of them, and none relative to the others.
    usual = [1e-3, 2e-3, 3e-3, 4e-3, 1e-2]
    steps = {step: _outputs(usual) for step in range(3)}
    steps[3] = _outputs([2 * s for s in usual])
    steps[100] = _outputs([1000 * s for s in usual])
    alerts = _run(steps, CHAIN)
    assert [(a.rule, a.module, a.step) for a in alerts] == [("exploding_grad", "head", 100)]
    assert alerts[0].threshold == 50.0
    assert alerts[0].value == pytest.approx(1000.0)  # the median of 1e-2, 1e-2, 1e-2, 2e-2
    assert "times its median over its last 4 recorded steps" in alerts[0].message


def test_a_module_never_called_as_a_module_is_not_ranked_after_the_head():
    # Three modules whose parameters their parent uses directly (``out_proj`` of
    # nn.MultiheadAttention) come after the head in named_modules(): their tiny gradients
    # were "the layers after" the head, whose gradient was then 1e7 times their median.
    names = (*CHAIN, "attn.out_proj", "attn2.out_proj", "attn3.out_proj")
    weights = [(n, Kind.WEIGHT_GRAD, "weight", 1e-3) for n in CHAIN]
    unused = [(n, Kind.WEIGHT_GRAD, "weight", 1e-8) for n in names[len(CHAIN) :]]
    steps = dict.fromkeys(range(4), weights + unused)
    assert not _run(steps, CHAIN, names)
    # They are still judged on their own: a parameter's gradient above 1e3 explodes.
    steps = {
        step: [*weights, ("attn.out_proj", Kind.WEIGHT_GRAD, "weight", 1e4)] for step in (0, 1)
    }
    alerts = _run(steps, CHAIN, names)
    assert [(a.rule, a.module, a.step) for a in alerts] == [("exploding_grad", "attn.out_proj", 1)]
