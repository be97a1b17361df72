"""Bugs of multilayer perceptrons on the digits, flattened to 64 pixels."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diagnosis_zoo.case import Case
from diagnosis_zoo.data import chosen, digit_batch, digits
from diagnosis_zoo.loop import Loop, objective

EVERY_LAYER = ("fc1", "fc2", "head")  # a bug of every layer at once: any of them names it


class MLP(nn.Module):
    """64 pixels -> fc1 -> act1 -> fc2 -> act2 -> head -> 10 logits (or log-probabilities)."""

    def __init__(self, width: int = 64, log_probs: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, width)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(width, 10)
        self.log_probs = log_probs

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.head(self.act2(self.fc2(self.act1(self.fc1(x)))))
        if self.log_probs is None:
            return logits
        log_probs: Tensor = self.log_probs(logits)
        return log_probs


class LogOfSoftmax(nn.Module):
    """``log(softmax(x))`` in two steps: a probability that underflows to 0 gives -inf."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.log(torch.softmax(x, dim=-1))


def _adam(model: nn.Module, lr: float = 3e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def _flat(step: int) -> tuple[Tensor, Tensor]:
    return digit_batch(step, flat=True)


def _labels_one_class(buggy: bool) -> Loop:
    model = MLP()

    def batch(step: int) -> tuple[Tensor, Tensor]:
        x, y = _flat(step)
        return x, torch.zeros_like(y) if buggy and step >= 40 else y

    return Loop(model=model, optimizer=_adam(model), batch=batch)


def _shuffled_labels(buggy: bool) -> Loop:
    model = MLP()
    _, labels = digits()

    def batch(step: int) -> tuple[Tensor, Tensor]:
        x, y = _flat(step)
        # Labels drawn by a second sampler: each image meets some other image's label.
        return x, labels[chosen(step, len(labels), seed=1)] if buggy else y

    return Loop(model=model, optimizer=_adam(model), batch=batch)


def _constant_input(buggy: bool) -> Loop:
    model = MLP()

    def batch(step: int) -> tuple[Tensor, Tensor]:
        x, y = _flat(step)
        # A collate step that broadcasts the batch's first image to every row.
        return (x[:1].expand_as(x) if buggy and step >= 40 else x), y

    return Loop(model=model, optimizer=_adam(model), batch=batch)


def _nan_between_steps(buggy: bool) -> Loop:
    model = MLP(log_probs=LogOfSoftmax())

    def batch(step: int) -> tuple[Tensor, Tensor]:
        x, y = _flat(step)
        if buggy and step == 37:
            x = x.clone()
            x[0] *= 1e4  # one corrupted record: its logits differ by thousands
        return x, y

    return Loop(
        model=model,
        optimizer=_adam(model),
        batch=batch,
        objective=objective(nn.functional.nll_loss),
    )


def _clipped_explosion(buggy: bool) -> Loop:
    model = MLP()

    def scaled(output: Tensor, target: Tensor, step: int) -> tuple[Tensor, Tensor]:
        # From step 40 the loss is scaled by 1,000 for backward (a manual loss scale never
        # undone); clipping to norm 1 keeps the updates as they were, the logged loss too.
        loss = nn.functional.cross_entropy(output, target)
        return (loss * 1000 if buggy and step >= 40 else loss), loss

    return Loop(model=model, optimizer=_adam(model), batch=_flat, objective=scaled, clip=1.0)


def _adamw_lr_100x(buggy: bool) -> Loop:
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-1 if buggy else 3e-3)
    return Loop(model=model, optimizer=optimizer, batch=_flat)


def _dead_relu_bias(buggy: bool) -> Loop:
    model = MLP()
    if buggy:
        with torch.no_grad():
            model.fc2.bias.fill_(-3.0)  # an init meant for a gate's bias, applied to fc2
    return Loop(model=model, optimizer=_adam(model), batch=_flat)


def _lr_schedule_jump(buggy: bool) -> Loop:
    model = MLP()
    optimizer = _adam(model, lr=1e-3)

    def before(step: int) -> None:
        if buggy and step == 60:  # a warm restart to 100 times the rate, not to the rate
            for group in optimizer.param_groups:
                group["lr"] *= 100

    return Loop(model=model, optimizer=optimizer, batch=_flat, before=before)


class L2Normalize(nn.Module):
    """Rows scaled to unit length; ``eps`` outside the square root, or inside it."""

    def __init__(self, eps_inside: bool) -> None:
        super().__init__()
        self.eps_inside = eps_inside

    def forward(self, x: Tensor) -> Tensor:
        squares = x.pow(2).sum(-1, keepdim=True)
        if self.eps_inside:
            return x * torch.rsqrt(squares + 1e-12)
        # Finite forward on a zero row, but the square root's derivative there is infinite:
        # its backward gives 0 * inf = NaN.
        return x / (squares.sqrt() + 1e-6)


