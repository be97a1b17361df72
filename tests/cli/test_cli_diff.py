"""``layerscope diff``: the golden text, the most different layer first, what cannot match."""

import pytest
import torch
from cli_runs import check_golden, field, forward_only, normalised, rows_of, tiny_model, train
from torch import nn

import layerscope
from layerscope.cli._compare import relative_difference

pytest.importorskip("duckdb")  # the commands query runs with DuckDB

STEPS = 3


def test_diff_plain_is_the_golden_text(tmp_path, cli):
    run_a = train(tiny_model(), tmp_path / "a")
    run_b = train(tiny_model(scale_last=1.5), tmp_path / "b")
    status, out, err = cli("diff", run_a, run_b, "--plain", "--top", "0")
    assert (status, err) == (0, "")
    check_golden("diff.txt", normalised(out, tmp_path))


def test_the_layer_whose_weights_differ_comes_first_and_the_others_do_not_differ(tmp_path, cli):
    kinds = ("activation", "weight")
    run_a = forward_only(tiny_model(), tmp_path / "a", kinds=kinds)
    run_b = forward_only(tiny_model(scale_last=2.0), tmp_path / "b", kinds=kinds)
    status, out, _ = cli("diff", run_a, run_b, "--plain", "--top", "0")
    assert status == 0
    assert field(out, "compared").startswith("step 1,")
    rows = rows_of(out, "layers")
    # Module 2's 5 rows (3 of its activation, its weight's and bias' norms), then the others
    # in model order: module 0's 5, the ReLU's 3, all equal.
    assert [row[0] for row in rows] == ["2"] * 5 + ["0"] * 5 + ["1"] * 3
    differences = {tuple(row[1:4]): row[6] for row in rows[:5]}
    assert differences[("weight", "weight", "l2")] == "+100%"  # the weight doubled
    assert differences[("weight", "bias", "l2")] == "0%"
    assert all(row[6] == "0%" for row in rows[5:])


def test_modules_only_one_run_has_are_warned_about_and_the_rest_compared(tmp_path, cli):
    run_a = forward_only(tiny_model(), tmp_path / "a")
    torch.manual_seed(0)
    longer = tiny_model()
    longer.append(nn.Tanh())
    run_b = forward_only(longer, tmp_path / "b")
    status, out, _ = cli("diff", run_a, run_b, "--plain", "--top", "0")
    assert status == 0
    assert "warning: module 3 only in B" in out
    assert {row[0] for row in rows_of(out, "layers")} == {"0", "1", "2"}


def test_runs_with_no_step_in_common_are_compared_at_each_ones_latest(tmp_path, cli):
    run_a = forward_only(tiny_model(), tmp_path / "a", steps=2)
    run_b = forward_only(tiny_model(), tmp_path / "b", steps=4)
    _, out, _ = cli("diff", run_a, run_b, "--plain", "--step", "1")
    assert field(out, "compared").startswith("step 1,")
    _, out, _ = cli("diff", run_a, run_b, "--plain")
    assert field(out, "compared").startswith("step 1,")  # the latest both have
    status, _, err = cli("diff", run_a, run_b, "--plain", "--step", "3")
    assert status == 2
    assert err.count("\n") == 1
    assert "did not record step 3" in err


def test_relative_difference_puts_nan_inf_and_zero_against_nonzero_first():
    assert relative_difference(1.0, 1.5) == 0.5
    assert relative_difference(float("nan"), 1.0) == float("inf")
    assert relative_difference(1.0, float("inf")) == float("inf")
    assert relative_difference(0.0, 1e-9) == float("inf")
    assert relative_difference(float("inf"), float("inf")) == 0.0


def test_runs_of_other_architectures_compare_only_the_layers_they_share(cli, tmp_path):
    """A module of one name but another type is not the same layer: not compared."""
    torch.manual_seed(0)
    narrow = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    torch.manual_seed(0)
    normed = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    a = train(narrow, tmp_path / "a")
    b = train(normed, tmp_path / "b")
    status, out, _ = cli("diff", a, b, "--plain", "--top", "0")
    assert status == 0
    assert (
        "warning: not compared, of another type in each run: 1: ReLU in A, LayerNorm in B; "
        "2: Linear in A, ReLU in B" in out
    )
    assert "warning: module 3 only in B" in out
    table = out[out.index("layers, most different first") :]
    compared = {line.split()[0] for line in table.splitlines()[3:] if line.strip()}
    assert compared == {"0"}


