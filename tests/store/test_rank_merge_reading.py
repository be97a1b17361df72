"""``load(path, ranks="merge")``: the ranks' stored rows merged as if one process saw all data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import layerscope


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU())


def inputs(rank):
    generator = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(6 + 3 * rank, 5, generator=generator) for _ in range(2)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A run written by two ranks of one job (set by the launcher's environment) in turn."""
    path = tmp_path_factory.mktemp("ranks") / "run"
    stats = {"square": lambda tensor: tensor.double().square().mean()}
    with pytest.MonkeyPatch.context() as patch:
        for rank in (0, 1):
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            net = model()
            with layerscope.watch(
                net,
                run=path,
                every=1,
                kinds=("activation", "weight"),
                stats=[*layerscope.stats.BUILTIN_STATS, stats],
                alerts=False,
            ) as scope:
                for x in inputs(rank):
                    net(x)
                    scope.step()
    return path


def reference(values):
    values = values.double().reshape(-1).numpy()
    return {
        "numel": values.size,
        "mean": values.mean(),
        "std": values.std(ddof=1),
        "min": values.min(),
        "max": values.max(),
        "absmax": np.abs(values).max(),
        "l2": np.sqrt((values**2).sum()),
        "zero_frac": (values == 0).mean(),
        "pos_frac": (values > 0).mean(),
        "square": (values**2).mean(),
    }


def test_activations_are_those_of_both_ranks_data(two_ranks):
    merged = layerscope.load(two_ranks, ranks="merge").stats
    assert set(merged["rank"]) == {0}
    net = model()
    for step in range(2):
        batch = torch.cat([inputs(0)[step], inputs(1)[step]])
        with torch.no_grad():
            outputs = {"0": net[0](batch), "1": net(batch)}
        for module, values in outputs.items():
            (row,) = merged[
                (merged["step"] == step)
                & (merged["module"] == module)
                & (merged["kind"] == "activation")
            ].to_dict("records")
            for stat, value in reference(values).items():
                assert row[stat] == pytest.approx(value, rel=1e-6, abs=1e-9), (module, stat)


def test_histograms_and_counts_add_up_and_replicated_weights_are_not_doubled(two_ranks):
    each = layerscope.load(two_ranks).stats
    merged = layerscope.load(two_ranks, ranks="merge").stats
    assert set(each["rank"]) == {0, 1}
    activation = (merged["kind"] == "activation") & (merged["module"] == "1")
    for step in range(2):
        parts = each[
            (each["kind"] == "activation") & (each["module"] == "1") & (each["step"] == step)
        ]
        (row,) = merged[activation & (merged["step"] == step)].to_dict("records")
        np.testing.assert_array_equal(row["hist"], np.sum(np.stack(parts["hist"]), axis=0))
        assert row["numel"] == parts["numel"].sum()
    weights = merged[merged["kind"] == "weight"].drop(columns=["hist"]).reset_index(drop=True)
    rank0 = each[(each["kind"] == "weight") & (each["rank"] == 0)].drop(columns=["hist"])
    assert len(weights) == len(rank0) == 4  # weight and bias, 2 steps
    for column in ("numel", "mean", "std", "min", "max", "l2"):
        np.testing.assert_array_equal(weights[column], rank0[column].to_numpy())


def test_a_run_of_one_rank_reads_the_same_either_way(tmp_path):
    net = model()
    with layerscope.watch(net, run=tmp_path / "run", every=1, alerts=False) as scope:
        net(inputs(0)[0]).sum().backward()
        scope.step()
    each = layerscope.load(tmp_path / "run").stats
    merged = layerscope.load(tmp_path / "run", ranks="merge").stats
    assert each.drop(columns=["hist"]).equals(merged.drop(columns=["hist"]))


def test_ranks_must_be_each_or_merge(tmp_path):
    with pytest.raises(ValueError, match="ranks: expected one of"):
        layerscope.load(tmp_path, ranks="all")


def test_the_formats_counts_add_up_and_their_scales_fit_the_merged_absmax(two_ranks):
    merged = layerscope.load(two_ranks, ranks="merge").stats
    net = model()
    flushed = 0
    for step in range(2):
        batch = torch.cat([inputs(0)[step], inputs(1)[step]])
        with torch.no_grad():
            values = net[0](batch).double().reshape(-1).numpy()
        (row,) = merged[
            (merged["step"] == step) & (merged["module"] == "0") & (merged["kind"] == "activation")
        ].to_dict("records")
        magnitude = np.abs(values)
        assert row["e4m3_under"] == np.count_nonzero((magnitude > 0) & (magnitude < 2.0**-9))
        assert row["e4m3_over"] == 0
        flushed += row["e4m3_under"]
        largest = 1.75 * 2.0**8
        k = row["e4m3_scale_exp"]
        assert magnitude.max() * 2.0**k <= largest < magnitude.max() * 2.0 ** (k + 1)
    assert flushed > 0  # one of the ranks' values is below 2**-9


