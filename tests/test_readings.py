"""Readings as integer columns, and their grouping against a dictionary that does it by hand."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerscope.recording._readings import FIELDS, Readings, group_readings


def groups_by_hand(keys: list[int], replaces: list[bool]) -> list[list[int]]:
    """Each group's readings, groups in order of first appearance; a replacing reading
    drops its group's readings before it (its place in the order stays)."""
    groups: dict[int, list[int]] = {}
    for index, (key, replacing) in enumerate(zip(keys, replaces, strict=True)):
        if key not in groups or replacing:
            groups[key] = [index]
        else:
            groups[key].append(index)
    return list(groups.values())


def groups_of(keys: list[int], replaces: list[bool]) -> list[list[int]]:
    grouping = group_readings(torch.tensor(keys), torch.tensor(replaces))
    kept = grouping.kept.tolist() if grouping.kept is not None else [True] * len(keys)
    members: list[list[int]] = [[] for _ in range(grouping.first.shape[0])]
    for index, group in enumerate(grouping.group.tolist()):
        if kept[index]:
            members[group].append(index)
    for group, first in enumerate(grouping.first.tolist()):
        assert grouping.group[first] == group  # the first reading of its group
    return members


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_grouping_matches_a_dictionary(readings: list[tuple[int, bool]]) -> None:
    keys = [key for key, _ in readings]
    replaces = [replacing for _, replacing in readings]
    assert groups_of(keys, replaces) == groups_by_hand(keys, replaces)


def test_keys_of_step_and_identity_keep_first_appearance_order() -> None:
    steps = torch.tensor([5, 5, 6, 5, 6])
    identities = torch.tensor([9, 2, 9, 9, 2])
    grouping = group_readings((steps << 32) | identities, torch.zeros(5, dtype=torch.int64))
    assert grouping.first.tolist() == [0, 1, 2, 4]
    assert grouping.group.tolist() == [0, 1, 2, 0, 3]
    assert grouping.kept is None


def test_readings_read_back_as_columns_and_custom_refs_by_index() -> None:
    readings = Readings()
    assert len(readings) == 0
    assert readings.columns().shape == (0, FIELDS)
    readings.add(3, 10, 1, 0, 0, False)
    readings.add(3, 11, 2, 0, 1, True, custom=(("rms", 0, 1, True, 8),))
    readings.add(2**40, 12, 1, 1, 5, False)  # int64 columns
    assert len(readings) == 3
    assert readings.columns().tolist() == [
        [3, 10, 1, 0, 0, 0],
        [3, 11, 2, 0, 1, 1],
        [2**40, 12, 1, 1, 5, 0],
    ]
    assert readings.custom == {1: (("rms", 0, 1, True, 8),)}
