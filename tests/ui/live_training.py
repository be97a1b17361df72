"""A run being written by another thread, step by step, on the test's signal."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import torch
from ui_runs import tiny_model

import layerscope


class LiveTraining:
    """Trains the tiny MLP into ``path`` in a thread, ``steps_per_round`` steps per round.

    ``next_round()`` lets one more round run and waits until its rows are flushed to the run;
    leaving the ``with`` lets the thread finish and close the run.
    """

    def __init__(self, path: Path, steps_per_round: int = 2) -> None:
        self.path = path
        self.steps_per_round = steps_per_round
        self.steps = 0
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._train, daemon=True)

    def __enter__(self) -> LiveTraining:
        self._thread.start()
        self.next_round()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._go.release()
        self._thread.join(timeout=60)
        if self._error is not None:
            raise self._error

    def next_round(self) -> None:
        self._go.release()
        if not self._done.acquire(timeout=60):
            raise TimeoutError("the training thread did not finish its round")
        if self._error is not None:
            raise self._error

    def _train(self) -> None:
        try:
            model = tiny_model()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            generator = torch.Generator().manual_seed(2)
            with (
                warnings.catch_warnings(),
                layerscope.watch(model, run=self.path, every=1, optimizer=optimizer) as scope,
            ):
                warnings.simplefilter("ignore")
                while True:
                    self._go.acquire()
                    if self._stop:
                        return
                    for _ in range(self.steps_per_round):
                        inputs = torch.randn(6, 4, generator=generator)
                        if self.steps == 3:
                            inputs[0, 0] = float("nan")  # an alert, while the page watches
                        loss = model(inputs).pow(2).mean()
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
                        scope.step(loss=loss)
                        self.steps += 1
                    scope.flush()
                    self._done.release()
        except BaseException as error:  # reported on the test's thread
            self._error = error
            self._done.release()