def test_merged_rows_come_in_the_order_the_lowest_rank_wrote_its_own(two_ranks):
    each = layerscope.load(two_ranks).stats
    merged = layerscope.load(two_ranks, ranks="merge").stats
    keys = ["step", "phase", "module", "kind", "tensor", "call"]
    rank0 = each[each["rank"] == 0][keys].reset_index(drop=True)
    assert merged[keys].equals(rank0)


def test_the_view_merged_stats_holds_the_rows_of_both_ranks_data(two_ranks):
    run = layerscope.load(two_ranks)  # ranks="each": the view is there whatever was asked
    rows = run.sql(
        "select step, l2, std, numel, square from merged_stats "
        "where module = ? and kind = 'activation' order by step",
        ["1"],
    )
    assert list(rows["step"]) == [0, 1]
    net = model()
    for step in range(2):
        batch = torch.cat([inputs(0)[step], inputs(1)[step]])
        with torch.no_grad():
            expected = reference(net(batch))
        row = rows.iloc[step]
        for stat in ("l2", "std", "numel", "square"):
            assert row[stat] == pytest.approx(expected[stat], rel=1e-6), stat
    # Replicated weights are the lowest rank's, not summed over ranks.
    weights = run.sql("select numel from merged_stats where kind = 'weight' and tensor = 'weight'")
    assert list(weights["numel"]) == [35, 35]


class Shifted(nn.Module):
    """Its output is its input: the values a test chooses, recorded as an activation."""

    def forward(self, x):
        return x * 1.0


def _write_ranks(path, batches, stats=None, kinds=("activation",)):
    """A run written by ``len(batches)`` ranks in turn, rank r seeing ``batches[r]``."""
    with pytest.MonkeyPatch.context() as patch:
        for rank, batch in enumerate(batches):
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", str(len(batches)))
            net = nn.Sequential(Shifted())
            options = {} if stats is None else {"stats": stats}
            with layerscope.watch(
                net, run=path, every=1, kinds=kinds, alerts=False, **options
            ) as s:
                net(batch)
                s.step()


def test_a_small_spread_about_a_large_mean_keeps_its_digits(tmp_path):
    # Summed squares about zero would lose the spread to the mean's square: 1e12 times larger.
    generator = torch.Generator().manual_seed(3)
    batches = [1e6 + torch.randn(64, generator=generator) * 1e-1 + rank for rank in range(3)]
    _write_ranks(tmp_path / "run", batches)
    (row,) = layerscope.load(tmp_path / "run", ranks="merge").stats.to_dict("records")
    values = torch.cat(batches).double().numpy()
    assert row["mean"] == pytest.approx(values.mean(), rel=1e-15)
    assert row["std"] == pytest.approx(values.std(ddof=1), rel=1e-9)


def test_non_finite_elements_are_counted_and_left_out_of_mean_and_std(tmp_path):
    generator = torch.Generator().manual_seed(4)
    batches = [torch.randn(20, generator=generator) for _ in range(3)]
    batches[1][3] = float("nan")
    batches[1][5] = float("inf")
    batches[2][:] = float("nan")  # a rank with no finite element at all
    _write_ranks(tmp_path / "run", batches)
    (row,) = layerscope.load(tmp_path / "run", ranks="merge").stats.to_dict("records")
    values = torch.cat(batches).double().numpy()
    finite = values[np.isfinite(values)]
    assert row["nan_count"] == 21
    assert row["inf_count"] == 1
    assert row["numel"] == 60
    assert row["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert row["std"] == pytest.approx(finite.std(ddof=1), rel=1e-12)
    assert row["min"] == pytest.approx(finite.min())
    assert row["max"] == pytest.approx(finite.max())


def test_a_custom_statistic_of_several_values_merges_value_by_value(tmp_path):
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randn(8 + 4 * rank, generator=generator) for rank in range(2)]
    stats = [
        "mean",
        {"moments": lambda t: torch.stack([t.double().mean(), t.double().pow(2).mean()])},
    ]
    _write_ranks(tmp_path / "run", batches, stats=stats)
    (row,) = layerscope.load(tmp_path / "run", ranks="merge").stats.to_dict("records")
    values = torch.cat(batches).double().numpy()
    np.testing.assert_allclose(row["moments"], [values.mean(), (values**2).mean()], rtol=1e-12)


def test_a_custom_statistic_named_as_the_merge_names_its_own_columns_merges_as_any(tmp_path):
    generator = torch.Generator().manual_seed(6)
    batches = [torch.randn(6 + 2 * rank, generator=generator) for rank in range(2)]
    stats = ["mean", "std", {"_finite": lambda t: t.double().abs().mean()}]
    _write_ranks(tmp_path / "run", batches, stats=stats)
    (row,) = layerscope.load(tmp_path / "run", ranks="merge").stats.to_dict("records")
    values = torch.cat(batches).double().numpy()
    assert row["_finite"] == pytest.approx(np.abs(values).mean(), rel=1e-12)
    assert row["std"] == pytest.approx(values.std(ddof=1), rel=1e-12)
