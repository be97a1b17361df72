"""The gradient noise scale of a recorded step, from its micro-batches' gradients.

McCandlish et al. (2018), "An Empirical Model of Large-Batch Training", appendix A.1: a step
of ``k`` micro-batches of ``b`` examples has gradients ``g_i`` (each the mean over its
micro-batch's examples). With ``|G_small|^2`` the mean over micro-batches of ``|g_i|^2`` and
``|G_big|^2`` the squared norm of their mean, unbiased estimates of the true gradient's
squared norm, of the trace of the per-example gradients' covariance, and their ratio are::

    |G|^2    = (k |G_big|^2 - |G_small|^2) / (k - 1)
    tr(Sigma) = b k (|G_small|^2 - |G_big|^2) / (k - 1)
    B_simple = tr(Sigma) / |G|^2

for each watched module's own parameters and for all of them together (the model).

Each micro-batch's gradient is read where autograd brings it to a parameter, before it is added
to ``.grad``: a hook on the parameter takes its squared norm, and its dot product with ``.grad``
as it stands then (the sum of the micro-batches before it). These add up to both norms without
a copy of the gradients: ``|d_1 + ... + d_k|^2 = sum_i |d_i|^2 + 2 <d_1 + ... + d_{i-1}, d_i>``.
That takes ``.grad`` to be zero or None before the step's first backward pass, as in every
accumulation loop. The loss of each micro-batch is taken to be its examples' mean divided by
``k`` (as accelerate, Lightning and the Hugging Face Trainer do), so that ``g_i = k d_i``: a
loop that does not divide scales ``|G|^2`` and ``tr(Sigma)`` by ``k^2``, and ``B_simple``, a
ratio, not at all. So does GradScaler's loss scale: its ``S^2`` is in both.

The hooks are on the parameters only while a recorded step is in progress: an unrecorded step
carries none. The sums stay on the gradients' device, and go out as the step's scalars. Under
FSDP no hook sees a micro-batch's own gradient (they reach the parameters reduced to shards):
the estimate is not made there, with one warning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from layerscope.distributed import shard_label
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._handles import HookHandles, in_backward, weak_hook
from layerscope.hooks._steps import StepClock
from layerscope.hooks._values import named_tensors
from layerscope.recording import Recorder

PREFIX = "noise"
# The scalars of each group: "noise/<module>/<name>", and "noise/<name>" for the model.
B_SIMPLE, GRAD_NORM_SQ, TRACE_COV = "B_simple", "grad_norm_sq", "trace_cov"


def noise_estimates(
    small: Tensor, big: Tensor, micro_batches: int, batch: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``(|G|^2, tr(Sigma), B_simple)`` from ``|G_small|^2`` and ``|G_big|^2`` (any shape).

    Args:
        small: the mean over micro-batches of each one's squared gradient norm.
        big: the squared norm of the micro-batches' mean gradient.
        micro_batches: ``k``, at least 2.
        batch: ``b``, the examples in each micro-batch.

    Examples:
        >>> g2, trace, b_simple = noise_estimates(torch.tensor(3.0), torch.tensor(2.0), 2, 4)
        >>> g2.item(), trace.item(), b_simple.item()
        (1.0, 8.0, 8.0)
    """
    k = micro_batches
    grad_norm_sq = (k * big - small) / (k - 1)
    trace_cov = (small - big) * (batch * k / (k - 1))
    return grad_norm_sq, trace_cov, trace_cov / grad_norm_sq


