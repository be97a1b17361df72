"""The layout of one row of partials: the mergeable state of one recorded tensor.

A row is a float64 vector. Counts are stored as float64 too: they are exact below 2**53, which
no tensor reaches, and one dtype lets a whole row travel to the host in a single copy.
"""

from __future__ import annotations

from enum import IntEnum


class Field(IntEnum):
    """Column index of each partial in a row."""

    NUMEL = 0  # every element, finite or not
    COUNT = 1  # finite elements: the n of mean and M2
    MEAN = 2  # mean of the finite elements
    M2 = 3  # sum of squared deviations of the finite elements from their mean
    MIN = 4  # smallest finite element, +inf if none
    MAX = 5  # largest finite element, -inf if none
    ZEROS = 6
    NAN = 7
    INF = 8  # +inf and -inf
    NEG = 9  # elements < 0, -inf included
    POS = 10  # elements > 0, +inf included


WIDTH = len(Field)
