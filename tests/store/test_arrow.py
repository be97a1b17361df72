"""Trimmed histograms: what is stored widens back to exactly the counts that were recorded."""

from __future__ import annotations

import numpy as np
import pandas as pd

from layerscope.store._arrow import _trimmed_histogram, widened_histograms


def _dense(rng: np.random.Generator, rows: int, slots: int) -> np.ndarray:
    counts = np.zeros((rows, slots))
    for row in range(rows):
        shape = row % 5
        if shape == 0:
            continue  # no count at all
        if shape == 1:
            counts[row] = rng.integers(0, 3, slots)  # the whole width, interior zeros
        elif shape == 2:
            counts[row, [0, slots - 1]] = [7, 1]  # the first and the last slot only
        else:
            lo = int(rng.integers(0, slots))
            hi = int(rng.integers(lo, slots))
            counts[row, lo : hi + 1] = rng.integers(0, 2**40, hi - lo + 1)
    return counts


def test_trimmed_histograms_widen_to_the_recorded_counts():
    rng = np.random.default_rng(0)
    counts = _dense(rng, 400, 256)
    valid = rng.random(400) > 0.2
    lo, hist = _trimmed_histogram(counts, valid)
    frame = pd.DataFrame({"hist_lo": lo.to_pandas(), "hist": hist.to_pandas()})
    for row in range(400):  # each window starts and ends on a non-zero count
        window = frame["hist"][row]
        if valid[row] and counts[row].any():
            assert window[0] != 0
            assert window[-1] != 0
    widened = widened_histograms(lo, hist, 256)
    for row in range(400):
        if valid[row]:
            np.testing.assert_array_equal(widened[row], counts[row].astype(np.int64))
        else:
            assert widened[row] is None


def test_no_rows_and_no_counts_trim_to_nothing():
    lo, hist = _trimmed_histogram(np.zeros((0, 256)), np.zeros(0, dtype=bool))
    assert len(lo) == len(hist) == 0
    lo, hist = _trimmed_histogram(np.zeros((3, 256)), np.ones(3, dtype=bool))
    assert lo.to_pylist() == [0, 0, 0]
    assert hist.to_pylist() == [[], [], []]
