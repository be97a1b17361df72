"""parse_stats: the ``stats=`` argument."""

from __future__ import annotations

import pytest

from layerscope.stats import BUILTIN_STATS, StatSelection, parse_stats


def rms(t: object) -> float:
    return 0.0


def test_none_is_every_builtin() -> None:
    selection = parse_stats(None)
    assert isinstance(selection, StatSelection)
    assert selection.builtin == BUILTIN_STATS
    assert dict(selection.custom) == {}


def test_builtin_tuple_is_complete_and_ordered() -> None:
    assert BUILTIN_STATS == (
        "mean", "std", "min", "max", "absmax", "l2",
        "zero_frac", "neg_frac", "pos_frac", "nan_count", "inf_count", "hist",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["std", "mean"], ("mean", "std")),
        (["hist", "l2", "min"], ("min", "l2", "hist")),
        (("inf_count", "mean", "inf_count"), ("mean", "inf_count")),
        ({"max": None}.keys(), ("max",)),
        (iter(["nan_count"]), ("nan_count",)),
        (list(reversed(BUILTIN_STATS)), BUILTIN_STATS),
    ],
)
def test_names_keep_builtin_order(names: object, expected: tuple[str, ...]) -> None:
    selection = parse_stats(names)
    assert selection.builtin == expected
    assert dict(selection.custom) == {}


@pytest.mark.parametrize("name", ["median", "Mean", "std ", "histogram", "numel", "step", ""])
def test_unknown_name(name: str) -> None:
    with pytest.raises(ValueError, match="stats") as info:
        parse_stats(["mean", name])
    assert repr(name) in str(info.value)


def test_custom_dict_adds_to_the_defaults() -> None:
    selection = parse_stats({"rms": rms, "p99": abs})
    assert selection.builtin == BUILTIN_STATS
    assert dict(selection.custom) == {"rms": rms, "p99": abs}


def test_names_and_dict_mixed() -> None:
    selection = parse_stats(["max", {"rms": rms}, "mean", {"top": max}])
    assert selection.builtin == ("mean", "max")
    assert dict(selection.custom) == {"rms": rms, "top": max}


@pytest.mark.parametrize(
    "name",
    ["mean", "hist", "step", "phase", "rank", "module", "module_type", "kind", "tensor", "call",
     "dtype", "shape", "numel", "nan_count"],
)  # fmt: skip
def test_custom_name_may_not_shadow_a_column(name: str) -> None:
    with pytest.raises(ValueError, match="stats") as info:
        parse_stats({name: rms})
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["", "two words", "1st", "a-b", "class", "lambda", 3, None])
def test_custom_name_must_be_an_identifier(name: object) -> None:
    with pytest.raises(ValueError, match="stats"):
        parse_stats([{name: rms}])


@pytest.mark.parametrize("fn", [None, 3, "mean", [rms]])
def test_custom_must_be_callable(fn: object) -> None:
    with pytest.raises(TypeError, match="stats") as info:
        parse_stats({"rms": fn})
    assert "'rms'" in str(info.value)


@pytest.mark.parametrize("arg", ["mean", rms, 3, 2.5, [3], ["mean", None], [["mean"]]])
def test_wrong_types(arg: object) -> None:
    with pytest.raises(TypeError, match="stats"):
        parse_stats(arg)
