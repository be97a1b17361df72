"""Health rules on healthy runs: the alerts they raise there, and what they cost the writer.

    python benchmarks/health.py            # prints the table
    python benchmarks/health.py --write    # also updates its section of BENCHMARKS.md

Each workload of the overhead benchmark (random data, AdamW at 1e-3) and the digits example's
CNN (scikit-learn's digits, Adam at 3e-3, as ``examples/digits.py``) trains ``--steps`` steps
watched with every kind captured (inputs, updates and buffers too) and every step recorded
(``every=1``: the most rows for the rules to read); ``gpt`` with ``attention=True`` too, so that
``attention_collapse`` reads each head's entropy. So do layouts that healthy runs often
have and rules once flagged: ``amp``, the digits CNN with batches of 16 under bf16 autocast
with a GradScaler at its default scale (65,536); ``convbn-sgd`` and ``convbn-adamw``,
convolutions with biases followed by BatchNorm (whose gradients are zero up to rounding) on
the CNN workload's data, under SGD with momentum 0.9 at 1e-2 and AdamW at 1e-3; ``inspect``,
the CNN workload's backward passes with no optimizer step (no ``optimizer=``,
``scope.step()`` each iteration: every kind but updates). And recipes of healthy training
on the digits data, each a layout a rule must take as it is: ``finetune`` and
``finetune-frozen-bn``, a CNN with BatchNorm and Dropout trained 50 steps unwatched, then its
backbone frozen (``requires_grad_(False)`` before watch) and a new head trained, the
backbone's BatchNorm layers left in train mode or put in eval mode with it (detectron's
frozen BatchNorm); ``warmup``, a learning rate warmed up linearly from 0 over 10 steps, then
decayed linearly to 0 at the last step (``get_linear_schedule_with_warmup``); ``amp-fp16``,
float16 autocast with a GradScaler that starts at 2**24, so that its first steps overflow
and are skipped, as they are from the default scale on a GPU; ``eval-loop``, the BatchNorm
CNN with a validation pass (``model.eval()``, a forward under ``torch.no_grad()``,
``model.train()``) every 10 steps, from before the first; ``clip``, gradients clipped to a
norm of 1 (from about step 14, where the digits CNN's norm passes 1); ``zero-head``, the digits
CNN with its classifier initialised at zero (its logits grow from nothing, as timm's vision
transformers' do); ``copy``, two transformer blocks learning to repeat 8 symbols after a
separator, 90 steps: the loss falls slowly for 45 steps, then 22 times in 30 as the model
finds how (a healthy collapse). The CNN workload's runs train on its shapes with labels
that follow the images (each class a fixed pattern under noise twice its size): the overhead
benchmark's random labels are data with no signal, which ``not_learning`` rightly warns of.
An alert on these runs is a false alarm, unless it is "info". The rules' cost is the writer
thread's CPU time in them, per flush (a flush holds 10 recorded steps by default) and per
row of statistics they read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
import layerscope
import report  # run as a script
from diagnosis_zoo.gpt import Block
from workloads import WORKLOADS

EVERY_KIND = ("activation", "grad", "weight", "weight_grad", "input", "update", "buffer")
Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _digits(size: int = 64) -> tuple[nn.Module, torch.optim.Optimizer, Batches, LossFn]:
    import digits  # examples/digits.py

    train_x, train_y, _, _ = digits.load()
    model = digits.make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(0))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = order.roll(-size * step)[:size]
        return train_x[chosen], train_y[chosen]

    return model, optimizer, batch, nn.functional.cross_entropy


def _conv_bn() -> nn.Module:
    """Convolutions that keep their biases, each followed by BatchNorm, as in VGG-BN."""

    def block(c_in: int, c_out: int) -> nn.Module:
        conv = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1)
        return nn.Sequential(conv, nn.BatchNorm2d(c_out), nn.ReLU())

    # (256, 1, 28, 28) -> 14 -> 7 -> 4 -> (256, 64) -> (256, 10)
    return nn.Sequential(
        block(1, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )  # fmt: skip


def _digits_bn() -> nn.Sequential:
    """The digits CNN with BatchNorm and Dropout: layers whose train and eval modes differ."""
    # (batch, 1, 8, 8) -> (batch, 16, 8, 8) -> (batch, 32, 4, 4) -> (batch, 512) -> (batch, 10)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, 10),
    )  # fmt: skip


_BACKBONE = 7  # _digits_bn's layers before its head (Dropout, Linear)


def _finetuned(frozen_bn: bool) -> tuple[nn.Module, torch.optim.Optimizer, Batches, LossFn]:
    """_digits_bn trained 50 steps, its backbone frozen, a new head to train."""
    _, _, batch, loss_fn = _digits()
    model = _digits_bn()
    pretraining = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(50):  # unwatched: the pretrained backbone
        x, y = batch(step)
        loss_fn(model(x), y).backward()
        pretraining.step()
        pretraining.zero_grad()
    backbone, head = model[:_BACKBONE], model[_BACKBONE:]
    backbone.requires_grad_(False)
    if frozen_bn:  # running statistics kept as they are, as detectron's FrozenBatchNorm2d
        backbone.eval()
    new_head = model[-1]
    assert isinstance(new_head, nn.Linear)
    new_head.reset_parameters()
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    return model, optimizer, lambda step: batch(step + 50), loss_fn


SYMBOLS, COPIED = 10, 8


class Copier(nn.Module):
    """Two pre-LN transformer blocks that learn to repeat a sequence after a separator."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(SYMBOLS + 2, dim)  # the symbols, a separator, padding
        self.position = nn.Embedding(2 * COPIED, dim)
        self.blocks = nn.Sequential(*(Block(post_norm=False, dim=dim) for _ in range(2)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, SYMBOLS + 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        logits: torch.Tensor = self.head(self.norm(self.blocks(x)))
        return logits


def _copy() -> tuple[nn.Module, torch.optim.Optimizer, Batches, LossFn]:
    """A transformer learning to copy: its loss falls slowly, then 22 times in 30 steps."""
    model = Copier()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        symbols = torch.randint(2, SYMBOLS + 2, (32, COPIED), generator=generator)
        sequence = torch.cat([symbols, torch.ones(32, 1, dtype=torch.long), symbols], dim=1)
        targets = sequence[:, 1:].clone()
        targets[:, :COPIED] = -100  # the first half cannot be predicted: only the copy counts
        return sequence[:, :-1], targets

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return model, torch.optim.Adam(model.parameters(), lr=1e-3), batch, loss


def _warmup(
    optimizer: torch.optim.Optimizer, warmup: int, steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 over ``warmup`` steps, then linear decay to 0 at ``steps``."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        return max(0.0, (steps - step) / (steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# Runs of transformers, watched with attention=True too: attention_collapse must stay quiet.
ATTENTION = {"gpt"}
# The workload whose data (and, but for convbn, model) a healthy layout's run takes.
_DATA = {"convbn-sgd": "cnn", "convbn-adamw": "cnn", "inspect": "cnn"}
# Healthy recipes on the digits data: frozen backbones, schedules, AMP, validation, clipping.
RECIPES = [
    "finetune", "finetune-frozen-bn", "warmup", "amp-fp16", "eval-loop", "clip", "zero-head",
    "copy",
]  # fmt: skip
# Runs that need more than --steps to show what they are for: copy's loss falls from step 45.
AT_LEAST = {"copy": 90}
RUNS = [*WORKLOADS, "digits", "amp", *_DATA, *RECIPES]
CLIP_NORM = 1.0
VALIDATE_EVERY = 10


# Each class's image: a fixed random pattern, seen through noise twice its size.
_TEMPLATES = 0.5 * torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1))


def _templates(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The CNN workload's batch shape, with labels that follow the images.

    The overhead benchmark's random labels are data with no signal, which ``not_learning``
    warns of: a healthy run learns.
    """
    labels = torch.randint(0, 10, (256,), generator=generator)
    noise = torch.randn(256, 1, 28, 28, generator=generator)
    return _TEMPLATES[labels] + noise, labels


def _setup(name: str) -> tuple[nn.Module, torch.optim.Optimizer, Batches, LossFn]:
    """The run's model, its optimizer, its batches by step and its loss."""
    if name in ("digits", "amp", "amp-fp16", "warmup", "clip"):
        # Batches of 16 under AMP: the smaller the batch, the larger the loss's gradient, and
        # the scale makes it larger still.
        return _digits(16 if name.startswith("amp") else 64)
    if name == "copy":
        return _copy()
    if name == "zero-head":
        model, optimizer, batch, loss_fn = _digits()
        head = model[-1]
        assert isinstance(head, nn.Linear)
        with torch.no_grad():  # as timm's vision transformers start their heads
            head.weight.zero_()
            head.bias.zero_()
        return model, optimizer, batch, loss_fn
    if name.startswith("finetune"):
        return _finetuned(frozen_bn=name == "finetune-frozen-bn")
    if name == "eval-loop":
        _, _, digit_batch, loss_fn = _digits()
        bn_model = _digits_bn()
        return bn_model, torch.optim.Adam(bn_model.parameters(), lr=3e-3), digit_batch, loss_fn
    workload = WORKLOADS[_DATA.get(name, name)]
    model = _conv_bn() if name.startswith("convbn") else workload.make_model()
    if name == "convbn-sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=1e-2, momentum=0.9
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    make_batch = _templates if workload.name == "cnn" else workload.make_batch

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return make_batch(generator)

    return model, optimizer, batch, workload.loss


def run(name: str, steps: int) -> dict[str, object]:
    torch.manual_seed(0)
    model, optimizer, batch, loss_fn = _setup(name)
    inspect = name == "inspect"  # backward only: no optimizer step, none given to watch
    scaler = None
    if name == "amp":
        scaler = torch.amp.GradScaler("cpu")  # its default scale
    elif name == "amp-fp16":
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)  # overflows at first
    precision = torch.float16 if name == "amp-fp16" else torch.bfloat16
    schedule = _warmup(optimizer, 10, steps) if name == "warmup" else None
    validate = _validation(model) if name == "eval-loop" else None
    kinds = tuple(kind for kind in EVERY_KIND if not (inspect and kind == "update"))
    started = time.perf_counter()
    watched = None if inspect else optimizer
    attention = name in ATTENTION
    with layerscope.watch(
        model, optimizer=watched, every=1, kinds=kinds, attention=attention
    ) as scope:
        for step in range(steps):
            if validate is not None and step % VALIDATE_EVERY == 0:
                validate()
            x, y = batch(step)
            with torch.autocast("cpu", dtype=precision, enabled=scaler is not None):
                loss = loss_fn(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                if name == "clip":
                    nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
                if not inspect:
                    optimizer.step()
            if schedule is not None:
                schedule.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
        monitor = scope._pipeline.health  # the writer's rules, to read their cost
        assert monitor is not None
    took = time.perf_counter() - started
    alerts = scope.frame("alerts")
    alarms = alerts[alerts.severity != "info"]
    return {
        "name": name,
        "modules": len(scope.modules),
        "alarms": [f"{a.rule} {a.module} step {a.step}" for a in alarms.itertuples()],
        "flushes": monitor.flushes,
        "per_flush_ms": 1e3 * monitor.seconds / max(monitor.flushes, 1),
        "per_row_us": 1e6 * monitor.seconds / max(monitor.rows, 1),
        "rows_per_flush": monitor.rows / max(monitor.flushes, 1),
        "share": monitor.seconds / took,
        "attention_rows": len(scope.frame("attention")) if attention else None,
    }


def _validation(model: nn.Module) -> Callable[[], None]:
    """A validation pass over the digits' held-out images, in eval mode and without grad."""
    import digits  # examples/digits.py

    _, _, test_x, _ = digits.load()

    def validate() -> None:
        model.eval()
        with torch.no_grad():
            model(test_x)
        model.train()

    return validate


def _step_times(name: str, steps: int, **watch: object) -> list[float]:
    """Each step's time of workload ``name``, trained from a fixed seed, watched with ``watch``."""
    workload = WORKLOADS[name]
    torch.manual_seed(0)
    model = workload.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    times = []
    with layerscope.watch(model, optimizer=optimizer, **watch):  # type: ignore[arg-type]
        for _ in range(steps):
            started = time.perf_counter()
            x, y = workload.make_batch(generator)
            workload.loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - started)
    return times


def _interleaved(rounds: int, *configs: Callable[[], float]) -> list[float]:
    """The median of each configuration's figure over ``rounds`` rounds, taken in turn."""
    figures: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):  # interleaved: the machine's speed drifts
        for figure, config in zip(figures, configs, strict=True):
            figure.append(config())
    return [statistics.median(figure) for figure in figures]


