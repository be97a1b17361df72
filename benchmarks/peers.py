"""What other tools do each step, set up for the overhead benchmark.

Each peer is a context manager over a model (and its optimizer) with an ``after_step(loss)``
to call once per training step. A peer whose package is not installed raises ImportError, and
the benchmark reports it as skipped.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn


class Peer(Protocol):
    def after_step(self, loss: torch.Tensor) -> None: ...

    def settle(self) -> None:
        """Finish work the peer left to a background thread, inside the timed block."""

    def close(self) -> None: ...


class Textbook:
    """The hooks most people write: one ``.item()`` per statistic, every module, every step.

    Forward hooks on leaf modules read the output; a tensor hook reads its gradient; weights and
    their gradients are read after backward. Each statistic is a Python float.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.rows: list[dict[str, float]] = []
        self.model = model
        self.handles = [
            module.register_forward_hook(self._forward)
            for module in model.modules()
            if next(module.children(), None) is None
        ]

    @staticmethod
    def stats(tensor: torch.Tensor) -> dict[str, float]:
        tensor = tensor.detach().float()
        return {
            "mean": tensor.mean().item(),
            "std": tensor.std().item(),
            "min": tensor.min().item(),
            "max": tensor.max().item(),
            "absmax": tensor.abs().max().item(),
            "norm": tensor.norm().item(),
            "zero_frac": (tensor == 0).float().mean().item(),
            "nan": torch.isnan(tensor).sum().item(),
            "inf": torch.isinf(tensor).sum().item(),
        }

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            self.rows.append(self.stats(output))
            if output.requires_grad:
                output.register_hook(lambda grad: self.rows.append(self.stats(grad)) and None)

    def after_step(self, loss: torch.Tensor) -> None:
        # Called after optimizer.step(): gradients are still there until zero_grad.
        for parameter in self.model.parameters():
            self.rows.append(self.stats(parameter))
            if parameter.grad is not None:
                self.rows.append(self.stats(parameter.grad))
        self.rows.clear()

    def settle(self) -> None:
        pass  # synchronous

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class TensorBoardHistograms:
    """The common TensorBoard loop: ``add_histogram`` of every parameter and gradient."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = tempfile.TemporaryDirectory()
        self.writer = SummaryWriter(self.directory.name)
        self.model = model
        self.step = 0

    def after_step(self, loss: torch.Tensor) -> None:
        for name, parameter in self.model.named_parameters():
            self.writer.add_histogram(f"weight/{name}", parameter, self.step)
            if parameter.grad is not None:
                self.writer.add_histogram(f"grad/{name}", parameter.grad, self.step)
        self.writer.add_scalar("loss", loss.item(), self.step)
        self.step += 1

    def settle(self) -> None:
        self.writer.flush()  # events are written by a background thread

    def close(self) -> None:
        self.writer.close()
        self.directory.cleanup()


class WandbWatch:
    """``wandb.watch(model, log="all", log_freq=1)`` in offline mode."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import wandb

        self.directory = tempfile.TemporaryDirectory()
        os.environ["WANDB_SILENT"] = "true"
        # Its system monitor samples the machine in the background all the time, which would
        # slow whatever configuration runs then; watch() is what is measured here.
        settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, disable_git=True)
        self.run = wandb.init(
            mode="offline", dir=self.directory.name, project="overhead", settings=settings
        )
        self.run.watch(model, log="all", log_freq=1)
        self.model = model

    def after_step(self, loss: torch.Tensor) -> None:
        self.run.log({"loss": loss.item()})

    def settle(self) -> None:
        # Offline, the wandb-core process takes the histograms and writes them; there is no
        # public call to wait for it, so wait until our child processes stop using the CPU.
        _wait_for_idle_children()

    def close(self) -> None:
        self.run.unwatch(self.model)
        self.run.finish()
        self.directory.cleanup()


class Torchember:
    """torchember 0.2.7: every module's inputs and outputs, then ``log_model()`` each step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.directory = tempfile.TemporaryDirectory()
        self.home = os.environ.get("HOME")
        os.environ["HOME"] = self.directory.name  # it writes under ~/.torchember
        from torchember.core import torchEmber

        self.ember = torchEmber(model)

    def after_step(self, loss: torch.Tensor) -> None:
        self.ember.log_model()

    def settle(self) -> None:
        pass  # synchronous

    def close(self) -> None:
        self.ember.disarm()
        if self.home is not None:
            os.environ["HOME"] = self.home
        self.directory.cleanup()


class TorchfuncRecorders:
    """torchfunc 0.2.0: ForwardOutput and BackwardOutput recorders on every leaf module.

    Its reduction keeps only the latest tensor, so memory stays bounded; it records tensors,
    not statistics, which is what torchfunc offers.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from torchfunc.hooks import recorders

        def keep_latest(accumulated: Any, new: Any) -> Any:
            return new

        leaves = tuple({type(m) for m in model.modules() if next(m.children(), None) is None})
        self.forward = recorders.ForwardOutput(reduction=keep_latest).modules(model, types=leaves)
        self.backward = recorders.BackwardOutput(reduction=keep_latest).modules(model, types=leaves)

    def after_step(self, loss: torch.Tensor) -> None:
        pass

    def settle(self) -> None:
        pass  # synchronous

    def close(self) -> None:
        for recorder in (self.forward, self.backward):
            for handle in recorder.handles:
                handle.remove()


def _wait_for_idle_children(quiet_polls: int = 3, poll: float = 0.02) -> None:
    """Return once the CPU time of this process's descendants stopped growing (Linux)."""
    last, still = _children_cpu_ticks(), 0
    while still < quiet_polls:
        time.sleep(poll)
        now = _children_cpu_ticks()
        still = still + 1 if now == last else 0
        last = now


def _children_cpu_ticks() -> int:
    parents = {os.getpid()}
    ticks = 0
    try:
        stats = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as file:
                        fields = file.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                stats.append((int(entry), int(fields[1]), int(fields[11]) + int(fields[12])))
    except OSError:  # no /proc: nothing to wait for
        return 0
    grew = True
    while grew:  # descendants at any depth
        grew = False
        for pid, parent, _ in stats:
            if parent in parents and pid not in parents:
                parents.add(pid)
                grew = True
    for pid, _, used in stats:
        if pid in parents and pid != os.getpid():
            ticks += used
    return ticks


PEERS: dict[str, Any] = {
    "textbook .item() hooks": Textbook,
    "TensorBoard add_histogram": TensorBoardHistograms,
    "wandb.watch(log='all', log_freq=1)": WandbWatch,
    "torchember 0.2.7": Torchember,
    "torchfunc 0.2.0 recorders": TorchfuncRecorders,
}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the peers' printing."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield
