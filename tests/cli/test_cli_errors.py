"""The command as a program: exit statuses, one-line errors, ``python -m``, lazy imports, rich."""

import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import normalised

from layerscope.cli import main

pytest.importorskip("duckdb")  # the commands query runs with DuckDB


def _not_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a run")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "run.json").write_text('{"name": "cut sho')
    return {
        "missing": tmp_path / "missing",
        "empty folder": tmp_path / "empty",
        "file": tmp_path / "notes.txt",
        "damaged run.json": tmp_path / "damaged",
    }


@pytest.mark.parametrize("case", ["missing", "empty folder", "file", "damaged run.json"])
def test_summary_of_what_is_not_a_run_exits_2_with_one_line(tmp_path, cli, case):
    path = _not_runs(tmp_path)[case]
    status, out, err = cli("summary", path)
    assert (status, out) == (2, "")
    assert err.startswith("layerscope summary: ")
    assert err.count("\n") == 1
    assert str(path) in err


def test_diff_with_one_run_missing_and_runs_of_a_missing_folder_exit_2(run_dir, tmp_path, cli):
    status, _, err = cli("diff", run_dir, tmp_path / "missing")
    assert status == 2
    assert err == f"layerscope diff: no run at {tmp_path / 'missing'} (no run.json)\n"
    status, _, err = cli("runs", tmp_path / "missing")
    assert status == 2
    assert err == f"layerscope runs: no folder at {tmp_path / 'missing'}\n"


def test_usage_errors_exit_2_and_help_exits_0(capsys):
    assert main([]) == 2
    assert main(["summary"]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["--help"]) == 0
    assert "summary" in capsys.readouterr().out


def _python_m_layerscope(*argv):
    return subprocess.run(
        [sys.executable, "-m", "layerscope", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_python_m_layerscope_prints_what_main_prints_and_fails_in_one_line(run_dir, tmp_path, cli):
    done = _python_m_layerscope("summary", run_dir, "--plain")
    assert (done.returncode, done.stderr) == (0, "")
    _, in_process, _ = cli("summary", run_dir, "--plain")
    assert normalised(done.stdout, tmp_path) == normalised(in_process, tmp_path)

    failed = _python_m_layerscope("summary", tmp_path / "missing")
    assert failed.returncode == 2
    assert failed.stdout == ""
    assert failed.stderr.count("\n") == 1
    assert "Traceback" not in failed.stderr


def test_the_installed_console_script_runs(run_dir):
    script = Path(sys.executable).parent / "layerscope"
    if not script.exists():
        pytest.skip("layerscope is not installed as a console script here")
    done = subprocess.run([script, "runs", run_dir.parent], capture_output=True, text=True)
    assert done.returncode == 0
    assert "exp1" in done.stdout


def test_importing_layerscope_or_its_cli_imports_neither_rich_nor_pandas():
    code = (
        "import sys, layerscope, layerscope.cli, layerscope.__main__\n"
        "print(sorted(m for m in ('rich', 'pandas', 'duckdb') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_on_a_terminal_the_output_is_rich_tables(run_dir, capsys, monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["summary", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "─" in out  # rich's rule under the headers; the plain text has dashes
    assert "act absmax" in out
    assert "Linear" in out
    assert main(["summary", str(run_dir), "--plain"]) == 0
    assert "─" not in capsys.readouterr().out


@pytest.mark.parametrize("dpi", ["1", "601"])
def test_a_dpi_matplotlib_cannot_draw_or_hold_is_refused(cli, run_dir, dpi):
    pytest.importorskip("matplotlib")
    status, _, err = cli("plot", run_dir, "--dpi", dpi)
    assert status == 2
    assert err == f"layerscope plot: --dpi: expected 10 to 600 dots per inch, got {dpi}\n"
    assert not (run_dir / "plots").exists()  # refused before a figure is drawn


def test_a_report_that_cannot_be_written_names_o(cli, run_dir, tmp_path):
    pytest.importorskip("plotly")
    link = tmp_path / "report.html"
    link.symlink_to(tmp_path / "gone" / "report.html")  # into a folder that is not there
    status, out, err = cli("report", run_dir, "-o", link)
    assert (status, out) == (2, "")
    assert err == f"layerscope report: -o: cannot write {link}: No such file or directory\n"


def test_a_figure_that_cannot_be_written_names_out(cli, run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "out" / "stats-grad.png").mkdir(parents=True)  # a folder in the file's place
    status, out, err = cli("plot", run_dir, "--out", tmp_path / "out", "--kind", "grad")
    assert (status, out) == (2, "")
    path = tmp_path / "out" / "stats-grad.png"
    assert err == f"layerscope plot: --out: cannot write {path}: Is a directory\n"


def test_export_into_a_file_names_tensorboard(cli, run_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    under_file = tmp_path / "notes.txt" / "logs"
    status, _, err = cli("export", run_dir, "--tensorboard", under_file)
    assert status == 2
    assert err == f"layerscope export: --tensorboard: cannot write {under_file}: Not a directory\n"


def test_demo_into_a_file_names_out(cli, tmp_path):
    for extra in ("sklearn", "plotly"):
        pytest.importorskip(extra)  # the demo asks for its extras first
    (tmp_path / "notes.txt").write_text("a file")
    under_file = tmp_path / "notes.txt" / "demo"
    status, _, err = cli("demo", "--out", under_file)
    assert status == 2
    assert err == f"layerscope demo: --out: cannot make {under_file}: Not a directory\n"
