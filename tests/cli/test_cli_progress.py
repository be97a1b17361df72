"""Long commands show a bar on a terminal's stderr, and nothing in a pipe."""

import io

import pytest
from cli_runs import tiny_model, train

from layerscope.cli import _progress, main

pytest.importorskip("duckdb")


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def test_the_bar_counts_on_a_terminal_and_is_gone_after():
    terminal = Terminal()
    with _progress.progress("exporting steps", 3, stream=terminal) as advance:
        for _ in range(3):
            advance()
    shown = terminal.getvalue()
    assert "exporting steps" in shown
    assert "3/3" in shown


def test_nothing_is_written_where_the_stream_is_no_terminal():
    piped = io.StringIO()
    with _progress.progress("exporting steps", 3, stream=piped) as advance:
        advance()
    assert piped.getvalue() == ""


_WORK = {
    "export": "exporting steps",
    "plot": "drawing figures",
    "report": "making the report's charts",
}


@pytest.mark.parametrize("command", list(_WORK))
def test_export_plot_and_report_count_their_work_on_a_terminal(tmp_path, monkeypatch, command):
    pytest.importorskip("matplotlib")
    pytest.importorskip("plotly")
    run = train(tiny_model(), tmp_path / "runs" / "exp1", steps=3)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    more = {
        "export": ["--tensorboard", tmp_path / "tb", "--plain"],
        "plot": ["--out", tmp_path, "--plain"],
        "report": ["-o", tmp_path / "run.html"],
    }[command]
    assert main([command, str(run), *map(str, more)]) == 0
    assert _WORK[command] in terminal.getvalue()
