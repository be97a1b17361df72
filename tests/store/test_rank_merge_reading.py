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
