"""parse_stats: the ``stats=`` argument."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import layerscope
from layerscope.stats import BUILTIN_STATS
from layerscope.stats._selection import StatSelection, parse_stats


def rms(t: object) -> float:
    return 0.0


def rms_of(t: Tensor) -> Tensor:
    return t.float().pow(2).mean().sqrt()


def test_none_is_every_builtin() -> None:
    selection = parse_stats(None)
    assert isinstance(selection, StatSelection)
    assert selection.builtin == BUILTIN_STATS
    assert dict(selection.custom) == {}


def test_builtin_tuple_is_complete_and_ordered() -> None:
    assert BUILTIN_STATS == (
        "mean", "std", "min", "max", "absmax", "l2",
        "zero_frac", "neg_frac", "pos_frac", "nan_count", "inf_count",
        "e4m3_over", "e4m3_under", "e4m3_scale_exp", "e5m2_over", "e5m2_under", "e5m2_scale_exp",
        "fp16_over", "fp16_under", "fp16_scale_exp", "bf16_over", "bf16_under", "bf16_scale_exp",
        "hist",
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


# Every column of the stats table, written out here rather than taken from the package.
TABLE_COLUMNS = (
    "step", "phase", "rank", "module", "module_type", "kind", "tensor", "call", "sentinel",
    "dtype", "shape", "shard", "numel", *BUILTIN_STATS, "hist", "hist_lo",
)  # fmt: skip


@pytest.mark.parametrize("name", TABLE_COLUMNS)
def test_custom_name_may_not_shadow_a_column(name: str) -> None:
    with pytest.raises(ValueError, match="stats") as info:
        parse_stats({name: rms})
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["Mean", "SENTINEL", "Hist_Lo", "Shard", "NUMEL"])
def test_custom_name_may_not_shadow_a_column_in_another_case(name: str) -> None:
    # SQL names ignore case: in run.sql a column 'Mean' beside 'mean' would read as 'mean'.
    with pytest.raises(ValueError, match="stats") as info:
        parse_stats([{name: rms}])
    assert repr(name) in str(info.value)


def test_custom_names_may_not_differ_only_in_case() -> None:
    with pytest.raises(ValueError, match="stats") as info:
        parse_stats([{"rms": rms}, {"RMS": abs}])
    assert "'rms'" in str(info.value)
    assert "'RMS'" in str(info.value)
    assert dict(parse_stats([{"rms": rms}, {"rms": abs}]).custom) == {"rms": abs}  # the last


def test_every_stored_column_is_refused_as_a_custom_name(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    model = nn.Linear(3, 2)
    path = tmp_path / "run"
    # Sentinel rows too: every=Schedule(every=2) leaves step 1 to the sentinel.
    schedule = layerscope.Schedule(every=2, dense=0, sentinel=True)
    with layerscope.watch(model, every=schedule, run=path, stats={"rms": rms_of}) as scope:
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
            scope.step()
    stored = set(layerscope.load(path).sql("select * from stats").columns)
    assert {"sentinel", "hist_lo", "hist", "rms"} <= stored
    for name in stored - {"rms"}:
        with pytest.raises(ValueError, match="stats"):
            parse_stats({name: rms})


def test_watch_refuses_a_custom_statistic_named_like_a_column() -> None:
    with pytest.raises(ValueError, match=r"stats: .*'sentinel'"):
        layerscope.watch(nn.Linear(2, 2), stats={"sentinel": rms_of})


@pytest.mark.parametrize("name", ["", "two words", "1st", "a-b", "class", "lambda", 3, None])
def test_custom_name_must_be_an_identifier(name: object) -> None:
    with pytest.raises(ValueError, match="stats"):
        parse_stats([{name: rms}])


@pytest.mark.parametrize("fn", [None, 3, "mean", [rms]])
def test_custom_must_be_callable(fn: object) -> None:
    with pytest.raises(TypeError, match="stats") as info:
        parse_stats({"rms": fn})
    assert "'rms'" in str(info.value)


@pytest.mark.parametrize("arg", [rms, 3, 2.5, [3], ["mean", None], [["mean"]], b"mean"])
def test_wrong_types(arg: object) -> None:
    with pytest.raises(TypeError, match="stats"):
        parse_stats(arg)


@pytest.mark.parametrize("empty", [[], (), iter([]), set(), {}.keys()])
def test_an_empty_list_selects_nothing_and_is_refused(empty: object) -> None:
    # As kinds=(): an empty list is a mistake; stats=None is how to ask for every statistic.
    with pytest.raises(ValueError, match=r"stats: expected at least one statistic"):
        parse_stats(empty)


@pytest.mark.parametrize("no_custom", [{}, [{}]])
def test_an_empty_dict_adds_no_custom_statistic_to_the_defaults(no_custom: object) -> None:
    selection = parse_stats(no_custom)
    assert selection.builtin == BUILTIN_STATS
    assert dict(selection.custom) == {}


@pytest.mark.parametrize("name", ["mean", "hist", "inf_count"])
def test_one_name_as_a_string(name: str) -> None:
    assert parse_stats(name) == parse_stats([name])
    assert parse_stats(name).builtin == (name,)


@pytest.mark.parametrize("name", ["median", "", "mean,std"])
def test_one_unknown_name_as_a_string(name: str) -> None:
    with pytest.raises(ValueError, match="stats: unknown statistic") as info:
        parse_stats(name)
    assert repr(name) in str(info.value)


def test_watch_takes_one_statistic_as_a_string() -> None:
    model = nn.Linear(3, 2)
    with layerscope.watch(model, every=1, stats="absmax", kinds=("activation",)) as scope:
        output = model(torch.randn(4, 3))
        scope.step()
    frame = scope.frame()
    assert "absmax" in frame
    assert "mean" not in frame
    assert "hist" not in frame
    assert frame.absmax.tolist() == [pytest.approx(output.detach().abs().max().item())]


def test_a_dict_per_kind_adds_to_those_kinds_only() -> None:
    selection = parse_stats({"activation": {"rms": rms}, "weight": {"norm": rms_of}})
    assert selection.builtin == BUILTIN_STATS  # built-ins stay every kind's
    assert dict(selection.custom) == {}
    assert selection.custom_columns == ("rms", "norm")
    assert dict(selection.for_kind("activation")) == {"rms": rms}
    assert dict(selection.for_kind("weight")) == {"norm": rms_of}
    assert dict(selection.for_kind("grad")) == {}  # a kind it does not name: built-ins only


def test_every_kinds_and_a_kinds_own_statistics_combine() -> None:
    selection = parse_stats(["mean", {"rms": rms}, {"weight": {"rms": rms_of, "norm": rms_of}}])
    assert selection.builtin == ("mean",)
    assert selection.custom_columns == ("rms", "norm")
    assert dict(selection.for_kind("weight")) == {"rms": rms_of, "norm": rms_of}  # its own wins
    assert dict(selection.for_kind("input")) == {"rms": rms}


@pytest.mark.parametrize("kind", ["activations", "weights", "out", 3])
def test_an_unknown_kind_names_stats_and_lists_the_kinds(kind: object) -> None:
    with pytest.raises(ValueError, match="unknown kind") as raised:
        parse_stats({kind: {"rms": rms}})
    message = str(raised.value)
    assert message.startswith(f"stats: unknown kind {kind!r}")
    assert "activation, input, grad, input_grad, weight, weight_grad, update, buffer" in message


@pytest.mark.parametrize("value", [["absmax"], "absmax", rms])
def test_a_kinds_statistics_must_be_a_dict(value: object) -> None:
    with pytest.raises(TypeError, match=r"stats\['weight'\]: expected a dict of name -> callable"):
        parse_stats({"weight": value, "activation": {"rms": rms}})


def test_a_kinds_custom_names_are_checked_as_any() -> None:
    with pytest.raises(ValueError, match="clash with the stats table's column 'mean'"):
        parse_stats({"weight": {"mean": rms}})
    with pytest.raises(ValueError, match="differ only in case"):
        parse_stats({"weight": {"rms": rms}, "grad": {"RMS": rms}})
    with pytest.raises(TypeError, match="must be callable"):
        parse_stats({"weight": {"rms": 3}})
