"""Bugs of recurrent character models (GRU, LSTM) on a text of random sentences."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diagnosis_zoo.case import Case
from diagnosis_zoo.data import PAD, text, text_batch
from diagnosis_zoo.loop import Loop

EMBED, HIDDEN = 32, 64


class LayerNorm(nn.Module):
    """A hand-written LayerNorm over the last dimension, ``eps`` inside the square root."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(variance + self.eps) * self.weight + self.bias


class CharRNN(nn.Module):
    """tokens -> embed (padding row 0) -> norm -> rnn (GRU or LSTM) -> head -> logits."""

    def __init__(self, cell: type[nn.Module] = nn.GRU, eps: float = 1e-5) -> None:
        super().__init__()
        _, vocabulary = text()
        self.embed = nn.Embedding(vocabulary, EMBED, padding_idx=PAD)
        self.norm = LayerNorm(EMBED, eps)
        self.rnn = cell(EMBED, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, vocabulary)

    def forward(self, tokens: Tensor) -> Tensor:
        states, _ = self.rnn(self.norm(self.embed(tokens)))
        logits: Tensor = self.head(states)  # (batch, length, vocabulary)
        return logits


def _padded(step: int) -> tuple[Tensor, Tensor]:
    tokens, targets = text_batch(step)
    if step >= 40:  # from here the last four rows are shorter windows, padded at the end
        tokens, targets = tokens.clone(), targets.clone()
        tokens[-4:, -8:], targets[-4:, -8:] = PAD, -100
    return tokens, targets


def _norm_eps_zero(buggy: bool) -> Loop:
    model = CharRNN(eps=0.0 if buggy else 1e-5)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Loop(model=model, optimizer=optimizer, batch=_padded)


def _lr_zero_group(buggy: bool) -> Loop:
    model = CharRNN()
    head = list(model.head.parameters())
    rest = [p for name, p in model.named_parameters() if not name.startswith("head.")]
    optimizer = torch.optim.Adam([{"params": rest}, {"params": head}], lr=3e-3)

    def before(step: int) -> None:
        if buggy and step == 40:  # a per-group schedule whose head factor ends at 0
            optimizer.param_groups[1]["lr"] = 0.0

    return Loop(model=model, optimizer=optimizer, batch=text_batch, before=before)


def _lstm_no_clip(buggy: bool) -> Loop:
    model = CharRNN(cell=nn.LSTM)
    # The classic word-language-model recipe: plain SGD at 20, gradients clipped to 0.25.
    optimizer = torch.optim.SGD(model.parameters(), lr=20.0)
    return Loop(model=model, optimizer=optimizer, batch=text_batch, clip=None if buggy else 0.25)


_RNN = "GRU / LSTM"
CASES = [
    Case(name="gru-norm-eps-zero", model=_RNN, family="nonfinite", layers=("norm",),
         bug="a hand-written LayerNorm with eps=0 meets padding (zero embeddings) from step 40",
         planted=40, visible=40, scalar_visible=41, build=_norm_eps_zero, origin_until=40,
         note="norm's output is NaN at the padded positions of step 40; the loss from step 41, "
         "when step 40's update has made every weight NaN"),
    Case(name="gru-lr-zero-group", model=_RNN, family="update_ratio", layers=("head",),
         bug="at step 40 the head's parameter group goes to learning rate 0",
         planted=40, visible=40, build=_lr_zero_group),
    Case(name="lstm-no-clip", model=_RNN, family="exploding_grad", also=("loss_spike",),
         layers=("rnn", "norm"), bug="SGD at 20 without the recipe's clipping to 0.25",
         planted=0, visible=2, scalar_visible=3, origin_until=4, build=_lstm_no_clip,
         note="the LSTM's backward through time, seen in its gradients or its input's (norm's "
         "output): 7 to 20 times their first steps' at step 2; the loss is 3.4 times its start "
         "at step 3 (a loss_spike that says so names the problem). By step 5 the gates "
         "saturate and the gradients upstream vanish: only records of steps 2 to 4 show where"),
]  # fmt: skip
