"""``layerscope summary``: the golden text, model order, values read back, live and dead runs."""

import math
from collections import OrderedDict

import pytest
import torch
from cli_runs import (
    OLD_ALERT_COLUMNS,
    add_alerts,
    check_golden,
    field,
    mark_crashed,
    normalised,
    rows_of,
    tiny_model,
    train,
)
from torch import nn

import layerscope

pytest.importorskip("duckdb")  # the commands query runs with DuckDB


def test_summary_plain_is_the_golden_text(run_dir, cli, tmp_path):
    status, out, err = cli("summary", run_dir, "--plain")
    assert (status, err) == (0, "")
    check_golden("summary.txt", normalised(out, tmp_path))


def test_layers_come_in_model_order_not_name_order(tmp_path, cli):
    torch.manual_seed(0)
    layers = [("z_in", nn.Linear(4, 8)), ("act", nn.ReLU()), ("a_out", nn.Linear(8, 2))]
    path = train(nn.Sequential(OrderedDict(layers)), tmp_path / "named")
    _, out, _ = cli("summary", path, "--plain")
    rows = rows_of(out, "layers")
    assert [row[0] for row in rows] == ["z_in", "act", "a_out"]
    assert [row[1] for row in rows] == ["Linear", "ReLU", "Linear"]


def test_a_layers_weights_are_pooled_over_weight_and_bias_as_the_trained_model_has_them(
    tmp_path, cli
):
    model = tiny_model()
    path = train(model, tmp_path / "r", steps=3)
    _, out, _ = cli("summary", path, "--plain", "--kind", "weight")
    rows = {row[0]: row for row in rows_of(out, "layers")}
    # module, type, mean, std, absmax, l2, zero: the weights after the last step, from torch
    whole = torch.cat([model[0].weight.detach().flatten(), model[0].bias.detach()]).double()
    latest = [float(whole.mean()), float(whole.std()), float(whole.abs().max())]
    latest.append(float(whole.norm()))
    shown = [float(cell.split()[0]) for cell in rows["0"][2:6]]
    for value, expected in zip(shown, latest, strict=True):
        assert math.isclose(value, expected, rel_tol=1e-3), (shown, latest)
    assert "1" not in rows  # a ReLU has no weights


def test_trend_is_the_latest_value_over_the_first_of_the_run(run_dir, cli):
    _, out, _ = cli("summary", run_dir, "--plain")
    stats = layerscope.load(run_dir).stats
    activation = stats[(stats.module == "2") & (stats.kind == "activation")].sort_values("step")
    first, latest = activation["std"].iloc[0], activation["std"].iloc[-1]
    row = next(row for row in rows_of(out, "layers") if row[0] == "2")
    assert row[2] == f"{latest:.4g} x{latest / first:.3g}"
    assert field(out, "loss").startswith(f"{layerscope.load(run_dir).scalars.value.iloc[-1]:.4g}")


def test_a_run_still_being_written_is_summarised_as_running(tmp_path, cli):
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = layerscope.watch(model, optimizer=optimizer, run=tmp_path / "live", every=1)
    try:
        for _ in range(2):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        scope.flush()
        status, out, err = cli("summary", tmp_path / "live", "--plain")
    finally:
        scope.close()
    assert (status, err) == (0, "")
    assert field(out, "status") == "running"
    assert field(out, "ended") == "-"
    assert "ago)" in field(out, "updated")
    assert [row[0] for row in rows_of(out, "layers")] == ["0", "1", "2"]


def test_a_crashed_run_is_summarised_as_crashed_with_its_rows(run_dir, cli):
    mark_crashed(run_dir)
    status, out, _ = cli("summary", run_dir, "--plain")
    assert status == 0
    assert field(out, "status") == "crashed"
    assert [row[0] for row in rows_of(out, "layers")] == ["0", "1", "2"]


def test_no_alerts_says_so(run_dir, cli):
    _, out, _ = cli("summary", run_dir, "--plain")
    assert "\nno alerts\n" in out


def test_alerts_of_the_current_schema_show_tensor_and_severity(run_dir, cli):
    base = {"phase": "train", "kind": "grad", "tensor": "out", "value": 1.0, "threshold": 0.5}
    add_alerts(
        run_dir,
        [
            {**base, "step": 2, "rule": "spike", "module": "2", "severity": "warning",
             "message": "grad l2 jumped", "rank": 0},
            {**base, "step": 1, "rule": "nan", "module": "0", "severity": "error",
             "message": "NaN in grad", "rank": 0},
        ],
    )  # fmt: skip
    _, out, _ = cli("summary", run_dir, "--plain")
    assert "\n2 alerts (1 error, 1 warning)\n" in out
    assert rows_of(out, "alerts") == [
        ["1", "error", "nan", "0", "grad", "out", "NaN in grad"],
        ["2", "warning", "spike", "2", "grad", "out", "grad l2 jumped"],
    ]


