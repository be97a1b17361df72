"""The health monitor: the rules, run on each flush's rows on the writer thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from layerscope.health._alert import Alert
from layerscope.health._config import AlertsConfig
from layerscope.health._loss_collapse import LossCollapse
from layerscope.health._not_learning import NotLearning
from layerscope.health._parameter_sets import left_out_of
from layerscope.model import CallEvent, ModuleInfo, StatsRows
from rowwise.dead import Dead
from rowwise.drift import ActivationDrift
from rowwise.gradients import Gradients
from rowwise.loss_spike import LossSpike
from rowwise.nonfinite import NonFinite
from rowwise.readings import ModuleOrder, step_views
from rowwise.scaler_skips import ScalerSkips
from rowwise.update_ratio import UpdateRatio

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
        matrices: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self.order = ModuleOrder(modules)
        self.seconds = 0.0  # the writer thread's time in the rules
        self.flushes = 0  # flushes whose rows the rules read
        self.rows = 0
        rules = config.rules
        self._rules: list[NonFinite | Dead | Gradients | UpdateRatio | ActivationDrift] = []
        if "nonfinite" in rules:
            self._rules.append(NonFinite(self.order))
        if "dead" in rules:
            self._rules.append(Dead(self.order, **rules["dead"]))
        gradients = [name for name in Gradients.rules if name in rules]
        if gradients:
            options = {**rules.get("vanishing_grad", {}), **rules.get("exploding_grad", {})}
            self._rules.append(Gradients(self.order, **options, enabled=tuple(gradients)))
        if "update_ratio" in rules:
            options = rules["update_ratio"]
            self._rules.append(
                UpdateRatio(self.order, **options, left_out=left_out, matrices=matrices)
            )
        if "activation_drift" in rules:
            self._rules.append(ActivationDrift(self.order, **rules["activation_drift"]))
        self._loss = LossSpike(self.order, **rules["loss_spike"]) if "loss_spike" in rules else None
        # loss_collapse and not_learning read the scalars only: the library's rules are their
        # own reference.
        self._collapse = (
            LossCollapse(**rules["loss_collapse"]) if "loss_collapse" in rules else None
        )
        self._not_learning = (
            NotLearning(**rules["not_learning"]) if "not_learning" in rules else None
        )
        self._skips = (
            ScalerSkips(self.order, **rules["scaler_skips"]) if "scaler_skips" in rules else None
        )
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
        return cls(config, modules, left_out_of(targets, optimizers))

    def learn_calls(self, calls: Sequence[CallEvent]) -> None:
        """Take the call order of a recorded step: the forward order of modules."""
        self.order.learn(calls)

    def observe(
        self, chunks: Sequence[StatsRows], scalars: Sequence[tuple[int, str, float]]
    ) -> list[Alert]:
        """The alerts of one flush: its statistics' rows, then its scalars."""
        started = time.thread_time()
        self.flushes += 1
        self.rows += sum(len(chunk) for chunk in chunks)
        alerts: list[Alert] = []
        # A step's mark comes with its rows or before them: with the rows that end the step.
        self._skipped.update(step for step, name, value in scalars if name == "skipped" and value)
        views = step_views(chunks)
        for view in views:
            view.skipped = view.step in self._skipped
            for rule in self._rules:
                alerts += rule.observe(view)
            if self._loss is not None:
                self._loss.observe(view)
            if self._skips is not None:
                self._skips.observe_view(view)
        recorded = [v.step for v in views if v.phase == "train" and not v.sentinel]
        if recorded:  # a step's training rows come once
            self._skipped = {step for step in self._skipped if step > max(recorded)}
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
