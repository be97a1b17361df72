"""Step-time overhead of layerscope on a GPU: GPT-2 124M, ResNet-50 and a stack of 300 blocks.

Measured as benchmarks/overhead.py measures the CPU: every configuration trains a fresh copy of
the model in each round, rounds interleave the configurations in a new order each round, each
configuration's mean step time is divided by the mean of two unwatched copies' in the same
round, and the figure is the median of these ratios over rounds; the second unwatched copy
against the first is the noise floor. Each block warms up with 2 steps, then times ``--steps``
steps between two ``torch.cuda.synchronize()``; work a configuration leaves to a background
thread (layerscope's writer, TensorBoard's event writer) finishes inside its block.

It also counts, per configuration, the host syncs a step makes on the training thread (CUDA
only: ``torch.cuda.set_sync_debug_mode("warn")``, each warning raised on the training thread
counted, over ``--sync-steps`` steps after the warm-up), and checks, per workload, one recorded
step's statistics against float64: the mean, std, min, max, abs-max, L2 norm and zero fraction
of every watched activation and weight, against the same tensor taken by a forward hook of its
own (or read after the optimizer step) and reduced in float64; and whether the whole tensors
that ``tensors=`` keeps are bit-equal to that tensor.

    python benchmarks/gpu.py                                      # gpt2, resnet50, stack
    python benchmarks/gpu.py --budget 480 --json gpu.json         # fits a 10-minute window
    python benchmarks/gpu.py --small --device cpu --rounds 2 --steps 3   # a dry run, ~1 min
    python benchmarks/gpu.py --write                              # also updates BENCHMARKS.md

Workloads: ``gpt2`` is Hugging Face's GPT2LMHeadModel(GPT2Config()) (124M parameters, random
initialisation) under bf16 autocast, batch 8 x 1,024 tokens, AdamW; ``resnet50`` is
torchvision's ResNet-50 (where torchvision is missing, a copy written here with the same
modules), bf16 autocast, channels_last, batch 128 of 224 x 224, SGD with momentum; ``stack`` is
300 residual blocks of Linear(256, 256), LayerNorm and GELU, batch 64 (1,202 modules): its
step is bound by kernel launches, where a cost per hooked module shows. ``--small`` shrinks
all three to run on a CPU in a minute or two, on one thread unless ``--threads`` says otherwise.

``--budget`` (seconds, counted from the start) splits what is left between the workloads still
to run, and a workload starts no new round that its previous round's duration says would end
past its share: a full run fits a device call's limit, with fewer rounds where it must. A
configuration whose warm-up steps are slow (TensorBoard's histograms of 124M parameters) times
fewer steps, at least 2, so that its block lasts about ``--block-cap`` seconds.

``hooks idle`` and the sentinels watch with ``Schedule(every=10**9)``: step 0, a warm-up step,
is recorded and none after it, so the timed steps are a real schedule's unrecorded steps.
``sentinel alone`` is the gradients' sentinel (``sentinel="gradients"``, what ``every=None``
runs between recorded steps on a GPU); ``sentinel=True`` reads every activation and output
gradient instead.
The row "defaults" is ``every=None`` measured over steps 2 to 2 + steps of a fresh watch: most
of them the first 10 steps, which the default schedule records. The long run, one recorded step
in 100, is derived: 0.99 x the unrecorded step + 0.01 x full, the unrecorded step being the
gradients' sentinel on a GPU (where ``every=None`` runs it) and hooks idle on the CPU (where it
does not).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import math
import platform
import random
import re
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
try:
    import layerscope
except ImportError:  # a checkout copied to a GPU machine, not installed there
    sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
    import layerscope
import report
from peers import TensorBoardHistograms, Textbook, quiet
from report import replace_section  # run as a script

STARTED = time.perf_counter()
WARMUP_STEPS = 2
# every=None records the first 10 steps, then one in 100 (layerscope's DEFAULT_SCHEDULE).
LONG_RUN_FRACTION = 1 / 100
STATS = ("mean", "std", "min", "max", "absmax", "l2", "zero_frac")


# ------------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    name: str
    description: str
    model: nn.Module  # on the device: every block trains a deep copy of it
    batches: list[tuple[torch.Tensor, torch.Tensor]]  # on the device, used in turn
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    kept: str  # regex of the modules whose whole tensors the exactness check keeps


def _batches(
    make: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        x, y = make(generator)
        batches.append((x.to(device), y.to(device)))
    return batches


def _gpt2(device: torch.device, small: bool) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    if small:
        config = GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=2,
            n_positions=64,
            vocab_size=256,
            bos_token_id=0,
            eos_token_id=0,
        )
        batch, length = 2, 32
    else:
        config = GPT2Config()  # GPT-2 small: 12 layers, d=768, 124M parameters
        batch, length = 8, 1024
    model = GPT2LMHeadModel(config).to(device).train()

    def tokens(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
        return ids, ids  # the model shifts the labels itself

    def loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return model(input_ids=ids, labels=labels).loss

    size = f"{config.n_layer} layers, d={config.n_embd}" if small else "124M parameters"
    return Workload(
        "gpt2",
        f"gpt2 = Hugging Face GPT2LMHeadModel ({size}, random init), bf16 autocast, "
        f"batch {batch} x {length} tokens, AdamW",
        model,
        _batches(tokens, device),
        loss,
        lambda parameters: torch.optim.AdamW(parameters, lr=1e-4),
        r"^transformer\.h\.0\.",
    )


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block (stride on the 3x3 conv), with the same module names."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)  # one module, called three times a block
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes * self.expansion:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * self.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * self.expansion),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    """torchvision's ``resnet50()``: blocks [3, 4, 6, 3], 151 modules, the same initialisation."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for index, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            stride = 1 if index == 0 else 2
            layer = [Bottleneck(inplanes, planes, stride)]
            inplanes = planes * Bottleneck.expansion
            layer += [Bottleneck(inplanes, planes) for _ in range(blocks - 1)]
            self.add_module(f"layer{index + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet50(device: torch.device, small: bool) -> Workload:
    try:
        from torchvision.models import resnet50

        model, source = resnet50(), "torchvision"
    except ImportError:
        model, source = ResNet50(), "written here, torchvision's layout"
    model = model.to(device).to(memory_format=torch.channels_last)
    batch, size = (2, 32) if small else (128, 224)

    def images(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, 3, size, size, generator=generator)
        return x.to(memory_format=torch.channels_last), torch.randint(
            0, 1000, (batch,), generator=generator
        )

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return nn.functional.cross_entropy(model(x), y)

    return Workload(
        "resnet50",
        f"resnet50 = ResNet-50 ({source}), bf16 autocast, channels_last, batch {batch} of "
        f"{size} x {size}, SGD with momentum",
        model,
        _batches(images, device),
        loss,
        lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
        r"^layer1\.0\.",
    )


class Block(nn.Module):
    """``x + GELU(LayerNorm(Linear(x)))``: three leaves, the block itself owns no parameter."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.norm(self.fc(x)))


def _stack(device: torch.device, small: bool) -> Workload:
    blocks, dim, batch = (10, 32, 8) if small else (300, 256, 64)
    # 1 + 4 x 300 + 1 = 1,202 modules; layerscope watches the 901 leaves.
    model = nn.Sequential(*(Block(dim) for _ in range(blocks)), nn.Linear(dim, 10)).to(device)

    def vectors(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, dim, generator=generator), torch.randint(
            0, 10, (batch,), generator=generator
        )

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    return Workload(
        "stack",
        f"stack = {blocks} residual blocks of Linear({dim}, {dim}), LayerNorm and GELU, then "
        f"Linear({dim}, 10), batch {batch}, float32, AdamW",
        model,
        _batches(vectors, device),
        loss,
        lambda parameters: torch.optim.AdamW(parameters, lr=1e-4),
        r"^0\.",
    )


WORKLOADS: dict[str, Callable[[torch.device, bool], Workload]] = {
    "gpt2": _gpt2,
    "resnet50": _resnet50,
    "stack": _stack,
}


# ------------------------------------------------------------------------ configurations


@dataclass
class Session:
    after_step: Callable[[torch.Tensor], None]
    settle: Callable[[], None]
    close: Callable[[], None]
    watched: int = 0  # modules that layerscope hooks; 0 for a peer


def _layerscope(**options: Any) -> Callable[[nn.Module, Any], Session]:
    def start(model: nn.Module, optimizer: Any) -> Session:
        scope = layerscope.watch(model, optimizer=optimizer, **options)
        watched = sum(info.watched for info in scope.modules)
        # The loss stays on the device: scope.step() costs no sync for it.
        return Session(lambda loss: scope.step(loss=loss), scope.flush, scope.close, watched)

    return start


def _peer(cls: Any) -> Callable[[nn.Module, Any], Session]:
    def start(model: nn.Module, optimizer: Any) -> Session:
        peer = cls(model, optimizer)
        return Session(peer.after_step, peer.settle, peer.close)

    return start


UNWATCHED, SECOND_COPY = "unwatched", "unwatched B"
IDLE, SENTINEL, FULL = "hooks idle", "sentinel alone", "full every step"
LAYER_SENTINEL = "sentinel of every layer"
EVERY_KIND, DEFAULTS, TEXTBOOK = "every kind", "defaults", "textbook hooks"
TENSORBOARD = "tensorboard add_histogram"
CONFIGS: dict[str, Callable[[nn.Module, Any], Session] | None] = {
    UNWATCHED: None,
    SECOND_COPY: None,
    # Step 0, a warm-up step, is recorded and no step after it: the timed steps are unrecorded
    # steps as a real schedule has them, with the first step's call-order hooks gone.
    IDLE: _layerscope(every=layerscope.Schedule(every=10**9, sentinel=False)),
    # The gradients' sentinel: what the defaults run between recorded steps on a GPU.
    SENTINEL: _layerscope(every=layerscope.Schedule(every=10**9, sentinel="gradients")),
    LAYER_SENTINEL: _layerscope(every=layerscope.Schedule(every=10**9, sentinel=True)),
    FULL: _layerscope(every=1),
    EVERY_KIND: _layerscope(every=1, kinds=[kind.value for kind in layerscope.Kind]),
    DEFAULTS: _layerscope(every=None),
    TEXTBOOK: _peer(Textbook),
    TENSORBOARD: _peer(TensorBoardHistograms),
}
LABELS = {
    SECOND_COPY: "unwatched, a second copy against the first (the noise floor: ideally 1.00x)",
    IDLE: "layerscope: hooks idle (an unrecorded step, no sentinel)",
    SENTINEL: "layerscope: sentinel alone (an unrecorded step; the gradients' sentinel)",
    LAYER_SENTINEL: "layerscope: sentinel=True (every activation and output gradient)",
    FULL: "layerscope: full, every step",
    EVERY_KIND: "layerscope: full, every kind (adds input, update, buffer), every step",
    DEFAULTS: "layerscope: defaults (every=None), steps 2 on: mostly the 10 dense steps",
    TEXTBOOK: "textbook hooks (.item() per statistic, same coverage as full)",
    TENSORBOARD: "TensorBoard add_histogram of every parameter and gradient",
}


# -------------------------------------------------------------------------------- training


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """A fresh copy of the workload's model and optimizer, watched by one configuration."""

    def __init__(self, workload: Workload, start: Callable[[nn.Module, Any], Session] | None):
        self.workload = workload
        self.model = copy.deepcopy(workload.model)
        self.optimizer = workload.make_optimizer(self.model.parameters())
        with quiet():
            self.session = start(self.model, self.optimizer) if start is not None else None
        self.done = 0

    def steps(self, count: int) -> None:
        batches = self.workload.batches
        with quiet():
            for _ in range(count):
                x, y = batches[self.done % len(batches)]
                loss = self.workload.loss(self.model, x, y)
                loss.backward()
                self.optimizer.step()
                if self.session is not None:
                    self.session.after_step(loss)
                self.optimizer.zero_grad()
                self.done += 1

    def settle(self) -> None:
        if self.session is not None:
            with quiet():
                self.session.settle()

    def close(self) -> None:
        if self.session is not None:
            with quiet():
                self.session.close()


def timed_block(
    workload: Workload,
    start: Callable[[nn.Module, Any], Session] | None,
    steps: int,
    block_cap: float,
    device: torch.device,
) -> tuple[float, int, float]:
    """Seconds per step, the steps timed, and the peak memory in GiB (0 on the CPU)."""
    trainer = Trainer(workload, start)
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        trainer.steps(WARMUP_STEPS)
        trainer.settle()
        _synchronize(device)
        warm_step = (time.perf_counter() - began) / WARMUP_STEPS
        steps = min(steps, max(2, math.ceil(block_cap / max(warm_step, 1e-9))))
        # The garbage of the last block and of this copy is collected now, not in a timed step.
        gc.collect()
        _synchronize(device)
        began = time.perf_counter()
        trainer.steps(steps)
        trainer.settle()  # background work is part of the cost
        _synchronize(device)
        seconds = (time.perf_counter() - began) / steps
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        return seconds, steps, peak
    finally:
        trainer.close()


def count_syncs(
    workload: Workload,
    start: Callable[[nn.Module, Any], Session] | None,
    steps: int,
    device: torch.device,
) -> tuple[int, int, int]:
    """Modules layerscope watches, and the host syncs over ``steps`` steps after the warm-up
    on the training thread and on the others (0, 0 off CUDA, where only the start is checked)."""
    trainer = Trainer(workload, start)
    try:
        watched = trainer.session.watched if trainer.session is not None else 0
        if device.type != "cuda" or steps == 0:
            return watched, 0, 0
        trainer.steps(WARMUP_STEPS)
        trainer.settle()
        _synchronize(device)
        training_thread = threading.current_thread()
        counts = {"training": 0, "other": 0}
        lock = threading.Lock()
        with warnings.catch_warnings():  # restores the filters and showwarning on exit
            warnings.simplefilter("always")  # one warning per sync, not one per place
            show_other = warnings.showwarning

            def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
                if "synchroniz" not in str(message):
                    show_other(message, category, *args, **kwargs)
                    return
                with lock:
                    mine = threading.current_thread() is training_thread
                    counts["training" if mine else "other"] += 1

            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.steps(steps)
                # Time for a writer thread's copies of these steps (other threads' syncs); the
                # synchronize below, which may warn too, waits until the mode is off.
                time.sleep(0.2)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        _synchronize(device)
        return watched, counts["training"], counts["other"]
    finally:
        trainer.close()


# ------------------------------------------------------------------------------ exactness


def _named_tensors(prefix: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A forward output's tensors named as layerscope names them: out, out.0, out.logits."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, Mapping):  # also Hugging Face's ModelOutput
        for key, item in value.items():
            yield from _named_tensors(f"{prefix}.{key}", item)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _named_tensors(f"{prefix}.{index}", item)


def _reference(tensor: torch.Tensor) -> torch.Tensor:
    """The statistics of STATS, in float64 on the tensor's device: (7,)."""
    values = tensor.detach().double()
    return torch.stack(
        [
            values.mean(),
            values.std(),
            values.min(),
            values.max(),
            values.abs().max(),
            values.norm(),
            (values == 0).double().mean(),
        ]
    )


def _error(got: float, want: float, scale: float, stat: str) -> float:
    """Relative error; absolute for the zero fraction; for a value that cancels to about 0
    (a LayerNorm's mean), relative to 1e-12 of the tensor's abs-max instead."""
    if math.isnan(got) or math.isnan(want):  # a missing statistic reads as NaN
        return 0.0 if math.isnan(got) and math.isnan(want) else math.inf
    if stat == "zero_frac":
        return abs(got - want)
    floor = max(abs(want), scale * 1e-12, sys.float_info.min)
    return abs(got - want) / floor if got != want else 0.0


def exactness(workload: Workload, device: torch.device) -> dict[str, Any]:
    """One recorded step's statistics of every watched activation and weight against float64,
    and the whole tensors ``tensors=`` keeps against the tensors themselves."""
    torch.manual_seed(0)
    model = copy.deepcopy(workload.model)
    optimizer = workload.make_optimizer(model.parameters())
    checked = 1  # step 0 warms up (on CUDA: compiles the kernel); step 1 is compared
    kept = re.compile(workload.kept)
    reference: dict[tuple[str, str, str, int], torch.Tensor] = {}  # (module, kind, tensor, call)
    whole: dict[tuple[str, str, str, int], torch.Tensor] = {}
    calls: dict[str, int] = {}
    taking = False
    result: dict[str, Any] = {}
    try:
        scope = layerscope.watch(
            model,
            optimizer=optimizer,
            every=1,
            tensors={"include": workload.kept, "kinds": ("activation", "weight")},
        )
        tensors_note = None
    except ImportError as error:  # tensors= needs safetensors
        scope = layerscope.watch(model, optimizer=optimizer, every=1)
        tensors_note = f"not checked: {error}"

    def take(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not taking:
                return
            call = calls.get(name, 0)
            calls[name] = call + 1
            for tensor_name, tensor in _named_tensors("out", output):
                if tensor.is_floating_point() and tensor.numel() > 0:
                    key = (name, "activation", tensor_name, call)
                    reference[key] = _reference(tensor)
                    if kept.search(name):
                        whole[key] = tensor.detach().clone()

        return hook

    watched = [info.name for info in scope.modules if info.watched]
    handles = [model.get_submodule(name).register_forward_hook(take(name)) for name in watched]
    try:
        with quiet():
            for step in range(checked + 1):
                taking = step == checked
                x, y = workload.batches[step % len(workload.batches)]
                loss = workload.loss(model, x, y)
                loss.backward()
                optimizer.step()
                if taking:  # weights are recorded after the optimizer step: read them there
                    for name in watched:
                        module = model.get_submodule(name)
                        for tensor_name, parameter in module.named_parameters(recurse=False):
                            key = (name, "weight", tensor_name, 0)
                            reference[key] = _reference(parameter)
                            if kept.search(name):
                                whole[key] = parameter.detach().clone()
                optimizer.zero_grad()
                scope.step(loss=loss)
            taking = False
            frame = scope.frame()
            records = list(scope.tensors) if tensors_note is None else []
    finally:
        for handle in handles:
            handle.remove()
        scope.close()
    rows = frame[
        (frame["step"] == checked)
        & (frame["phase"] == "train")
        & frame["kind"].isin(["activation", "weight"])
        & ~frame["sentinel"].fillna(False).astype(bool)
    ]
    worst = dict.fromkeys(STATS, 0.0)
    where = dict.fromkeys(STATS, "")
    compared = {"activation": 0, "weight": 0}
    unmatched = 0
    for row in rows.itertuples(index=False):
        key = (row.module, row.kind, row.tensor, int(row.call))
        if key not in reference:
            unmatched += 1
            continue
        want = reference[key].cpu().tolist()
        compared[row.kind] += 1
        for stat, value in zip(STATS, want, strict=True):
            gap = _error(float(getattr(row, stat)), value, want[STATS.index("absmax")], stat)
            if gap > worst[stat]:
                worst[stat], where[stat] = gap, f"{row.module} {row.kind} {row.tensor}"
    # Nothing compared is a failure, not an error of 0.
    result["worst_relative_error"] = max(worst.values()) if compared["activation"] else math.inf
    result["by_statistic"] = worst
    result["where"] = {stat: place for stat, place in where.items() if worst[stat] > 0}
    result["activations_compared"] = compared["activation"]
    result["weights_compared"] = compared["weight"]
    result["rows_without_reference"] = unmatched
    result["step"] = checked
    if tensors_note is not None:
        result["tensors"] = {"note": tensors_note}
    else:
        mine = [r for r in records if r.step == checked]
        equal = sum(
            1
            for r in mine
            if (r.module, r.kind, r.tensor, r.call) in whole
            and r.value.dtype == whole[(r.module, r.kind, r.tensor, r.call)].dtype
            and torch.equal(r.value.cpu(), whole[(r.module, r.kind, r.tensor, r.call)].cpu())
        )
        result["tensors"] = {
            "modules": workload.kept,
            "kept": len(mine),
            "expected": len(whole),
            "bit_equal": equal,
            "dropped": scope.tensors_dropped,
        }
    return result


# ----------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    description: str
    modules: int
    watched: int = 0
    rounds: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    milliseconds: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] = field(default_factory=dict)
    syncs: dict[str, dict[str, float]] = field(default_factory=dict)
    noise_floor: float = math.nan
    derived: dict[str, float] = field(default_factory=dict)
    full_vs_textbook: float | None = None
    exactness: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        configs = {
            name: {
                "ratio": ratio,
                "ms": self.milliseconds.get(name),
                "steps": self.steps.get(name),
                "peak_GiB": self.peak_gib.get(name),
                "syncs_per_step": self.syncs.get(name),
            }
            for name, ratio in self.ratios.items()
        }
        return {
            "description": self.description,
            "modules": self.modules,
            "watched": self.watched,
            "rounds": self.rounds,
            "unwatched_ms": self.milliseconds.get(UNWATCHED),
            "noise_floor": self.noise_floor,
            "configs": configs,
            "derived": self.derived,
            "full_vs_textbook_overhead": self.full_vs_textbook,
            "exactness": self.exactness,
            "skipped": self.skipped,
            "failed": self.failed,
        }


def _say(*parts: Any) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s]", *parts, file=sys.stderr, flush=True)


def measure(
    workload: Workload,
    configs: dict[str, Callable[[nn.Module, Any], Session] | None],
    args: argparse.Namespace,
    device: torch.device,
    deadline: float,
) -> Measured:
    measured = Measured(workload.description, sum(1 for _ in workload.model.modules()))
    try:
        measured.exactness = exactness(workload, device)
    except Exception as error:  # reported in the output; the timing goes on
        measured.exactness = {"failed": f"{type(error).__name__}: {error}"}
    _say(workload.name, "exactness", measured.exactness)
    # Every configuration once outside the timing: a peer not installed is skipped; on CUDA
    # the first recorded steps compile layerscope's kernel, and the host syncs are counted.
    starts = {}
    for name, start in configs.items():
        try:
            watched, training, other = count_syncs(workload, start, args.sync_steps, device)
        except ImportError as error:
            measured.skipped.append(f"{name}: not installed ({error.name})")
            continue
        starts[name] = start
        measured.watched = max(measured.watched, watched)
        if device.type == "cuda" and args.sync_steps:
            measured.syncs[name] = {
                "training_thread": training / args.sync_steps,
                "other_threads": other / args.sync_steps,
            }
    _say(workload.name, "syncs per step", measured.syncs or "n/a")
    times: list[dict[str, float]] = []
    peaks: dict[str, float] = {}
    order = list(starts)
    shuffle = random.Random(0)
    last_round = 0.0
    for number in range(args.rounds):
        now = time.perf_counter()
        if number > 0 and now + last_round > deadline:
            _say(workload.name, f"budget: stopped after {number} rounds")
            break
        shuffle.shuffle(order)  # no configuration always follows the same one
        this_round: dict[str, float] = {}
        for name in order:
            try:
                seconds, steps, peak = timed_block(
                    workload, starts[name], args.steps, args.block_cap, device
                )
            except Exception as error:  # one configuration failed (out of memory): say so
                measured.failed[name] = f"{type(error).__name__}: {str(error)[:300]}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            this_round[name] = seconds
            measured.steps[name] = steps
            peaks[name] = max(peaks.get(name, 0.0), peak)
        times.append(this_round)
        last_round = time.perf_counter() - now
        _say(workload.name, f"round {number + 1} took {last_round:.1f} s")
    measured.rounds = len(times)
    # Ratios within each round, to the mean of the two unwatched copies, and their median: the
    # machine's speed drifts between rounds, and a ratio within one round sees one speed.
    complete = [t for t in times if UNWATCHED in t and SECOND_COPY in t]
    bases = [(t[UNWATCHED] + t[SECOND_COPY]) / 2 for t in complete]
    for name in starts:
        pairs = [(t[name], base) for t, base in zip(complete, bases, strict=True) if name in t]
        if pairs:
            measured.ratios[name] = statistics.median(value / base for value, base in pairs)
            measured.milliseconds[name] = statistics.median(value for value, _ in pairs) * 1e3
            if device.type == "cuda":
                measured.peak_gib[name] = peaks[name]
    if complete:
        measured.noise_floor = statistics.median(t[SECOND_COPY] / t[UNWATCHED] for t in complete)
    ratios = measured.ratios
    between = SENTINEL if device.type == "cuda" else IDLE
    if between in ratios and FULL in ratios:
        measured.derived[f"defaults, long run (0.99 x {between} + 0.01 x full)"] = (
            1 - LONG_RUN_FRACTION
        ) * ratios[between] + LONG_RUN_FRACTION * ratios[FULL]
    if FULL in ratios and TEXTBOOK in ratios and ratios[TEXTBOOK] > 1:
        measured.full_vs_textbook = (ratios[FULL] - 1) / (ratios[TEXTBOOK] - 1)
    return measured


# ------------------------------------------------------------------------------- output


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}, {torch.get_num_threads()} threads"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def table(results: dict[str, Measured], device: torch.device) -> str:
    names = list(results)
    lines = [
        "| configuration | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| unwatched step | "
        + " | ".join(
            f"{results[n].milliseconds[UNWATCHED]:.1f} ms"
            if UNWATCHED in results[n].milliseconds
            else "-"
            for n in names
        )
        + " |",
        "| "
        + LABELS[SECOND_COPY]
        + " | "
        + " | ".join(f"{results[n].noise_floor:.2f}x" for n in names)
        + " |",
    ]
    configs = [c for c in CONFIGS if c not in (UNWATCHED, SECOND_COPY)]
    for config in configs:
        if not any(config in results[n].ratios for n in names):
            continue
        cells = []
        for name in names:
            ratio = results[name].ratios.get(config)
            cells.append("skipped" if ratio is None else f"{ratio:.2f}x")
        lines.append(f"| {LABELS[config]} | " + " | ".join(cells) + " |")
    derived = {key for n in names for key in results[n].derived}
    for key in sorted(derived):
        cells = [
            f"{results[n].derived[key]:.3f}x" if key in results[n].derived else "-" for n in names
        ]
        lines.append(f"| layerscope: {key} (derived) | " + " | ".join(cells) + " |")
    cells = [
        "-" if results[n].full_vs_textbook is None else f"{results[n].full_vs_textbook:.2f}"
        for n in names
    ]
    lines.append(
        "| overhead of full / overhead of textbook hooks ((ratio - 1) / (ratio - 1)) | "
        + " | ".join(cells)
        + " |"
    )
    lines.append(
        "| modules (watched by layerscope) | "
        + " | ".join(f"{results[n].modules:,} ({results[n].watched:,})" for n in names)
        + " |"
    )
    lines.append(
        "| rounds x timed steps | "
        + " | ".join(f"{results[n].rounds} x {results[n].steps.get(UNWATCHED, 0)}" for n in names)
        + " |"
    )
    text = "\n".join(lines)
    text += "\n\n" + _syncs_table(results, device)
    text += "\n\n" + _exactness_lines(results)
    notes = sorted({note for n in names for note in results[n].skipped})
    notes += [
        f"{n}, {config}: failed, {why}" for n in names for config, why in results[n].failed.items()
    ]
    if notes:
        text += "\n\nSkipped: " + "; ".join(notes) + "."
    return text


