"""Bugs of an autoencoder and a variational autoencoder on the digits, flattened."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diagnosis_zoo.case import Case
from diagnosis_zoo.data import digit_batch
from diagnosis_zoo.loop import Loop

CODE = 8
Targets = tuple[Tensor, Tensor]  # the pixels to reconstruct, the labels


class AutoEncoder(nn.Module):
    """64 pixels -> enc1 -> act1 -> code -> dec1 -> act2 -> out (-> squash), and a classifier
    of the code (``classify``): the reconstruction's logits and the class logits."""

    def __init__(self, squash: bool = False) -> None:
        super().__init__()
        self.enc1 = nn.Linear(64, 32)
        self.act1 = nn.ReLU()
        self.code = nn.Linear(32, CODE)
        self.dec1 = nn.Linear(CODE, 32)
        self.act2 = nn.ReLU()
        self.out = nn.Linear(32, 64)
        self.squash = nn.Sigmoid() if squash else None
        self.classify = nn.Linear(CODE, 10)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        code = self.code(self.act1(self.enc1(x)))
        image = self.out(self.act2(self.dec1(code)))
        return (image if self.squash is None else self.squash(image)), self.classify(code)


class Sample(nn.Module):
    """The reparameterisation: ``mu + exp(logvar / 2) * noise``."""

    def forward(self, mu: Tensor, logvar: Tensor) -> Tensor:
        return mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)


class VAE(nn.Module):
    """64 pixels -> enc1 -> act1 -> mu, logvar -> sample -> dec1 -> act2 -> out: the
    reconstruction's logits, mu and logvar."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Linear(64, 32)
        self.act1 = nn.ReLU()
        self.mu = nn.Linear(32, CODE)
        self.logvar = nn.Linear(32, CODE)
        self.sample = Sample()
        self.dec1 = nn.Linear(CODE, 32)
        self.act2 = nn.ReLU()
        self.out = nn.Linear(32, 64)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hidden = self.act1(self.enc1(x))
        mu, logvar = self.mu(hidden), self.logvar(hidden)
        image = self.out(self.act2(self.dec1(self.sample(mu, logvar))))
        return image, mu, logvar


def _pixels_and_labels(step: int) -> tuple[Tensor, Targets]:
    x, y = digit_batch(step, flat=True)
    return x, (x, y)


def _reconstruction(image: Tensor, x: Tensor) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(image, x)


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def _sigmoid_twice(buggy: bool) -> Loop:
    model = AutoEncoder(squash=buggy)  # BCE with logits applies a second sigmoid

    def loss(output: tuple[Tensor, Tensor], target: Targets, step: int) -> tuple[Tensor, Tensor]:
        value = _reconstruction(output[0], target[0])
        return value, value

    return Loop(model=model, optimizer=_adam(model), batch=_pixels_and_labels, objective=loss)


def _aux_explosion(buggy: bool) -> Loop:
    model = AutoEncoder()

    def loss(output: tuple[Tensor, Tensor], target: Targets, step: int) -> tuple[Tensor, Tensor]:
        image, logits = output
        reconstruction = _reconstruction(image, target[0])
        # The auxiliary weight's schedule multiplies by 1,000 where it should divide.
        weight = 1000.0 if buggy and step >= 40 else 1.0
        auxiliary = nn.functional.cross_entropy(logits, target[1])
        return reconstruction + weight * auxiliary, reconstruction

    return Loop(
        model=model, optimizer=_adam(model), batch=_pixels_and_labels, objective=loss, clip=1.0
    )


def _kl_weight_negative(buggy: bool) -> Loop:
    model = VAE()

    def loss(
        output: tuple[Tensor, Tensor, Tensor], target: Targets, step: int
    ) -> tuple[Tensor, Tensor]:
        image, mu, logvar = output
        reconstruction = nn.functional.binary_cross_entropy_with_logits(
            image, target[0], reduction="sum"
        ) / len(image)
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1).mean()
        # KL annealing: up to 1 over 40 steps; the bug's schedule runs down from 1 and on
        # past 0 at step 40.
        beta = 1.0 - step / 40 if buggy else min(1.0, step / 40)
        return reconstruction + beta * kl, reconstruction + kl

    return Loop(model=model, optimizer=_adam(model), batch=_pixels_and_labels, objective=loss)


_AE = "autoencoder / VAE"
CASES = [
    Case(name="ae-sigmoid-twice", model=_AE, family="wrong_loss", layers=("squash",),
         bug="the decoder ends in Sigmoid and the loss is BCE with logits: two sigmoids",
         planted=0, visible=0, build=_sigmoid_twice),
    Case(name="ae-aux-explosion-clipped", model=_AE, family="exploding_grad",
         layers=("classify",),
         bug="from step 40 the auxiliary classifier's loss weighs 1,000, not 1; clipping to "
         "1 hides it and the logged loss is the reconstruction's",
         planted=40, visible=40, build=_aux_explosion),
    Case(name="vae-kl-weight-negative", model=_AE, family="activation_drift",
         layers=("logvar", "mu"),
         bug="a KL annealing schedule that runs down from 1 and past 0 at step 40",
         planted=40, visible=61, build=_kl_weight_negative,
         note="rewarded for KL, the code's scale grows: logvar's output is 10 times its scale "
         "before step 40 at step 61 (mu's gradient from step 55)"),
]  # fmt: skip
