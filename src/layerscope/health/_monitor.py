"""The health monitor: the rules, run on each flush's rows on the writer thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from layerscope.health._accumulating_grad import AccumulatingGrad, accumulation_probe
from layerscope.health._alert import Alert
from layerscope.health._attention_collapse import AttentionCollapse
from layerscope.health._codes import Codes
from layerscope.health._config import AlertsConfig
from layerscope.health._constant_input import ConstantInput
from layerscope.health._dead import Dead
from layerscope.health._drift import ActivationDrift
from layerscope.health._eval_mode import EvalMode
from layerscope.health._gradients import Gradients
from layerscope.health._loss_collapse import LossCollapse
from layerscope.health._loss_spike import LossSpike
from layerscope.health._nonfinite import NonFinite
from layerscope.health._not_learning import NotLearning
from layerscope.health._order import ModuleOrder
from layerscope.health._parameter_sets import left_out_of, matrices_of
from layerscope.health._rate_bound import RateNote
from layerscope.health._readings import read_flush
from layerscope.health._roots import Roots
from layerscope.health._scaler_skips import ScalerSkips
from layerscope.health._update_ratio import UpdateRatio
from layerscope.health._wrong_loss import WrongLoss
from layerscope.model import AttentionRow, CallEvent, ModuleInfo, StatsRows

_log = logging.getLogger("layerscope")
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class HealthMonitor:
    """Evaluates the rules on finalised rows; keeps the alerts for the training thread too.

    ``observe`` runs on the writer thread after each flush is finalised; ``take`` hands the
    alerts found since its last call to the training thread, which logs them.
    """

    def __init__(
        self,
        config: AlertsConfig,
        modules: Sequence[ModuleInfo],
        left_out: frozenset[tuple[str, str]] | None = None,
        probe: tuple[str, str] | None = None,
        matrices: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self.order = ModuleOrder(modules)
        self._codes = Codes(self.order)
        self._roots = Roots()
        self.seconds = 0.0  # the writer thread's time in the rules
        self.flushes = 0  # flushes whose rows the rules read
        self.rows = 0
        rules = config.rules
        self._rules: list[
            NonFinite | Dead | Gradients | UpdateRatio | ActivationDrift | ConstantInput
        ] = []
        self._nonfinite = NonFinite(self.order) if "nonfinite" in rules else None
        if self._nonfinite is not None:
            self._rules.append(self._nonfinite)
        if "dead" in rules:
            self._rules.append(Dead(self._codes, **rules["dead"]))
        gradients = [name for name in Gradients.rules if name in rules]
        if gradients:
            options = {**rules.get("vanishing_grad", {}), **rules.get("exploding_grad", {})}
            self._rules.append(Gradients(self._codes, **options, enabled=tuple(gradients)))
        self._update_ratio = (
            UpdateRatio(self._codes, **rules["update_ratio"], left_out=left_out, matrices=matrices)
            if "update_ratio" in rules
            else None
        )
        if self._update_ratio is not None:
            self._rules.append(self._update_ratio)
        if "activation_drift" in rules:
            self._rules.append(ActivationDrift(self._codes, **rules["activation_drift"]))
        if "constant_input" in rules:
            self._rules.append(ConstantInput(self._codes))
        self._loss = (
            LossSpike(self._codes, **rules["loss_spike"]) if "loss_spike" in rules else None
        )
        self._collapse = (
            LossCollapse(**rules["loss_collapse"]) if "loss_collapse" in rules else None
        )
        self._not_learning = (
            NotLearning(**rules["not_learning"]) if "not_learning" in rules else None
        )
        self._skips = (
            ScalerSkips(self._codes, **rules["scaler_skips"]) if "scaler_skips" in rules else None
        )
        self._attention = (
            AttentionCollapse(self.order, **rules["attention_collapse"])
            if "attention_collapse" in rules
            else None
        )
        # The (module, parameter) whose gradient is watched across optimizer steps.
        self._carried = AccumulatingGrad(probe) if "accumulating_grad" in rules else None
        self._eval_mode = EvalMode(self.order) if "eval_mode" in rules else None
        self._wrong_loss = WrongLoss(self.order) if "wrong_loss" in rules else None
        self._pending: list[Alert] = []
        self._lock = threading.Lock()
        self._skipped: set[int] = set()  # steps marked skipped whose rows may still come

    @classmethod
    def for_run(
        cls,
        config: AlertsConfig,
        modules: Sequence[ModuleInfo],
        targets: Iterable[tuple[str, nn.Module]],
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> HealthMonitor | None:
        """The monitor of a run watching ``targets``; None where no rule is on."""
        if not config.rules:
            return None
        watched = list(targets)
        probe = accumulation_probe(watched, optimizers)
        probed = None if probe is None else probe[:2]
        return cls(config, modules, left_out_of(watched, optimizers), probed, matrices_of(watched))

    def note_stalled(self, step: int, stalled: dict[tuple[str, str], str]) -> None:
        """Which parameters cannot learn at recorded ``step``, and why (the training thread's)."""
        if self._update_ratio is not None:
            self._update_ratio.note_stalled(step, stalled)

    def note_rates(self, step: int, note: RateNote) -> None:
        """How far an adaptive optimizer's step may move each parameter at recorded ``step``."""
        if self._update_ratio is not None:
            self._update_ratio.note_rates(step, note)
        if self._not_learning is not None:
            self._not_learning.note_rates(step, note.rates)

    def note_output(self, step: int, spread: torch.Tensor, width: int) -> bool:
        """How much the model's output varies over the samples at recorded ``step``.

        Whether later steps' are still wanted (not_learning judged, or off: none is read).
        """
        return self._not_learning is not None and self._not_learning.note_output(
            step, spread, width
        )

    def learn_calls(self, calls: Sequence[CallEvent]) -> None:
        """Take the call order of a recorded step: the forward order of modules."""
        self.order.learn(calls)

    def observe(
        self,
        chunks: Sequence[StatsRows],
        scalars: Sequence[tuple[int, str, float]],
        attention: Sequence[AttentionRow] = (),
    ) -> list[Alert]:
        """The alerts of one flush: its statistics' and attention rows, then its scalars.

        Alerts of the rows come step by step; within a step, the statistics' rules first, in
        their order, then attention's.
        """
        started = time.thread_time()
        self.flushes += 1
        self.rows += sum(len(chunk) for chunk in chunks)
        # A step's mark comes with its rows or before them: with the rows that end the step.
        self._skipped.update(step for step, name, value in scalars if name == "skipped" and value)
        flush = read_flush(chunks, self._codes, self._roots)
        for view in flush.views:
            view.skipped = view.step in self._skipped
        if self._nonfinite is not None:  # the losses, read in step order with the rows
            self._nonfinite.hear(scalars)
        # Each rule judges the whole flush; its alerts go step by step, then rule by rule.
        found = [
            ((flush.views[view].step, view, number, *within), alert)
            for number, rule in enumerate(self._rules)
            for view, within, alert in rule.observe(flush)
        ]
        if self._attention is not None:
            # Attention rows are training rows: after the rules of the step's training view,
            # before its evaluation's (views of a step come training first).
            train = {v.step: index for index, v in enumerate(flush.views) if v.phase == "train"}
            found += [
                ((alert.step, train.get(alert.step, -1), len(self._rules), at), alert)
                for at, alert in enumerate(self._attention.observe(attention))
            ]
        alerts = [alert for _, alert in sorted(found, key=lambda item: item[0])]
        if self._loss is not None:
            self._loss.observe(flush)
        if self._skips is not None:
            self._skips.observe(flush)
        recorded = [v.step for v in flush.views if v.judged]
        if recorded:  # a step's training rows come once
            self._skipped = {step for step in self._skipped if step > max(recorded)}
        if self._nonfinite is not None:
            alerts += self._nonfinite.loss_alerts()
        if self._loss is not None:
            for step, name, value in scalars:
                alerts += self._loss.observe_scalar(step, name, value)
        if self._collapse is not None:
            for step, name, value in scalars:
                alerts += self._collapse.observe_scalar(step, name, value)
        if self._not_learning is not None:
            for step, name, value in scalars:
                alerts += self._not_learning.observe_scalar(step, name, value)
        if self._skips is not None:
            alerts += self._skips.observe_scalars(scalars)
        if self._carried is not None:
            alerts += self._carried.observe_scalars(scalars)
        if self._eval_mode is not None:
            alerts += self._eval_mode.observe_scalars(scalars)
        if self._wrong_loss is not None:
            alerts += self._wrong_loss.observe_scalars(scalars)
        if alerts:
            with self._lock:
                self._pending += alerts
        self.seconds += time.thread_time() - started
        return alerts

    def take(self) -> list[Alert]:
        """The alerts found since the last call, for the training thread."""
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    def log_found(self) -> None:
        """Log the alerts found since the last call: one line each, logger ``layerscope``."""
        for alert in self.take():
            _log.log(_LEVELS[alert.severity], "layerscope %s: %s", alert.rule, alert.message)
