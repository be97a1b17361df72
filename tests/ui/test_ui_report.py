"""``layerscope report``: one HTML file holding the page and the same answers the server gives."""

from __future__ import annotations

import json
import re

import pytest
from ui_runs import XSS_NAME

from layerscope.cli import main
from layerscope.ui._report import api_key


def embedded(html: str) -> dict:
    match = re.search(
        r'<script type="application/json" id="layerscope-data">(.*?)</script>', html, re.S
    )
    assert match, "no embedded data"
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def report(runs_root, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "exp1.html"
    status = main(["report", str(runs_root / "exp1"), "-o", str(path), "--compare",
                   str(runs_root / "exp2")])  # fmt: skip
    assert status == 0
    return path.read_text(encoding="utf-8")


def test_the_report_holds_the_answers_the_server_gives(report, server):
    data = embedded(report)
    assert (data["run"], data["compare"]) == ("exp1", "exp2")
    responses = data["responses"]
    summary = server.json("/api/runs/exp1")
    kinds = summary["kinds"]
    assert len(summary["stats"]) == 15  # 11 stored, and the 4 formats' fractions lost
    expected_heatmaps = sum(len(tensors) for tensors in kinds.values()) * 15
    assert sum("/heatmap?" in key for key in responses if key.startswith("api/runs/exp1/")) == (
        expected_heatmaps
    )
    compared = 0
    for key, answer in responses.items():
        if key == "api/runs" or key.endswith(("/exp1", "/exp2")):
            continue  # the listing and the summaries carry times: checked below
        assert answer == server.json("/" + key), key
        compared += 1
    assert compared > 100
    summary = server.json("/api/runs/exp1")
    assert responses["api/runs/exp1"]["kinds"] == summary["kinds"]
    assert responses["api/runs/exp1"]["steps"] == summary["steps"] == 6


def test_the_report_loads_nothing_from_elsewhere(report):
    assert "Content-Security-Policy" in report
    assert "default-src 'none'" in report
    without_scripts = re.sub(r"<script\b.*?</script>", "", report, flags=re.S)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", without_scripts)
    assert len(re.findall(r"<script\b", report)) == 6  # plotly, the data, the page's 4 scripts


def test_names_in_the_report_cannot_become_markup(runs_root, tmp_path):
    path = tmp_path / "xss.html"
    assert main(["report", str(runs_root / "xss"), "-o", str(path)]) == 0
    html = path.read_text(encoding="utf-8")
    assert XSS_NAME not in html  # escaped as \u003c...\u003e inside the JSON
    layers = embedded(html)["responses"][
        api_key(
            "runs/xss/heatmap",
            {"kind": "activation", "tensor": "out", "phase": "train", "rank": 0, "stat": "absmax"},
        )
    ]["layers"]
    assert layers == ["first", XSS_NAME, "last"]


def test_report_of_no_run_is_one_line(tmp_path, capsys):
    status = main(["report", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.html")])
    assert status == 2
    assert "no run at" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
