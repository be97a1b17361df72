"""``layerscope plot RUN``: the standard set of PNGs, each the figure ``run.plot`` draws."""

import re

import numpy as np
from cli_runs import tiny_model, train
from PIL import Image

import layerscope

STANDARD = [
    "stats-activation",
    "heatmap-activation-absmax",
    "color_dim-activation",
    "stats-grad",
    "heatmap-grad-absmax",
    "color_dim-grad",
    "dead_chart",
    "grad_norms",
    "scalars",
]


def rows_of(out):
    """The (figure, file) rows of the command's plain table."""
    lines = out.split("\n\n")[0].splitlines()[3:]
    return [tuple(line.split(None, 1)) for line in lines]


def test_writes_the_standard_set_into_the_run(cli, run_dir):
    status, out, err = cli("plot", run_dir, "--plain")
    assert (status, err) == (0, "")
    rows = rows_of(out)
    assert [name for name, _ in rows] == STANDARD
    for name, file in rows:
        assert file == str(run_dir / "plots" / f"{name}.png")
        with Image.open(file) as image:
            assert image.format == "PNG"
            image.load()  # decodes the whole file
            assert image.size[0] >= 600  # 8 inches at 100 dpi, less the tight margins
    assert sorted(path.stem for path in (run_dir / "plots").iterdir()) == sorted(STANDARD)


def test_the_png_is_the_figure_run_plot_draws(cli, run_dir, tmp_path):
    status, _, _ = cli("plot", run_dir, "--out", tmp_path / "out", "--kind", "grad", "--dpi", 50)
    assert status == 0
    fig = layerscope.load(run_dir).plot.heatmap(stat="absmax", kind="grad")
    fig.savefig(tmp_path / "expected.png", dpi=50)
    written = np.asarray(Image.open(tmp_path / "out" / "heatmap-grad-absmax.png"))
    expected = np.asarray(Image.open(tmp_path / "expected.png"))
    np.testing.assert_array_equal(written, expected)


def test_update_ratio_when_the_run_has_updates(cli, tmp_path):
    path = train(tiny_model(), tmp_path / "run", kinds=("activation", "weight", "update"))
    status, out, _ = cli("plot", path, "--plain", "--kind", "activation", "--kind", "grad")
    assert status == 0
    names = [name for name, _ in rows_of(out)]
    assert "update_ratio" in names
    assert "stats-grad" not in names  # not recorded: said, not drawn
    assert re.search(r"\ngrad +the run has no 'grad' rows", out)


def test_modules_select_the_layers_drawn(cli, run_dir, tmp_path):
    status, _, _ = cli("plot", run_dir, "--out", tmp_path, "--modules", "^2$", "--kind", "grad")
    assert status == 0
    names = {path.stem for path in tmp_path.iterdir()}
    assert "stats-grad" in names


def test_a_phase_without_rows_draws_only_the_scalars(cli, run_dir, tmp_path):
    status, out, _ = cli("plot", run_dir, "--plain", "--out", tmp_path, "--phase", "eval")
    assert status == 0
    assert [name for name, _ in rows_of(out)] == ["scalars"]
    assert re.search(
        r"stats-activation +kind: no 'activation' rows of tensor 'out' in phase 'eval'", out
    )


def test_bad_dpi_exits_2_with_one_line(cli, run_dir):
    status, _, err = cli("plot", run_dir, "--dpi", "0")
    assert status == 2
    assert err == "layerscope plot: --dpi: expected 10 to 600 dots per inch, got 0\n"


def test_no_run_exits_2(cli, tmp_path):
    status, _, err = cli("plot", tmp_path / "none")
    assert status == 2
    assert "no run at" in err
