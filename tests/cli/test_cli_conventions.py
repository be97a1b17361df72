"""What a user mistypes: a command, a flag, ``--plain`` first, a statistic, a rank, a folder."""

import pytest

pytest.importorskip("duckdb")  # the commands query runs with DuckDB


def test_a_mistyped_command_gets_the_nearest_one(cli):
    status, out, err = cli("sumary", "runs/exp1")
    assert (status, out) == (2, "")
    assert err.startswith("layerscope: unknown command 'sumary'; did you mean 'summary'?")
    assert err.count("\n") == 1


def test_an_unknown_flag_gets_the_subcommands_usage_and_the_nearest_flag(run_dir, cli):
    status, out, err = cli("summary", run_dir, "--plian")
    assert (status, out) == (2, "")
    assert err.startswith("usage: layerscope summary")
    assert err.rstrip().endswith("unrecognized arguments: --plian; did you mean --plain?")


def test_plain_before_the_command_means_what_it_does_after(run_dir, cli):
    before = cli("--plain", "summary", run_dir)
    after = cli("summary", "--plain", run_dir)
    assert before[0] == 0
    assert before == after


def test_export_refuses_a_statistic_the_run_does_not_have(run_dir, cli, tmp_path):
    status, out, err = cli("export", run_dir, "--tensorboard", tmp_path / "tb", "--stats", "mena")
    assert (status, out) == (2, "")
    assert "--stats: the run has no statistic 'mena'; did you mean 'mean'?" in err
    assert not (tmp_path / "tb").exists()  # refused before anything was written


@pytest.mark.parametrize("command", ["summary", "export"])
def test_a_rank_the_run_does_not_have_is_refused(run_dir, cli, tmp_path, command):
    more = ["--tensorboard", tmp_path / "tb"] if command == "export" else []
    status, out, err = cli(command, run_dir, "--rank", 3, *more)
    assert (status, out) == (2, "")
    assert err == f"layerscope {command}: --rank 3: the run has no such rank; its ranks: 0\n"


def test_summary_of_a_folder_of_runs_points_to_layerscope_runs(run_dir, cli):
    folder = run_dir.parent
    status, out, err = cli("summary", folder)
    assert (status, out) == (2, "")
    assert err == (
        f"layerscope summary: {folder} is a folder of runs (1 run: exp1), not a run: "
        f"`layerscope runs {folder}` lists them; give one of them\n"
    )
