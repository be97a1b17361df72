"""In a notebook, a run, a scope and a capture show as a compact table of what they hold."""

import re
from html.parser import HTMLParser

import pytest
import torch
from torch import nn

import layerscope

pytest.importorskip("duckdb")


class _Cells(HTMLParser):
    """A two-column table's caption and rows, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.caption, self.rows, self._in, self._cell = "", [], None, ""

    def handle_starttag(self, tag, attrs):
        if tag in ("caption", "th", "td"):
            self._in, self._cell = tag, ""

    def handle_data(self, data):
        if self._in:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "caption":
            self.caption = self._cell
        elif tag == "th":
            self.rows.append([self._cell])
        elif tag == "td":
            self.rows[-1].append(self._cell)
        self._in = None if tag in ("caption", "th", "td") else self._in


def cells(html: str) -> tuple[str, dict[str, str]]:
    parser = _Cells()
    parser.feed(html)
    return parser.caption, dict(parser.rows)


def _train(scope, model, steps):
    for _ in range(steps):
        inputs = torch.randn(8, 4)
        inputs[0, 0] = float("nan")  # a non-finite input: one error alert
        model(inputs).nan_to_num().sum().backward()
        scope.step(loss=1.0)


def test_a_run_a_scope_and_a_capture_show_what_they_hold(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with layerscope.watch(model, every=1, run=tmp_path / "runs" / "a<b>") as scope:
        _train(scope, model, 3)
        caption, fields = cells(scope._repr_html_())
        assert caption == "layerscope scope of Sequential"
        assert fields["run"] == str(tmp_path / "runs" / "a<b>")
        assert fields["state"] == "open, step 3"
        assert fields["layers watched"] == "3"
        assert fields["alerts so far"] == "1 (1 error)"
    assert cells(scope._repr_html_())[1]["state"] == "closed"
    run = layerscope.load(tmp_path / "runs" / "a<b>")
    html = run._repr_html_()
    assert "a&lt;b&gt;" in html  # names from files are escaped
    assert "a<b>" not in html
    caption, fields = cells(html)
    assert caption == "layerscope run a<b>"
    assert fields == {
        "status": "finished",
        "path": str(tmp_path / "runs" / "a<b>"),
        "steps": "3 (recorded up to step 2)",
        "layers watched": "3",
        "alerts": "1 (1 error)",
    }
    with layerscope.capture(model, every=1) as cap:
        model(torch.randn(2, 4))
    _, fields = cells(cap._repr_html_())
    assert fields["state"] == "closed"
    assert int(fields["records"]) == len(cap.records) > 0


def test_a_run_whose_alerts_cannot_be_read_still_shows(tmp_path, monkeypatch):
    model = nn.Linear(4, 2)
    with layerscope.watch(model, every=1, run=tmp_path / "r") as scope:
        _train(scope, model, 1)
    run = layerscope.load(tmp_path / "r")
    monkeypatch.setattr(type(run), "alerts", property(lambda self: 1 / 0))
    _, fields = cells(run._repr_html_())
    assert re.fullmatch(r"unreadable: ZeroDivisionError: .*", fields["alerts"])
    assert fields["status"] == "finished"
