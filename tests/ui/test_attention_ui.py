"""The dashboard's attention panel: heads by steps of entropy fraction, served and in the report.

Answers are checked against the attention table read with pandas (``run.attention``); the
page in headless Chromium where Playwright and /usr/bin/chromium are there.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from browsing import CHROMIUM, WAIT_MS, plotted
from torch import nn
from ui_runs import Server, record

import layerscope
from layerscope.ui._encode import unpack
from layerscope.ui._report import report_html

HEADS, WIDTH, LENGTH, STEPS = 3, 12, 6, 6


class Attention(nn.Module):
    """Causal SDPA self-attention; ``twice`` attends a second time on its own output."""

    def __init__(self, twice: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.twice = twice

    def attend(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + out.transpose(1, 2).reshape(b, t, WIDTH)

    def forward(self, x):
        x = self.attend(x)
        return self.attend(x) if self.twice else x


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """``heads`` (6 steps; head 1 of module "0" collapses from step 3) and ``plain`` (none)."""
    folder = tmp_path_factory.mktemp("attention") / "runs"
    torch.manual_seed(0)
    model = nn.Sequential(Attention(), nn.Tanh(), Attention(twice=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    watched = layerscope.watch(
        model, optimizer, run=folder / "heads", every=1, attention=True, alerts=False
    )
    with watched as scope:
        for step in range(STEPS):
            if step == 3:  # the queries of head 1 of module "0", 50 times larger
                with torch.no_grad():
                    model[0].qkv.weight[4:8].mul_(50.0)
            model(torch.randn(4, LENGTH, WIDTH, generator=generator)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=1.0)
    record(folder / "plain", 2)
    return folder


@pytest.fixture(scope="module")
def served(root):
    with Server(root) as running:
        yield running


def table(root, module):
    """(call, head) rows by steps of the entropy fraction, from the table alone."""
    frame = layerscope.load(root / "heads").attention
    rows = frame[(frame["module"] == module) & (frame["phase"] == "train")]
    return rows.pivot_table(index=["call", "head"], columns="step", values="entropy_frac")


def test_each_modules_heads_by_steps_are_the_tables(served, root):
    answer = served.json("/api/runs/heads/attention?phase=train&rank=0")
    assert answer["phases"] == ["train"]
    assert answer["steps"] == answer["last_steps"] == list(range(STEPS))
    assert not answer["downsampled"]
    assert [(m["module"], m["type"]) for m in answer["modules"]] == [
        ("0", "Attention"),
        ("2", "Attention"),
    ]
    for shown in answer["modules"]:
        expected = table(root, shown["module"])
        assert list(zip(shown["calls"], shown["heads"], strict=True)) == list(expected.index)
        np.testing.assert_allclose(unpack(shown["values"]), expected.to_numpy(), rtol=1e-6)
    collapsed = unpack(answer["modules"][0]["values"])[1]
    assert collapsed[3:].max() < 0.2 < collapsed[:3].min()


def test_columns_of_several_steps_show_their_lowest_fraction(served, root):
    answer = served.json("/api/runs/heads/attention?phase=train&rank=0&columns=2")
    assert (answer["width"], answer["aggregate"], answer["downsampled"]) == (3, "min", True)
    assert (answer["steps"], answer["last_steps"]) == ([0, 3], [2, 5])
    expected = table(root, "2")
    lowest = expected.T.groupby(expected.columns // 3).min().T
    np.testing.assert_allclose(unpack(answer["modules"][1]["values"]), lowest, rtol=1e-6)


def test_a_run_without_attention_answers_none(served):
    answer = served.json("/api/runs/plain/attention?phase=train&rank=0")
    assert (answer["phases"], answer["modules"], answer["steps"]) == ([], [], [])


def test_an_unknown_phase_is_400_naming_it(served):
    status, _, body = served.get("/api/runs/heads/attention?phase=test")
    assert status == 400
    assert json.loads(body)["error"].startswith("phase")


def test_the_report_holds_the_answer_the_server_gives(served, root):
    html = report_html(layerscope.load(root / "heads"))
    data = re.search(r'id="layerscope-data">(.*?)</script>', html, re.S)
    responses = json.loads(data.group(1))["responses"]
    key = "api/runs/heads/attention?phase=train&rank=0"
    assert responses[key] == served.json("/" + key)
    assert len(responses[key]["modules"]) == 2


def test_the_page_draws_the_panel_only_for_a_run_with_attention(page, served, root):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    page.goto(served.url + "/#/run/heads")
    plotted(page, "attention")
    assert page.locator("#attention-panel").is_visible()
    drawn = page.evaluate("document.getElementById('attention').data.map((t) => t.z)")
    assert len(drawn) == 2
    np.testing.assert_allclose(np.array(drawn[1], dtype=float), table(root, "2"), rtol=1e-6)
    assert "6 recorded steps" in page.locator("#attention-note").inner_text()
    page.goto(served.url + "/#/run/plain")
    # The modules are filled in once the charts, the attention panel's among them, are done.
    page.wait_for_selector("#modules .module-name", timeout=WAIT_MS)
    assert page.locator("#attention-panel").is_hidden()
    plotted(page, "heatmap")


@pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")
def test_a_damaged_attention_file_is_named_and_left_out(root, tmp_path):
    testclient = pytest.importorskip("starlette.testclient")
    from layerscope.ui._app import create_app

    shutil.copytree(root / "heads", tmp_path / "damaged")
    (segment,) = (tmp_path / "damaged" / "attention").glob("*.parquet")
    segment.write_bytes(b"not a parquet file")
    client = testclient.TestClient(create_app(tmp_path), base_url="http://127.0.0.1")
    response = client.get("/api/runs/damaged/attention?phase=train")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["modules"] == []
    assert f"damaged/attention/{segment.name}" in {entry["file"] for entry in answer["skipped"]}
