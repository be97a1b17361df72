"""``scaler_skips`` read row by row: the library's count of skips, the overflowing layer here."""

from __future__ import annotations

from layerscope.health._scaler_skips import ScalerSkips as Columnar
from rowwise.readings import ModuleOrder, StepView


class ScalerSkips(Columnar):
    """The library's rule, but the first overflowing layer of a step taken from its readings."""

    def __init__(self, order: ModuleOrder, **options: float) -> None:
        super().__init__(None, **options)  # type: ignore[arg-type]  # no codes: rows read here
        self._order = order

    def observe_view(self, view: StepView) -> None:
        """Keep the layer whose gradient overflowed first in backward order, if skipped."""
        if not view.skipped or view.phase != "train" or view.sentinel:
            return
        overflowed = [
            ((-self._order.forward(r.module)[1], 0 if r.kind == "grad" else 1), r.module)
            for r in view.readings
            if r.nonfinite and r.kind in ("grad", "weight_grad")
        ]
        if overflowed:
            self._overflowed[view.step] = min(overflowed)[1]
            while len(self._overflowed) > 64:
                del self._overflowed[min(self._overflowed)]