def raise_cost(rounds: int = 5, steps: int = 40) -> tuple[float, float]:
    """Median unrecorded step of the MLP workload with the sentinel: alerts on, and "raise"."""
    schedule = layerscope.Schedule(every=10, sentinel=True)

    def unrecorded(alerts: object) -> float:
        times = _step_times("mlp", steps, every=schedule, alerts=alerts)
        return statistics.median(t for i, t in enumerate(times) if i > 10 and i % 10)

    on, raising = _interleaved(rounds, lambda: unrecorded(True), lambda: unrecorded("raise"))
    return on, raising


def dead_units_cost(rounds: int = 5, steps: int = 20) -> tuple[float, float]:
    """Median recorded step of the CNN workload without and with the dead_units statistic."""

    def recorded(stats: object) -> float:
        return statistics.median(_step_times("cnn", steps, every=1, stats=stats)[5:])

    units = {"dead_units": layerscope.health.dead_units}
    without, with_units = _interleaved(rounds, lambda: recorded(None), lambda: recorded(units))
    return without, with_units


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| run | false alarms (warning or error) | rules' writer time per flush | per row "
        "| rows per flush | share of the run's wall time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        alarms = r["alarms"]
        shown = "none" if not alarms else f"{len(alarms)}: " + "; ".join(alarms[:4])  # type: ignore[arg-type, index]
        lines.append(
            f"| {r['name']} | {shown} | {r['per_flush_ms']:.2f} ms | {r['per_row_us']:.1f} us "
            f"| {r['rows_per_flush']:.0f} | {r['share']:.2%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", nargs="*", default=RUNS, choices=RUNS)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    results = []
    for name in args.runs:
        results.append(run(name, max(args.steps, AT_LEAST.get(name, 0))))
        print(f"{name}: done", file=sys.stderr)
    text = table(results)
    for r in results:
        if r["attention_rows"] is not None:
            rows = r["attention_rows"]
            text += f"\n\n{r['name']}: {rows:,} attention rows read (a head of a call a step)."
    on, raising = raise_cost()
    text += (
        f'\n\nalerts="raise" (one flag read back per step), the MLP workload with the sentinel, '
        f"median unrecorded step: {1e3 * on:.1f} ms with alerts=True, {1e3 * raising:.1f} ms "
        'with alerts="raise".'
    )
    without, with_units = dead_units_cost()
    text += (
        f" The dead_units statistic, CNN workload, median recorded step: {1e3 * without:.1f} ms "
        f"without it, {1e3 * with_units:.1f} ms with it."
    )
    print(text)
    if args.write:
        report.replace_section(
            "Health rules on healthy runs (CPU)",
            f"Machine: {report.machine(torch.get_num_threads())}. Command: "
            f"`{report.command('health.py')}`. {args.steps} steps of each run "
            "(copy: 90), every step recorded with every kind (inputs, updates, buffers too), "
            "the default rules; gpt with attention=True too (each head's attention entropy, "
            "for attention_collapse). "
            "The overhead benchmark's workloads train with AdamW at 1e-3 (on random data but "
            "for the CNN's, below); digits is examples/digits.py's CNN on scikit-learn's "
            "digits with Adam at 3e-3; amp is that CNN with batches of 16 under bf16 autocast "
            "with a GradScaler at its default scale (65,536); convbn-sgd and convbn-adamw are "
            "convolutions with biases, each followed by BatchNorm, on the CNN workload's data "
            "under SGD with momentum 0.9 at 1e-2 and AdamW at 1e-3; inspect is the CNN "
            "workload's backward passes with no optimizer step (no optimizer=, every kind but "
            "updates). Healthy recipes on the digits data: finetune and finetune-frozen-bn "
            "train a new head on a BatchNorm CNN's frozen backbone (pretrained 50 steps), its "
            "BatchNorm left in train mode or put in eval mode; warmup warms the learning rate "
            "up from 0 over 10 steps, then decays it to 0; amp-fp16 is float16 autocast with a "
            "GradScaler from 2**24 (its first steps overflow and are skipped); eval-loop "
            "validates every 10 steps (model.eval(), no_grad, model.train()); clip clips "
            "gradients to a norm of 1; zero-head starts the digits CNN's classifier at zero; copy "
            "(90 steps) is two transformer blocks learning to repeat 8 symbols, whose loss "
            "falls slowly, then 22 times in 30 steps. "
            "The CNN workload's runs here have labels that follow the images (each class a "
            "fixed pattern under noise), not the overhead benchmark's random labels, which are "
            "data with no signal. The rules run on the writer thread; their time there "
            "is not on the training thread.\n\n" + text,
        )


if __name__ == "__main__":
    main()
