"""``layerscope summary``'s attention heads: the sharpest heads at the latest step, read back.

The cells are checked against the attention table read with pandas (``run.attention``).
"""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from cli_runs import rows_of, tiny_model, train
from torch import nn

import layerscope

pytest.importorskip("duckdb")

HEADS, WIDTH, LENGTH = 4, 16, 8
TITLE = "attention heads with the lowest entropy fraction"


class Attention(nn.Module):
    """Causal SDPA self-attention, called ``calls`` times a pass."""

    def __init__(self, calls: int = 1) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.calls = calls

    def forward(self, x):
        b, t, _ = x.shape
        for _ in range(self.calls):
            q, k, v = self.qkv(x).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + out.transpose(1, 2).reshape(b, t, WIDTH)
        return x


def record(path, calls=1, steps=4, collapse_at=2):
    """Two attention modules, every step recorded; head 2 of module "1" collapses midway."""
    torch.manual_seed(0)
    model = nn.Sequential(Attention(), Attention(calls))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    with layerscope.watch(model, optimizer, run=path, every=1, attention=True) as scope:
        for step in range(steps):
            if step == collapse_at:  # its queries 50 times larger
                with torch.no_grad():
                    model[1].qkv.weight[8:12].mul_(50.0)
            model(torch.randn(3, LENGTH, WIDTH, generator=generator)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    return path


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    return record(tmp_path_factory.mktemp("attention") / "run")


def expected(path, top=5):
    """(module, call, head, then entropy, fraction, max prob at the last and the first step).

    The sharpest heads at the last step first.
    """
    frame = layerscope.load(path).attention
    frame = frame[frame["phase"] == "train"]
    first = frame[frame["step"] == frame["step"].min()].set_index(["module", "call", "head"])
    last = frame[frame["step"] == frame["step"].max()].set_index(["module", "call", "head"])
    last = last.sort_values("entropy_frac", kind="stable").iloc[:top]
    return [
        (*key, *(row[c] for c in ("entropy_mean", "entropy_frac", "max_prob")),
         *(first.loc[key, c] for c in ("entropy_mean", "entropy_frac", "max_prob")))
        for key, row in last.iterrows()
    ]  # fmt: skip


def cell(latest, first):
    return f"{latest:.3g} ({first:.3g})"


def test_the_heads_shown_are_the_sharpest_at_the_last_step(attention_run, cli):
    status, out, err = cli("summary", attention_run, "--plain")
    assert (status, err) == (0, "")
    assert f"{TITLE} (phase train, rank 0, step 3; at step 0 in brackets)" in out
    rows = rows_of(out, TITLE)
    want = expected(attention_run)
    assert len(rows) == 5
    assert rows == [
        [module, str(head), cell(e, e0), cell(f, f0), cell(p, p0)]
        for module, _, head, e, f, p, e0, f0, p0 in want
    ]
    # The planted collapse leads: one key carries nearly all of its weight.
    assert rows[0][:2] == ["1", "2"]
    assert float(rows[0][3].split()[0]) < 0.1


def test_a_module_attending_twice_names_the_call(tmp_path, cli):
    path = record(tmp_path / "run", calls=2)
    _, out, _ = cli("summary", path, "--plain")
    rows = rows_of(out, TITLE)
    for row, (module, call, head, *_) in zip(rows, expected(path), strict=True):
        assert row[:2] == [module, f"{head} (call {call})" if module == "1" else str(head)]


def test_a_run_without_attention_has_no_section(tmp_path, cli):
    path = train(tiny_model(), tmp_path / "plain")
    status, out, _ = cli("summary", path, "--plain")
    assert status == 0
    assert "attention heads" not in out


def test_a_phase_without_attention_rows_has_no_section(attention_run, cli):
    status, out, _ = cli("summary", attention_run, "--plain", "--phase", "eval")
    assert status == 0
    assert TITLE not in out


def test_the_section_is_read_without_torch(attention_run):
    code = (
        "import contextlib, io, json, sys\n"
        "from layerscope.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    main(['summary', {str(attention_run)!r}, '--plain'])\n"
        "print(json.dumps([out.getvalue(), 'torch' in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    printed, imported_torch = json.loads(done.stdout.splitlines()[-1])
    assert TITLE in printed
    assert not imported_torch
