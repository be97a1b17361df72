"""Wrong arguments are refused with a ValueError that names the argument."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda plot: plot.stats(modules=["nope"]), "modules"),
        (lambda plot: plot.stats(modules="^zzz"), "modules"),
        (lambda plot: plot.stats(kind="gradient"), "kind"),
        (lambda plot: plot.stats(stats=("median",)), "stats"),
        (lambda plot: plot.stats(phase="test"), "phase"),
        (lambda plot: plot.heatmap(stat="median"), "stat"),
        (lambda plot: plot.heatmap(kind="nope"), "kind"),
        (lambda plot: plot.color_dim(modules=["x"]), "modules"),
        (lambda plot: plot.dead_chart(kind="weights"), "kind"),
        (lambda plot: plot.histogram("9"), "modules"),
        (lambda plot: plot.histogram("0", steps=[99]), "steps"),
        (lambda plot: plot.scalars(names=["accuracy"]), "names"),
        # A kind the run has no rows of for these layers (ReLU has no weights).
        (lambda plot: plot.stats(kind="weight", modules=["1"]), "kind"),
    ],
)
def test_bad_argument_is_named(run, call, argument):
    with pytest.raises(ValueError, match=f"^{argument}:"):
        call(run.plot)
