"""A zoo of training bugs planted at a known layer and step, each with a healthy twin."""

from diagnosis_zoo import autoencoder, cnn, gpt, mlp, resnet, rnn
from diagnosis_zoo.case import FAMILIES, Case
from diagnosis_zoo.running import SCHEDULES, Outcome, train
from diagnosis_zoo.scoring import VERDICTS, Said, Verdict, alarms, judge, window

CASES: list[Case] = [
    *mlp.CASES,
    *cnn.CASES,
    *resnet.CASES,
    *gpt.CASES,
    *rnn.CASES,
    *autoencoder.CASES,
]

__all__ = [
    "CASES",
    "FAMILIES",
    "SCHEDULES",
    "VERDICTS",
    "Case",
    "Outcome",
    "Said",
    "Verdict",
    "alarms",
    "judge",
    "train",
    "window",
]
