"""Bugs of a convolutional network with BatchNorm on the digits' 8 x 8 images."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diagnosis_zoo.case import Case
from diagnosis_zoo.data import digit_batch
from diagnosis_zoo.loop import Loop

EVERY_LAYER = ("conv1", "bn1", "conv2", "bn2", "head")


class ConvNet(nn.Module):
    """(32, 1, 8, 8) -> conv1 -> bn1 -> act1 -> conv2 (stride 2: 4 x 4) -> bn2 -> act2 ->
    pool -> flatten -> head -> 10 logits (or probabilities, with ``probs``)."""

    def __init__(self, probs: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.act2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(64, 10)
        self.probs = nn.Softmax(dim=-1) if probs else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        logits: Tensor = self.head(self.flatten(self.pool(x)))
        if self.probs is None:
            return logits
        probs: Tensor = self.probs(logits)
        return probs


def _adamw(model: nn.Module, lr: float = 3e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr)


def _bn_eval(buggy: bool) -> Loop:
    model = ConvNet()
    if buggy:
        model.bn2.eval()  # a function that freezes BatchNorm for fine-tuning, on a fresh model
    return Loop(model=model, optimizer=_adamw(model), batch=digit_batch)


def _softmax_then_cross_entropy(buggy: bool) -> Loop:
    model = ConvNet(probs=buggy)  # cross_entropy applies its own softmax again
    return Loop(model=model, optimizer=_adamw(model), batch=digit_batch)


def _missing_zero_grad(buggy: bool) -> Loop:
    model = ConvNet()
    return Loop(
        model=model,
        optimizer=_adamw(model),
        batch=digit_batch,
        zero_grad=lambda step: not (buggy and step >= 40),  # a refactor dropped it
    )


_CNN = "CNN with BatchNorm"
CASES = [
    Case(name="cnn-bn-eval", model=_CNN, family="eval_mode", layers=("bn2",),
         bug="bn2 left in eval mode while the rest trains: it never normalises",
         planted=0, visible=0, build=_bn_eval),
    Case(name="cnn-softmax-then-cross-entropy", model=_CNN, family="wrong_loss",
         layers=("probs",), bug="the model ends in Softmax and cross_entropy softmaxes again",
         planted=0, visible=0, build=_softmax_then_cross_entropy),
    Case(name="cnn-missing-zero-grad", model=_CNN, family="accumulating_grad",
         layers=EVERY_LAYER, bug="from step 40 zero_grad is never called",
         planted=40, visible=41, build=_missing_zero_grad,
         note="step 41's gradients hold step 40's too, in every layer: any of them names it"),
]  # fmt: skip
