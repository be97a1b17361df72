"""Kernel launches per recorded tensor on the GPU path, counted on the CPU.

The GPU path (the Triton kernels, parameters in groups) is forced on CPU tensors and run in
triton's interpreter; every aten op layerscope adds to a training step is counted through a
dispatch mode, against the same step of an unwatched copy. On a GPU each of these is a kernel
launch (or a copy) on the training thread: what fills the launch queue. A randomly initialised
GPT-2 of 2 layers (Hugging Face), every kind, AdamW: a recorded step, and a step that the
gradients' sentinel watches:

    TRITON_INTERPRET=1 python benchmarks/launches.py
"""

from __future__ import annotations

import collections
import copy
import os
import sys
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import layerscope
from layerscope.stats import _triton, _triton_kernels

KINDS = ("input", "activation", "grad", "weight", "weight_grad", "update", "buffer")
# Ops that launch nothing: allocations and views.
FREE = {
    "empty", "empty_strided", "view", "_unsafe_view", "as_strided", "detach", "alias", "t",
    "transpose", "permute", "expand", "slice", "select", "unsqueeze", "squeeze", "_reshape_alias",
}  # fmt: skip


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class CountLaunches:
    def __init__(self, kernel: object, launches: list[str]) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: tuple[int, ...]):  # type: ignore[no-untyped-def]
        run = self.kernel[grid]  # type: ignore[index]

        def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.launches.append("triton")
            with _disable_current_modes():
                return run(*args, **kwargs)

        return launch


def gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=32, vocab_size=128)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config), torch.randint(0, 128, (2, 32))


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def count(every: int | layerscope.Schedule, steps_before: int) -> dict[str, Any]:
    """Launches of the step after ``steps_before`` watched steps, against an unwatched step."""
    launches: list[str] = []
    for name in ("partials_kernel", "finish_kernel", "extremes_kernel", "extremes_finish_kernel"):
        kernel = getattr(_triton_kernels, name)
        setattr(_triton_kernels, name, CountLaunches(kernel, launches))
    model, ids = gpt2()
    plain = copy.deepcopy(model)
    plain_optimizer = torch.optim.AdamW(plain.parameters())
    step(plain, plain_optimizer, ids)
    with CountOps() as unwatched:
        step(plain, plain_optimizer, ids)
    optimizer = torch.optim.AdamW(model.parameters())
    with (
        _triton.on_cpu(),
        layerscope.watch(model, optimizer=optimizer, every=every, kinds=KINDS) as scope,
    ):
        for _ in range(steps_before):
            step(model, optimizer, ids)
        launches.clear()
        with CountOps() as watched:
            step(model, optimizer, ids)
        triton = len(launches)
    for name in ("partials_kernel", "finish_kernel", "extremes_kernel", "extremes_finish_kernel"):
        setattr(_triton_kernels, name, getattr(_triton_kernels, name).kernel)
    frame = scope.frame()
    own = watched.ops - unwatched.ops
    return {
        "rows": int((frame["step"] == steps_before).sum()),
        "modules": sum(1 for _ in model.modules()),
        "triton": triton,
        "aten": sum(n for op, n in own.items() if op not in FREE),
        "aten_ops": dict(sorted((op, n) for op, n in own.items() if op not in FREE)),
    }


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1: the GPU path is forced on CPU tensors")
    recorded = count(every=1, steps_before=1)
    sentinel = count(every=layerscope.Schedule(every=100, sentinel="gradients"), steps_before=2)
    print(f"GPT-2, 2 layers ({recorded['modules']} modules), every kind, AdamW:")
    for label, figures in (
        ("a recorded step", recorded),
        ("a step of the gradients' sentinel", sentinel),
    ):
        launched = figures["triton"] + figures["aten"]
        print(f"- {label}: {figures['rows']} rows, {figures['triton']} Triton launches, "
              f"{figures['aten']} other ops {figures['aten_ops']}: "
              f"{launched / figures['rows']:.2f} launches per row")  # fmt: skip


if __name__ == "__main__":
    main()