class NoiseScale:
    """The gradient noise scale of each recorded step, as its scalars; off: does nothing.

    Args:
        root: the model: with ``batch=True`` its first training forward of a recorded step
            tells the micro-batch size (the leading dimension of the first tensor it takes).
        targets: the watched modules.
        batch: False (off), True (inferred) or the micro-batch size.
        clock: steps and gates.
        recorder: where the scalars go.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
    """

    def __init__(
        self,
        root: nn.Module,
        targets: Sequence[tuple[str, nn.Module]],
        batch: bool | int,
        clock: StepClock,
        recorder: Recorder,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
    ) -> None:
        self._root = root
        self._on = batch is not False
        self._given_batch = None if isinstance(batch, bool) else batch
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._params: list[Tensor] = []
        self._groups: dict[str, list[int]] = {}  # module name -> positions in _params
        if self._on:
            self._params, self._groups = _own_parameters(targets)
        if self._params and _sharded(root, self._params):
            # FSDP reduces each gradient to its shards before any hook on the parameter sees
            # it: there is no micro-batch's own gradient to read.
            self._on, self._params, self._groups = False, [], {}
            fail("estimating the gradient noise scale", ValueError(
                "noise_scale: not available under FSDP, which shards each micro-batch's "
                "gradients before a parameter's hook sees them"))  # fmt: skip
        self._handles = HookHandles()
        self._squares: list[Tensor | None] = []  # per parameter: sum_i |d_i|^2
        self._cross: list[Tensor | None] = []  # per parameter: sum_i <d_1 + ... + d_{i-1}, d_i>
        self._counts: list[int] = []  # per parameter: micro-batches that reached it
        self._batch: int | None = None  # the micro-batch size, as inferred in this step
        self._reset()

    def __len__(self) -> int:
        """How many hooks are on now."""
        return len(self._handles)

    def step_begins(self) -> None:
        """A step begins: if it records, hook the parameters (and the model's forward)."""
        if not self._on or not self._clock.step_records or len(self._handles):
            return
        for position, param in enumerate(self._params):
            hook = partial(weak_hook(self._on_grad), position)
            self._handles.add(param.register_hook(hook))  # type: ignore[no-untyped-call]  # untyped in torch
        if self._given_batch is None:
            self._handles.add(
                self._root.register_forward_pre_hook(weak_hook(self._on_forward), with_kwargs=True)
            )

    def step_ends(self, step: int, skipped: bool) -> None:
        """The step ends: record its estimates (not a skipped step's), and unhook."""
        if not len(self._handles):
            return
        try:
            if not skipped:
                self._meter.timed(self._record, step)
        except Exception as error:
            self._fail("estimating the gradient noise scale", error)
        finally:
            self._handles.remove()
            self._reset()

    def remove(self) -> None:
        """Take every hook off and let go of the parameters."""
        self._handles.remove()
        self._reset()
        self._params = []
        self._groups = {}

    # ---------------------------------------------------------------- hooks

    def _on_forward(self, module: nn.Module, args: Any, kwargs: Mapping[str, Any]) -> None:
        if self._batch is not None or not (module.training and torch.is_grad_enabled()):
            return
        if in_backward():  # activation checkpointing recomputing the forward
            return
        first = next(named_tensors((args, kwargs), "in"), None)
        if first is not None and first[1].dim() > 0:
            self._batch = int(first[1].shape[0])

    def _on_grad(self, position: int, grad: Tensor) -> None:
        """Micro-batch ``i``'s gradient ``d_i`` of one parameter, before ``.grad`` takes it."""
        if torch.compiler.is_compiling() or not len(self._handles):
            return
        start = time.perf_counter()
        try:
            with torch.no_grad():
                dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
                flat = grad.detach().reshape(-1).to(dtype)
                square = torch.dot(flat, flat)
                held = self._params[position].grad  # d_1 + ... + d_{i-1}, or None
                if held is not None:
                    cross = torch.dot(held.detach().reshape(-1).to(dtype), flat)
                    self._cross[position] = _plus(self._cross[position], cross)
                self._squares[position] = _plus(self._squares[position], square)
                self._counts[position] += 1
        except Exception as error:
            self._fail("reading a micro-batch's gradient for the noise scale", error)
        finally:
            self._meter.seconds += time.perf_counter() - start

    # ---------------------------------------------------------------- the step's estimates

    def _record(self, step: int) -> None:
        k = max(self._counts, default=0)  # backward passes: those that reached a parameter
        if k < 2:
            return  # one micro-batch: its gradient is the step's, no variance to estimate
        batch = self._given_batch or self._batch
        if batch is None:
            raise ValueError(
                "the micro-batch size could not be inferred from the model's input: pass it "
                "as watch(noise_scale=<examples per micro-batch>)"
            )
        # Per parameter: sum_i |d_i|^2, and |sum_i d_i|^2 = sum_i |d_i|^2 + 2 <d_<i, d_i>.
        squares: dict[int, Tensor] = {}
        square_of_sums: dict[int, Tensor] = {}
        for position, square in enumerate(self._squares):
            if square is not None:
                squares[position] = square
                cross = self._cross[position]
                square_of_sums[position] = square if cross is None else square + 2 * cross
        groups = {"": list(squares)}  # the model: every watched parameter
        for module, positions in self._groups.items():
            mine = [position for position in positions if position in squares]
            if mine:
                groups[module] = mine
        scalars: dict[str, Tensor] = {}
        for module, members in groups.items():
            # g_i = k d_i: |G_small|^2 = (1/k) sum_i |k d_i|^2; G_big = sum_i d_i.
            small = k * _total([squares[p] for p in members])
            big = _total([square_of_sums[p] for p in members])
            estimates = noise_estimates(small, big, k, batch)
            prefix = f"{PREFIX}/{module}/" if module else f"{PREFIX}/"
            for name, value in zip((GRAD_NORM_SQ, TRACE_COV, B_SIMPLE), estimates, strict=True):
                scalars[prefix + name] = value
        self._recorder.add_scalars(step, scalars)

    def _reset(self) -> None:
        count = len(self._params)
        self._squares = [None] * count
        self._cross = [None] * count
        self._counts = [0] * count
        self._batch = None


def _own_parameters(
    targets: Sequence[tuple[str, nn.Module]],
) -> tuple[list[Tensor], dict[str, list[int]]]:
    """The targets' trainable parameters, each once, and each module's (its own, tied too).

    The root's own parameters (a module named ``""``) count for the model only.
    """
    params: list[Tensor] = []
    positions: dict[int, int] = {}
    groups: dict[str, list[int]] = {}
    for name, module in targets:
        for param in module.parameters(recurse=False):
            if not param.requires_grad:
                continue
            position = positions.setdefault(id(param), len(params))
            if position == len(params):
                params.append(param)
            if name:
                groups.setdefault(name, []).append(position)
    return params, groups


def _sharded(root: nn.Module, params: Sequence[Tensor]) -> bool:
    """Whether FSDP shards the model: FSDP2's DTensor parameters, or FSDP's wrapper."""
    if any(shard_label(param) is not None for param in params):
        return True
    return any(type(module).__name__ == "FullyShardedDataParallel" for module in root.modules())


def _plus(total: Tensor | None, value: Tensor) -> Tensor:
    return value if total is None else total + value


def _total(values: list[Tensor]) -> Tensor:
    """The sum of 0-d tensors, on the first one's device (a model split over devices too)."""
    if len(values) == 1:
        return values[0]
    device = values[0].device
    return torch.stack([value.to(device, non_blocking=True) for value in values]).sum()
