"""Fixtures of the command's tests: a finished run, and the command run in this process."""

import pytest
from cli_runs import tiny_model, train

from layerscope.cli import main


@pytest.fixture
def run_dir(tmp_path):
    """A finished run of 3 steps, ``runs/exp1``."""
    return train(tiny_model(), tmp_path / "runs" / "exp1")


@pytest.fixture
def cli(capsys):
    """Run ``layerscope ARGS...`` in this process: (exit status, stdout, stderr)."""

    def run(*argv):
        status = main([str(arg) for arg in argv])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run
