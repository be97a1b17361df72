"""Which step a forward, a backward or a parameter read belongs to, and whether it records.

A step is one training iteration. It ends at the optimizer's step (``optimizer=``) or at
``scope.step()``; an iteration whose optimizer step was skipped (GradScaler found an Inf) is a
step of its own. A forward pass in evaluation (eval mode or no gradients) never advances the
step: one that comes right after a step ended, before the next training pass, belongs to the
step that ended, so that ``if step % 50 == 0: evaluate()`` after ``optimizer.step()`` is
recorded with step 50. It records when that step records or the next one does: a trainer
evaluating after its global step 100 (step 99 here) is recorded where ``every=100`` records
step 100. Evaluation in the middle of a step belongs to that step.

A micro-batch whose optimizer step accelerate held back is no step: it belongs to the step
its window's optimizer step ends, and so do the scalars passed with it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from layerscope._schedule import Schedule


class StepClock:
    """The step in progress, the pass in progress, and the gates the hooks read.

    ``recording`` and ``watching`` are plain bools because compiled models guard on them;
    they change only where a step ends or a pass begins, never inside a pass.
    ``watching_gradients`` says that the step in progress gets the gradients' sentinel.
    """

    def __init__(
        self,
        schedule: Schedule,
        has_sentinel: bool,
        on_accelerator: Callable[[], bool],
        first_step: int = 0,
        has_gradient_sentinel: bool = False,
    ) -> None:
        self._schedule = schedule
        self._has_sentinel = has_sentinel
        self._has_gradient_sentinel = has_gradient_sentinel
        self._on_accelerator = on_accelerator
        self.step = first_step  # the training step in progress
        self.pass_step = 0  # the step the pass in progress records under
        self.training = True  # the pass in progress is a training pass
        self.recording = False  # the hooks record now
        self.watching = False  # the hooks feed the sentinel now
        self.watching_gradients = False  # the step's gradients feed the sentinel
        self.step_records = False  # the step in progress records
        self.ended: int | None = None  # the last step that ended
        self.trained = False  # a training pass began in the step in progress
        self._after: int | None = None  # a step that ended, while its evaluation may come
        # Whether the gates stay on between passes for the evaluation of a recorded step that
        # just ended. A compiled model decides its gates where a compiled frame is entered,
        # before any hook can say which pass it is: there they follow the step alone.
        self.gates_follow_passes = True
        self._set_modes()

    @property
    def evaluation_pending(self) -> bool:
        """Whether evaluation now would belong to the step that just ended."""
        return self._after is not None

    def open_steps(self) -> tuple[int, int]:
        """The first steps whose (training, evaluation) rows may still grow."""
        return self.step, self.step if self._after is None else self._after

    def end_step(self) -> int:
        """End the step in progress; return its number."""
        ended = self.step
        self.step += 1
        self.ended = self._after = ended
        self.trained = False
        self._set_modes()
        return ended

    def begin_pass(self, training: bool) -> bool:
        """A forward pass begins; return True when it ends the evaluation of the last step."""
        self.training = training
        closed = False
        if training:
            closed = self._after is not None
            self._after = None
            self.trained = True
            self.pass_step = self.step
            self.recording = self.step_records
            self.watching = self._watches(self.step)
        else:
            self.pass_step = self.step if self._after is None else self._after
            # The evaluation of a step that ended records if that step does, or the next one:
            # trainers evaluate after their step N (here N - 1), before the recorded step N.
            self.recording = self._schedule.records(self.pass_step) or (
                self._after is not None and self.step_records
            )
            self.watching = False  # the sentinel watches training only
        return closed

    def _set_modes(self) -> None:
        self.step_records = self._schedule.records(self.step)
        self.pass_step = self.step
        self.training = True
        after_records = (
            self.gates_follow_passes
            and self._after is not None
            and self._schedule.records(self._after)
        )
        # Between passes the hooks stay on if the next pass may record: a training pass of
        # this step, or an evaluation of the step that just ended.
        self.recording = self.step_records or after_records
        self.watching = self._watches(self.step)
        self.watching_gradients = self._has_gradient_sentinel and (
            self._schedule.gradient_sentinel_at(self.step, self._accelerated())
        )

    def records(self, step: int) -> bool:
        """Whether ``step`` records (full statistics)."""
        return bool(self._schedule.records(step))

    def _watches(self, step: int) -> bool:
        return self._has_sentinel and self._schedule.sentinel_at(step)

    def _accelerated(self) -> bool:
        # Where the model lives is asked only when the schedule leaves it to that.
        return self._schedule.sentinel is None and self._on_accelerator()


class MicroBatchScalars:
    """Scalars passed with held-back micro-batches, kept until their step ends.

    The step records each scalar's mean over the calls that passed it in the step, as trainers
    log the loss of an accumulated step. Tensors stay on their device: no host sync.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float | Tensor] = {}
        self._counts: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._counts)

    def hold(self, scalars: Mapping[str, float | Tensor]) -> None:
        """Keep ``scalars`` (checked as ``scope.step()`` checks them) for the step's end."""
        for name, value in scalars.items():
            value = _summable(name, value)
            held = self._sums.get(name)
            self._sums[name] = value if held is None else held + value
            self._counts[name] = self._counts.get(name, 0) + 1

    def merged(self, scalars: Mapping[str, float | Tensor]) -> dict[str, float | Tensor]:
        """``scalars`` with the held ones: the mean of each name's values; none stay held."""
        if not self._counts:
            return dict(scalars)
        self.hold(scalars)
        means = {name: total / self._counts[name] for name, total in self._sums.items()}
        self._sums.clear()
        self._counts.clear()
        return means


def _summable(name: str, value: object) -> float | Tensor:
    """``value`` as a number or a detached one-element floating tensor of at least fp32."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"step: scalar {name!r} must have one element, got shape {tuple(value.shape)}"
            )
        detached = value.detach()
        # Sums of fp16 or integer values would round or overflow before the division.
        if detached.dtype not in (torch.float32, torch.float64):
            detached = detached.float()
        return detached
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"step: scalar {name!r} must be a number or a one-element tensor, "
        f"got {type(value).__name__}"
    )
