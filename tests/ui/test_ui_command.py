"""The ``serve`` and ``report`` subcommands, and what ``import layerscope`` leaves out."""

from __future__ import annotations

import subprocess
import sys

from layerscope.cli import build_parser, main


def test_importing_layerscope_imports_no_web_package():
    code = (
        "import sys, layerscope, layerscope.cli, layerscope.ui;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn', 'plotly'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_commands_are_listed():
    help_text = build_parser().format_help()
    assert "serve" in help_text
    assert "report" in help_text


def test_serve_of_no_folder_is_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "no folder at" in capsys.readouterr().err


def test_serve_of_a_run_names_its_folder(runs_root, capsys):
    assert main(["serve", str(runs_root / "exp1")]) == 2
    assert f"serve the folder that holds it ({runs_root})" in capsys.readouterr().err


def test_report_writes_one_file(runs_root, tmp_path, capsys):
    output = tmp_path / "exp2.html"
    assert main(["report", str(runs_root / "exp2"), "-o", str(output)]) == 0
    assert f"wrote {output}" in capsys.readouterr().err
    html = output.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>")
    assert "<title>layerscope: exp2</title>" in html