class Embedder(nn.Module):
    """64 pixels -> fc1 (no bias) -> norm (unit rows) -> act1 -> head: a cosine classifier."""

    def __init__(self, eps_inside: bool, width: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, width, bias=False)
        self.norm = L2Normalize(eps_inside)
        self.act1 = nn.ReLU()
        self.head = nn.Linear(width, 10)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.head(self.act1(self.norm(self.fc1(x))) * 10)
        return logits


def _scaler_skips(buggy: bool) -> Loop:
    model = Embedder(eps_inside=not buggy)

    def batch(step: int) -> tuple[Tensor, Tensor]:
        x, y = _flat(step)
        if step >= 30:  # from here batches are padded: four zero rows the loss ignores
            x, y = x.clone(), y.clone()
            x[-4:], y[-4:] = 0.0, -100
        return x, y

    return Loop(
        model=model, optimizer=_adam(model), batch=batch, scaler=torch.amp.GradScaler("cpu")
    )


class Stack(nn.Module):
    """64 pixels -> ``depth`` Linear and activation pairs of ``width`` (``body``) -> head."""

    def __init__(self, activation: type[nn.Module], depth: int = 10, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for index in range(depth):
            layers += [nn.Linear(64 if index == 0 else width, width), activation()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.head(self.body(x))
        return logits


def _deep_sigmoid(buggy: bool) -> Loop:
    model = Stack(nn.Sigmoid if buggy else nn.ReLU)
    return Loop(model=model, optimizer=_adam(model), batch=_flat)


_MLP = "MLP"
CASES = [
    Case(name="mlp-labels-one-class", model=_MLP, family="loss_collapse", layers=(),
         bug="from step 40 every label is 0 (a label column read wrong)",
         planted=40, scalar_visible=45, build=_labels_one_class, small=True,
         note="the labels are no layer's; the loss is a sixth of its level by step 45"),
    Case(name="mlp-shuffled-labels", model=_MLP, family="not_learning", layers=(),
         bug="labels drawn by a second sampler: no image meets its own label",
         planted=0, scalar_visible=20, build=_shuffled_labels,
         note="the loss stays at ln 10; the twin's is 20% lower by step 20"),
    Case(name="mlp-constant-input", model=_MLP, family="constant_input", layers=("fc1",),
         bug="from step 40 a collate step gives every row the batch's first image",
         planted=40, visible=40, build=_constant_input,
         note="seen in fc1's input only: its output still varies over its units"),
    Case(name="mlp-nan-between-steps", model=_MLP, family="nonfinite", layers=("log_probs",),
         bug="one corrupted record at step 37 meets log(softmax(x)) computed in two steps",
         planted=37, visible=37, scalar_visible=38, build=_nan_between_steps, small=True,
         origin_until=37,
         note="log_probs' output holds -inf at step 37, the loss is NaN from step 38; step 37's "
         "update makes every weight NaN, so only a record of step 37 shows the layer"),
    Case(name="mlp-clipped-explosion", model=_MLP, family="exploding_grad", layers=("head",),
         bug="from step 40 backward runs on the loss times 1,000; clipping hides it",
         planted=40, visible=40, build=_clipped_explosion,
         note="every gradient grows 1,000 times; the head's output gradient first"),
    Case(name="mlp-adamw-lr-100x", model=_MLP, family="update_ratio", layers=EVERY_LAYER,
         bug="AdamW at 3e-1, 100 times the twin's 3e-3",
         planted=0, visible=0, build=_adamw_lr_100x,
         note="every layer's updates are too large at once: any of them names it"),
    Case(name="mlp-dead-relu-bias", model=_MLP, family="dead", layers=("act2",),
         bug="fc2's bias initialised to -3: act2's units never open",
         planted=0, visible=0, build=_dead_relu_bias, small=True),
    Case(name="mlp-lr-schedule-jump", model=_MLP, family="update_ratio", layers=EVERY_LAYER,
         bug="at step 60 a warm restart sets Adam's rate to 100 times 1e-3",
         planted=60, visible=60, build=_lr_schedule_jump),
    Case(name="mlp-scaler-skips", model=_MLP, family="scaler_skips", also=("nonfinite",),
         layers=("norm", "fc1"),
         bug="from step 30 zero padding rows meet an L2 norm with eps outside the root: "
         "GradScaler skips every step",
         planted=30, visible=30, scalar_visible=32, build=_scaler_skips,
         note="NaN gradients from step 30, three skips in a row by 32; norm's backward makes "
         "the NaN, in fc1's gradients (a nonfinite alert that names it names the problem: a "
         "NaN, not an overflow)"),
    Case(name="mlp-deep-sigmoid", model=_MLP, family="vanishing_grad",
         layers=tuple(f"body.{i}" for i in range(10)),
         bug="ten Linear and Sigmoid layers (the twin: ReLU)",
         planted=0, visible=0, build=_deep_sigmoid,
         note="any of the stack's first ten modules: their output gradients are 1e-5 to 1e-9 "
         "times the head's (the twin's, 1e-4 at most)"),
]  # fmt: skip