def _syncs_table(results: dict[str, Measured], device: torch.device) -> str:
    if device.type != "cuda":
        return "Host syncs per step on the training thread: n/a (counted on CUDA only)."
    names = list(results)
    lines = [
        "Host syncs per step, on the training thread (and on other threads), counted with "
        "torch.cuda.set_sync_debug_mode('warn') after the warm-up:",
        "",
        "| configuration | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for config in CONFIGS:
        cells = []
        for name in names:
            syncs = results[name].syncs.get(config)
            cells.append(
                "-"
                if syncs is None
                else f"{syncs['training_thread']:g} ({syncs['other_threads']:g})"
            )
        lines.append(f"| {LABELS.get(config, config)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _exactness_lines(results: dict[str, Measured]) -> str:
    lines = [
        "Exactness: one recorded step's mean, std, min, max, abs-max, L2 and zero fraction of "
        "every watched activation and weight against float64, worst relative error (zero "
        "fraction: absolute):"
    ]
    for name, measured in results.items():
        found = measured.exactness
        if "failed" in found:
            lines.append(f"- {name}: failed: {found['failed']}")
            continue
        tensors = found["tensors"]
        if "note" in tensors:
            kept = f"whole tensors (tensors=) {tensors['note']}"
        else:
            kept = (
                f"whole tensors kept with tensors={tensors['modules']!r}: "
                f"{tensors['bit_equal']} of {tensors['kept']} bit-equal "
                f"({tensors['expected']} expected, {tensors['dropped']} dropped)"
            )
        lines.append(
            f"- {name}: {found['worst_relative_error']:.2e} over "
            f"{found['activations_compared']} activations and {found['weights_compared']} "
            f"weights ({found['rows_without_reference']} rows without a reference); {kept}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="gpt2,resnet50,stack", help="comma-separated")
    parser.add_argument(
        "--configs", help="comma-separated: only configurations whose name contains one"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps a block")
    parser.add_argument("--sync-steps", type=int, default=2, help="steps whose syncs are counted")
    parser.add_argument("--block-cap", type=float, default=10.0, help="seconds; see above")
    parser.add_argument("--budget", type=float, help="seconds for the whole run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes, for a CPU")
    parser.add_argument(
        "--threads", type=int, help="torch's CPU threads; 1 by default with --small on a CPU"
    )
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    device = torch.device(args.device)
    # Ops of the small sizes are too small to split: on a 2-core machine shared with another
    # process, each of their parallel regions waits for a descheduled thread (workloads.py).
    threads = args.threads or (1 if args.small and device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    # The health rules still run (on the writer thread); their alerts on these randomly
    # initialised models (a ResNet's vanishing gradients at 32 x 32) would print a line each.
    logging.getLogger("layerscope").setLevel(logging.ERROR)
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        parser.error(f"--workloads: unknown {sorted(unknown)}; choose from {list(WORKLOADS)}")
    configs = dict(CONFIGS)
    if args.configs:
        wanted = [part.strip() for part in args.configs.split(",") if part.strip()]
        configs = {
            name: start
            for name, start in configs.items()
            if name in (UNWATCHED, SECOND_COPY) or any(part in name for part in wanted)
        }
    header = (
        f"Device: {device_name(device)}; torch {torch.__version__}, layerscope "
        f"{layerscope.__version__}, Python {platform.python_version()}"
        + (" (--small sizes)" if args.small else "")
    )
    _say(header)
    budget = math.inf if args.budget is None else args.budget
    results: dict[str, Measured] = {}
    figures: dict[str, Any] = {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "layerscope": layerscope.__version__,
        "small": args.small,
        "command": report.command("gpu.py"),
        "workloads": {},
        "skipped_workloads": [],
    }
    for index, name in enumerate(names):
        left = budget - (time.perf_counter() - STARTED)
        if left <= 0:
            figures["skipped_workloads"].append(f"{name}: budget spent")
            _say(name, "skipped: budget spent")
            continue
        deadline = time.perf_counter() + left / (len(names) - index)
        torch.manual_seed(0)
        try:
            workload = WORKLOADS[name](device, args.small)
        except ImportError as error:  # transformers
            figures["skipped_workloads"].append(f"{name}: not installed ({error.name})")
            _say(name, "skipped: not installed", error.name)
            continue
        results[name] = measure(workload, configs, args, device, deadline)
        figures["workloads"][name] = results[name].to_dict()
        del workload
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.json is not None:  # after each workload: a run cut short keeps what it did
            args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    text = header + "\n\n" + table(results, device) if results else header
    print(text, flush=True)
    if args.write and results:
        rounds = max(m.rounds for m in results.values())
        replace_section(
            "Step-time overhead (GPU)",
            f"Command: `{report.command('gpu.py')}`.\n"
            f"Medians over up to {rounds} interleaved rounds, in a new order each round; every "
            f"block trains a fresh copy of the model, {WARMUP_STEPS} warm-up steps, then "
            f"{args.steps} timed steps between two `torch.cuda.synchronize()`, background work "
            "included. Each figure is the median over rounds of a ratio within one round, to "
            "the mean of two unwatched copies of the model. Workloads: "
            + "; ".join(m.description for m in results.values())
            + ". layerscope's full configuration records activation, grad, weight and "
            "weight_grad with every statistic and the log2 histogram; the textbook baseline is "
            "hooks with one `.item()` per statistic over the same tensors; TensorBoard is "
            "`add_histogram` of every parameter and gradient.\n\n" + text,
        )


if __name__ == "__main__":
    main()
