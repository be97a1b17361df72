"""Bugs of a small residual network with BatchNorm on the digits' 8 x 8 images."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diagnosis_zoo.case import Case
from diagnosis_zoo.data import digit_batch, digits
from diagnosis_zoo.loop import Loop

WIDTH = 32


class Block(nn.Module):
    """``act2(x + bn2(conv2(act1(bn1(conv1(x))))))``."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.act2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        branch = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        out: Tensor = self.act2(x + branch)
        return out


class ResNet(nn.Module):
    """(32, 1, 8, 8) -> stem (conv, bn, relu) -> layer1 -> layer2 -> pool -> head."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layer1 = Block(width)
        self.layer2 = Block(width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(width, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        logits: Tensor = self.head(self.flatten(self.pool(x)))
        return logits


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def _eval_not_undone(buggy: bool) -> Loop:
    model = ResNet()
    images, _ = digits()

    def before(step: int) -> None:
        if step == 40:  # a validation pass
            model.eval()
            with torch.no_grad():
                model(images[-256:])
            if not buggy:
                model.train()

    return Loop(model=model, optimizer=_adam(model), batch=digit_batch, before=before)


def _head_replaced(buggy: bool) -> Loop:
    model = ResNet()
    optimizer = _adam(model)

    def before(step: int) -> None:
        if step == 30:  # a fresh head for the second stage; the optimizer keeps the old one
            model.head = nn.Linear(WIDTH, 10)
            if not buggy:
                optimizer.add_param_group({"params": list(model.head.parameters())})

    return Loop(model=model, optimizer=optimizer, batch=digit_batch, before=before)


def _frozen_mid_run(buggy: bool) -> Loop:
    model = ResNet()

    def before(step: int) -> None:
        if buggy and step == 50:  # a freeze meant for fine-tuning, in a run from scratch
            model.layer1.requires_grad_(False)

    return Loop(model=model, optimizer=_adam(model), batch=digit_batch, before=before)


_RESNET = "ResNet"
_LAYER1 = ("layer1.conv1", "layer1.bn1", "layer1.conv2", "layer1.bn2")
CASES = [
    Case(name="resnet-eval-not-undone", model=_RESNET, family="eval_mode", layers=("stem.1",),
         bug="a validation pass at step 40 calls model.eval() and nothing calls model.train()",
         planted=40, visible=40, build=_eval_not_undone,
         note="stem.1 is the first BatchNorm in forward order"),
    Case(name="resnet-head-replaced", model=_RESNET, family="update_ratio", layers=("head",),
         bug="at step 30 a fresh head replaces the old one after watch(), left out of the "
         "optimizer", planted=30, visible=30, build=_head_replaced),
    Case(name="resnet-frozen-mid-run", model=_RESNET, family="update_ratio", layers=_LAYER1,
         bug="at step 50 layer1 is frozen (requires_grad_(False))",
         planted=50, visible=50, build=_frozen_mid_run),
]  # fmt: skip