def test_the_summary_leads_with_the_first_steps_likeliest_cause(run_dir, cli):
    base = {"phase": "train", "tensor": "out", "value": 1.0, "threshold": 0.5, "rank": 0}
    alerts = [
        {"step": 1, "rule": "dead", "module": "0", "kind": "activation", "severity": "info"},
        {"step": 3, "rule": "activation_drift", "module": "2", "kind": "activation",
         "severity": "warning"},
        {"step": 3, "rule": "eval_mode", "module": "1", "kind": "activation",
         "severity": "warning"},
        {"step": 5, "rule": "loss_spike", "module": "", "kind": "loss", "severity": "warning"},
        {"step": 7, "rule": "activation_drift", "module": "0", "kind": "activation",
         "severity": "error"},
    ]  # fmt: skip
    add_alerts(run_dir, [{**base, **alert, "message": f"m{i}"} for i, alert in enumerate(alerts)])
    _, out, _ = cli("summary", run_dir, "--plain")
    block = out.split("likely root cause")[1].split("\n\n")[0]
    # The info note of step 1 is no diagnosis; of step 3's two, the eval mode is the cause.
    assert [field(block, name) for name in ("step", "rule", "layer", "says", "then")] == [
        "3", "eval_mode", "1", "m2", "3 more: activation_drift 2, loss_spike 1"
    ]  # fmt: skip
    assert out.index("likely root cause") < out.index("5 alerts")


def test_a_run_without_warnings_has_no_root_cause(run_dir, cli):
    base = {"phase": "train", "kind": "grad", "tensor": "out", "value": 1.0, "threshold": 0.5}
    add_alerts(run_dir, [{**base, "step": 1, "rule": "dead", "module": "0", "severity": "info",
                          "message": "a note", "rank": 0}])  # fmt: skip
    _, out, _ = cli("summary", run_dir, "--plain")
    assert "likely root cause" not in out
    assert "1 alert (1 info)" in out


def test_alerts_of_the_older_schema_and_the_first_n_of_them(run_dir, cli):
    alerts = [
        {"step": step, "rule": "dead", "module": "1", "kind": "activation", "severity": "info",
         "message": f"dead at {step}", "rank": 0}
        for step in range(3)
    ]  # fmt: skip
    add_alerts(run_dir, alerts, columns=OLD_ALERT_COLUMNS)
    _, out, _ = cli("summary", run_dir, "--plain", "--alerts", "2")
    assert "\n3 alerts (3 info)\n" in out
    assert rows_of(out, "alerts") == [
        ["0", "info", "dead", "1", "activation", "dead at 0"],
        ["1", "info", "dead", "1", "activation", "dead at 1"],
    ]
    assert "the first 2 shown" in out


def test_a_nan_in_training_shows_in_the_layers_and_in_the_alerts_the_run_wrote(tmp_path, cli):
    model = tiny_model()
    batches = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(1))
    batches[2, 0, 0] = math.nan
    with layerscope.watch(model, every=1, run=tmp_path / "nan") as scope:
        for batch in batches:
            model(batch).sum().backward()
            scope.step()
    _, out, _ = cli("summary", tmp_path / "nan", "--plain")
    rows = {row[0]: row for row in rows_of(out, "layers")}
    # Linear(4, 8) on 8 rows, one of them NaN: 8 NaN in its output, and in its gradient
    # and its weight's gradient too.
    assert int(rows["0"][-1]) >= 8
    alerts = layerscope.load(tmp_path / "nan").alerts
    assert len(alerts) >= 1  # the health rules saw it too
    assert len(rows_of(out, "alerts")) == len(alerts)


def test_a_phase_with_no_rows_says_so(run_dir, cli):
    status, out, _ = cli("summary", run_dir, "--plain", "--phase", "eval")
    assert status == 0
    assert "no statistics recorded for phase eval, rank 0" in out


def test_kinds_asked_for_that_the_run_did_not_capture_are_named(run_dir, cli):
    status, out, _ = cli("summary", run_dir, "--plain", "--kind", "update", "--kind", "grad")
    assert status == 0
    assert "no update rows for phase train, rank 0: see the run's kinds" in out
    headers = out.split("layers (")[1].splitlines()[1].split("  ")
    assert "grad l2" in [header.strip() for header in headers]
