"""Names and messages from a run's files never drive the terminal: their controls show escaped.

The run's folder, name, host, user, module names and alerts hold an OSC-8 hyperlink, a screen
clear, a bell, a C1 CSI and rich markup; every command's output, plain and rich, shows each as
text.
"""

import json
import re
import shutil
import sys

import pytest
import torch
from cli_runs import add_alerts, train
from torch import nn

from layerscope.cli import main
from layerscope.cli._visible import visible

pytest.importorskip("duckdb")

LINK = "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
CSI = "\x9b"
MARKUP = "[bold]b[/bold]"
FOLDER = "run" + CLEAR
MODULES = ("fc" + LINK, CLEAR + MARKUP + CSI, "out[link=http://x]y")
# Characters no output may hold raw: C0 but the newline, DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
RICH_STYLE = re.compile("\x1b\\[[0-9;]*m")  # the colours rich itself writes


def hostile_model():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module(MODULES[0], nn.Linear(4, 8))
    model.add_module(MODULES[1], nn.ReLU())
    model.add_module(MODULES[2], nn.Linear(8, 2))
    return model


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A run whose folder, name, host, user, modules and alert hold control characters."""
    path = train(hostile_model(), tmp_path_factory.mktemp("cc") / "runs" / FOLDER)
    meta = json.loads((path / "run.json").read_text())
    meta.update(name="n" + LINK + "[bold]x", host="h" + CLEAR + "\x07", user="u" + CSI + "31m")
    (path / "run.json").write_text(json.dumps(meta))
    alert = {
        "step": 1, "phase": "train", "rule": "rule" + CLEAR, "module": MODULES[0],
        "kind": "activation", "tensor": "out" + CSI, "severity": "warning", "value": 1.0,
        "threshold": 0.5, "message": "message " + LINK, "rank": 0,
    }  # fmt: skip
    add_alerts(path, [alert])
    return path


def shown(out, rich):
    """``out`` less rich's own colours, and a check that nothing raw is left."""
    if rich:
        out = RICH_STYLE.sub("", out)
    assert not RAW.findall(out), sorted(set(RAW.findall(out)))
    return out


@pytest.fixture(params=["plain", "rich"])
def command(request, capsys, monkeypatch):
    """Run ``layerscope ARGS`` as plain text or as rich on a terminal: (status, out, err)."""
    rich = request.param == "rich"
    if rich:
        pytest.importorskip("rich")
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        monkeypatch.setenv("COLUMNS", "2000")  # no cell cut or wrapped

    def run(*argv):
        status = main([str(arg) for arg in argv] + ([] if rich else ["--plain"]))
        captured = capsys.readouterr()
        return status, shown(captured.out, rich), shown(captured.err, False)

    return run


def test_visible_escapes_every_control_and_leaves_other_text():
    controls = [*map(chr, range(0x20)), "\x7f", *map(chr, range(0x80, 0xA0)), "\u202e", "\u2069"]
    for character in controls:
        assert visible(f"a{character}b") != f"a{character}b"
        assert not RAW.search(visible(character))
    assert visible("\x1b[2J\t\n\x9b\u202e") == "\\x1b[2J\\t\\n\\x9b\\u202e"
    kept = "encoder.2 é 注意 👩‍💻 [bold] $x$"  # the emoji holds a zero-width joiner
    assert visible(kept) == kept


def test_summary_shows_name_host_modules_and_alerts_escaped(hostile_run, command):
    status, out, _ = command("summary", hostile_run)
    assert status == 0
    assert "n\\x1b]8;;http://x\\x1b\\link\\x1b]8;;\\x1b\\[bold]x" in out
    assert "runs/run\\x1b[2J" in out
    assert "h\\x1b[2J\\x07 (user u\\x9b31m" in out
    assert "fc\\x1b]8;;http://x" in out
    assert "\\x1b[2J[bold]b[/bold]\\x9b" in out  # the markup printed as written
    assert "out[link=http://x]y" in out
    assert "rule\\x1b[2J" in out
    assert "message \\x1b]8;;http://x" in out


def test_runs_lists_the_name_and_path_escaped(hostile_run, command):
    status, out, _ = command("runs", hostile_run.parent)
    assert status == 0
    assert "n\\x1b]8;;http://x\\x1b\\link" in out
    assert "run\\x1b[2J" in out


def test_diff_shows_modules_escaped(hostile_run, command):
    status, out, _ = command("diff", hostile_run, hostile_run)
    assert status == 0
    assert "fc\\x1b]8;;http://x" in out
    assert "\\x1b[2J[bold]b[/bold]\\x9b" in out


@pytest.mark.filterwarnings("default::layerscope.LayerscopeWarning")  # shown by the command
def test_errors_and_warnings_quote_paths_escaped(hostile_run, command, tmp_path):
    status, out, err = command("summary", tmp_path / ("gone" + CLEAR))
    assert (status, out) == (2, "")
    assert "gone\\x1b[2J" in err
    damaged = shutil.copytree(hostile_run, tmp_path / FOLDER)
    (damaged / "modules.json").unlink()  # the warning names the file, in the run's folder
    status, _, err = command("summary", damaged)
    assert status == 0
    assert "warning: " in err
    assert "run\\x1b[2J" in err
