"""The layout of one row of partials: the mergeable state of one recorded tensor.

A row is a float64 vector. Counts are stored as float64 too: they are exact below 2**53, which
no tensor reaches, and one dtype lets a whole row travel to the host in a single copy.

``Field`` is the one declaration of a row: each field's place, how two rows merge it and its
value for a tensor with no elements. Merging (``_merge``), empty rows (``_partials``) and the C
kernel's check (``_native``) are derived from it; adding a statistic's partial is a change here,
in the kernels that compute it and in ``_native.c``'s ``LAYERSCOPE_FIELDS``, which the loader
compares with this name by name.
"""

from __future__ import annotations

import math
from enum import Enum, IntEnum

from layerscope.stats._formats import PRECISION_COUNTS


class Merge(Enum):
    """How the field of rows of parts of a tensor gives the field of the whole."""

    SUM = "sum"  # counts add
    MEAN = "mean"  # Chan: the count-weighted mean of the parts' means
    M2 = "m2"  # Chan: the parts' M2 plus the spread of their means around the whole's
    MIN = "min"
    MAX = "max"


class Field(IntEnum):
    """Column index of each partial in a row, with its merge rule and empty value."""

    merge: Merge
    empty: float  # a tensor with no elements; also the identity of the merge
    c_name: str  # its name in _native.c, where math.h takes NAN and INF

    NUMEL = 0, Merge.SUM, 0.0  # every element, finite or not
    COUNT = 1, Merge.SUM, 0.0  # finite elements: the n of mean and M2
    MEAN = 2, Merge.MEAN, 0.0  # mean of the finite elements
    M2 = 3, Merge.M2, 0.0  # sum of squared deviations of the finite elements from their mean
    MIN = 4, Merge.MIN, math.inf  # smallest finite element, +inf if none
    MAX = 5, Merge.MAX, -math.inf  # largest finite element, -inf if none
    ZEROS = 6, Merge.SUM, 0.0
    NAN = 7, Merge.SUM, 0.0, "NANS"
    INF = 8, Merge.SUM, 0.0, "INFS"  # +inf and -inf
    NEG = 9, Merge.SUM, 0.0  # elements < 0, -inf included
    POS = 10, Merge.SUM, 0.0  # elements > 0, +inf included
    # Per low-precision format (_formats.FORMATS, in its order): finite values with |x| > its
    # largest, and values with 0 < |x| < its smallest subnormal.
    E4M3_OVER = 11, Merge.SUM, 0.0
    E4M3_UNDER = 12, Merge.SUM, 0.0
    E5M2_OVER = 13, Merge.SUM, 0.0
    E5M2_UNDER = 14, Merge.SUM, 0.0
    FP16_OVER = 15, Merge.SUM, 0.0
    FP16_UNDER = 16, Merge.SUM, 0.0
    BF16_OVER = 17, Merge.SUM, 0.0
    BF16_UNDER = 18, Merge.SUM, 0.0

    def __new__(cls, index: int, merge: Merge, empty: float, c_name: str = "") -> Field:
        field = int.__new__(cls, index)
        field._value_ = index
        field.merge = merge
        field.empty = empty
        field.c_name = c_name
        return field

    def __init__(self, *_: object) -> None:
        self.c_name = self.c_name or self.name


WIDTH = len(Field)
#: The formats' counts, contiguous in row order as the kernels write them: each format's
#: overflow then underflow, in ``_formats.magnitude_ranges``' order.
HEADROOM_FIELDS = tuple(Field[column.upper()] for column in PRECISION_COUNTS)
assert tuple(range(HEADROOM_FIELDS[0], HEADROOM_FIELDS[0] + 8)) == HEADROOM_FIELDS
EMPTY_ROW = tuple(field.empty for field in Field)  # the partials of a tensor with no elements


def merged_by(rule: Merge) -> tuple[Field, ...]:
    """The fields that ``rule`` merges, in row order."""
    return tuple(field for field in Field if field.merge is rule)


def c_names() -> str:
    """The fields' names in ``_native.c``, as its ``layerscope_fields()`` spells them."""
    return " ".join(field.c_name for field in Field)
