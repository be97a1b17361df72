"""``layerscope diff``: the golden text, the most different layer first, what cannot match."""

import pytest
import torch
from cli_runs import check_golden, field, forward_only, normalised, rows_of, tiny_model, train
from torch import nn

from layerscope.cli._compare import relative_difference

pytest.importorskip("duckdb")  # the commands query runs with DuckDB


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
