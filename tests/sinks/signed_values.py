"""Values of both signs for the sinks' signed histograms, and their bins by numpy."""

import math

import numpy as np
from torch import nn

#: Values from -8895 to 3 with zeros of both signs and a subnormal; NON_FINITE has no bin.
SIGNED_VALUES = [-8895.0, -300.0, -2.0, -1.5, -0.75, -0.0, 0.0, 1e-40, 0.25, 1.0, 3.0, 3.0]
NON_FINITE = [math.inf, math.nan]


def signed_bins(values):
    """{(lower, upper): count} of the occupied signed log2 bins, from numpy's frexp.

    |v| = m * 2**e with m in [0.5, 1): a positive value's bin is [2**(e-1), 2**e), a negative
    one's the mirror, (-2**e, -2**(e-1)]; zeros and subnormals of both signs share
    [-2**-126, 2**-126). Inf and NaN have none.
    """
    bins = {}
    for value in np.asarray(values, dtype=np.float32).astype(np.float64):
        if not np.isfinite(value):
            continue
        if abs(value) < 2.0**-126:
            edges = (-(2.0**-126), 2.0**-126)
        else:
            _, e = np.frexp(abs(value))
            edges = (2.0 ** (e - 1), 2.0**e) if value > 0 else (-(2.0**e), -(2.0 ** (e - 1)))
        bins[edges] = bins.get(edges, 0) + 1
    return bins


class Emit(nn.Module):
    """Outputs its input: its activation is the values fed to it."""

    def forward(self, x):
        return x + 0.0


def magnitude_counts(counts, edges):
    """A signed histogram's counts folded onto |x|'s log2 slots, in slot order, zeros left out.

    A positive bin starts at its slot's power of two, a negative one ends at its negative;
    the bin around 0 is slot 0.
    """
    folded = {}
    for count, low, high in zip(counts, edges, edges[1:], strict=False):
        if count:
            slot = 0 if low < 0 < high else int(math.log2(-high if high < 0 else low)) + 127
            folded[slot] = folded.get(slot, 0) + count
    return [folded[slot] for slot in sorted(folded)]