def _float64_stats(output):
    output = output.detach().double()
    return {"absmax": output.abs().max().item(), "std": output.std().item()}


def _two_ranks(path, scale_of_rank_1, monkeypatch):
    """A job of two ranks, as torchrun's environment says, rank 1's inputs x ``scale_of_rank_1``.

    Returns:
        The run's path, and by rank the float64 abs-max and std of each Linear's output at
        the last step.
    """
    stats = {}
    for rank, scale in ((0, 1.0), (1, scale_of_rank_1)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        model = tiny_model()
        last = {}
        for name in ("0", "2"):
            model.get_submodule(name).register_forward_hook(
                lambda m, i, out, name=name, last=last: last.__setitem__(name, _float64_stats(out))
            )
        sgd = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = torch.randn(STEPS, 8, 4, generator=torch.Generator().manual_seed(1 + rank))
        with layerscope.watch(model, sgd, run=str(path), every=1, alerts=False) as scope:
            for batch in batches * scale:
                model(batch).pow(2).mean().backward()
                sgd.step()
                sgd.zero_grad()
                scope.step()
        stats[rank] = last
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return path, stats


def test_rank_compares_that_rank_of_both_runs_against_float64(tmp_path, cli, monkeypatch):
    # The same rank 0 in both runs; rank 1 of B fed inputs ten times larger than A's.
    run_a, stats_a = _two_ranks(tmp_path / "a", 1.0, monkeypatch)
    run_b, stats_b = _two_ranks(tmp_path / "b", 10.0, monkeypatch)
    lowest = cli("diff", run_a, run_b, "--plain", "--top", "0")
    assert lowest == cli("diff", run_a, run_b, "--plain", "--top", "0", "--rank", 0)
    status, out, err = lowest
    assert (status, err) == (0, "")
    assert field(out, "compared") == (
        "step 2, phase train, rank 0 of A (2 ranks), rank 0 of B (2 ranks): "
        "--rank N compares another"
    )
    assert {row[6] for row in rows_of(out, "layers")} == {"0%"}

    status, out, err = cli("diff", run_a, run_b, "--plain", "--top", "0", "--rank", 1)
    assert (status, err) == (0, "")
    assert field(out, "compared").startswith(
        "step 2, phase train, rank 1 of A (2 ranks), rank 1 of B (2 ranks)"
    )
    rows = {tuple(row[:4]): row[4:] for row in rows_of(out, "layers")}
    for module in ("0", "2"):
        for stat in ("absmax", "std"):
            a, b, relative = rows[(module, "activation", "out", stat)]
            expected_a, expected_b = stats_a[1][module][stat], stats_b[1][module][stat]
            assert float(a) == pytest.approx(expected_a, rel=1e-3)
            assert float(b) == pytest.approx(expected_b, rel=1e-3)
            assert float(relative.rstrip("%")) / 100 == pytest.approx(
                (expected_b - expected_a) / expected_a, rel=1e-2
            )
            assert expected_b > 2 * expected_a  # a difference rank 0 does not show


def test_a_rank_either_run_lacks_is_refused_naming_the_run_and_its_ranks(
    tmp_path, cli, monkeypatch
):
    job, _ = _two_ranks(tmp_path / "job", 1.0, monkeypatch)
    single = train(tiny_model(), tmp_path / "single")
    status, out, err = cli("diff", job, job, "--rank", 2)
    assert (status, out) == (2, "")
    assert err == f"layerscope diff: --rank 2: {job} has no such rank; its ranks: 0, 1\n"
    status, out, err = cli("diff", job, single, "--rank", 1)
    assert (status, out) == (2, "")
    assert err == f"layerscope diff: --rank 1: {single} has no such rank; its ranks: 0\n"
    status, out, _ = cli("diff", single, single, "--plain")
    assert field(out, "compared") == "step 2, phase train, rank 0 of A, rank 0 of B"
