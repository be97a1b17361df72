"""Renderers of whole tensors and their animations: what is drawn is the tensor, read back."""

from __future__ import annotations

import io
import math
import pickle
import re
import subprocess
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import layerscope
from layerscope.plots import _video, animation
from layerscope.tensors import PCA, HeatMap, Histogram, Record

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def record_of(value, *, module="blocks.0/attn", kind="activation", tensor="out", step=3):
    return Record(
        module=module,
        type="Linear",
        kind=kind,
        tensor=tensor,
        step=step,
        phase="train",
        call=0,
        value=value,
    )


def image_of(fig):
    (image,) = fig.axes[0].images
    return image


def title_of(fig):
    """The figure's title and the caption under it, as two lines."""
    ax = fig.axes[0]
    return f"{ax.get_title()}\n{ax.texts[0].get_text()}"


@pytest.fixture(scope="module")
def trained():
    """A capture of two layers over 5 steps of a tiny model: (batch 12, 6) and (12, 5)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.capture(model, include=r"^(0|2)$", every=1) as cap:
        for _ in range(5):
            model(torch.randn(12, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            cap.step()
    return cap


def gif_frames(path):
    with Image.open(path) as image:
        assert image.format == "GIF"
        return image.n_frames


# ---------------------------------------------------------------- heat map


def test_heatmap_of_a_matrix_is_the_matrix_with_symmetric_limits():
    value = torch.randn(7, 13) * 3
    fig = HeatMap().figure(record_of(value, kind="weight", tensor="weight"))
    image = image_of(fig)
    np.testing.assert_array_equal(image.get_array(), value.double().numpy())
    limit = np.abs(value.double().numpy()).max()
    assert (image.norm.vmin, image.norm.vmax) == pytest.approx((-limit, limit), rel=1e-12)
    assert image.get_cmap().name.startswith("RdBu")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("input feature", "output feature")
    assert re.search(r"blocks\.0/attn weight weight \(7 x 13\)\nstep 3, train", title_of(fig))


@pytest.mark.parametrize(
    ("shape", "plane"),
    [
        ((9,), lambda v: v.reshape(1, 9)),  # one row
        ((), lambda v: v.reshape(1, 1)),
        ((3, 5, 8), lambda v: v[0]),  # (batch, seq, hidden): the first sample
        ((2, 3, 4, 5, 6), lambda v: v[0].reshape(-1, 6)),  # 5-D: the first sample, as rows
    ],
)
def test_heatmap_shows_the_documented_plane(shape, plane):
    value = torch.randn(shape, dtype=torch.float64)
    drawn = image_of(HeatMap().figure(value)).get_array()
    np.testing.assert_array_equal(drawn, plane(value.numpy()))


def expected_grid(sample, shown):
    """Channels as tiles, ceil(sqrt(C)) a row, one NaN pixel between them: built by hand."""
    channels, height, width = sample[:shown].shape
    per_row = math.ceil(math.sqrt(channels))
    rows = math.ceil(channels / per_row)
    grid = np.full((rows * height + rows - 1, per_row * width + per_row - 1), np.nan)
    for channel in range(channels):
        top = (channel // per_row) * (height + 1)
        left = (channel % per_row) * (width + 1)
        for i in range(height):
            for j in range(width):
                grid[top + i, left + j] = sample[channel, i, j]
    return grid


def test_heatmap_of_a_4d_tensor_is_a_grid_of_the_first_samples_channels():
    value = torch.randn(2, 5, 3, 4)
    image = image_of(HeatMap().figure(value))
    expected = expected_grid(value[0].double().numpy(), 5)
    assert expected.shape == (3 + 1 + 3, 4 * 3 + 2)  # 3 tiles a row, 2 rows
    drawn = np.ma.filled(image.get_array().astype(np.float64), np.nan)
    np.testing.assert_array_equal(drawn, expected)


def test_heatmap_shows_at_most_max_channels():
    value = torch.randn(1, 70, 2, 2)
    drawn = np.ma.filled(image_of(HeatMap().figure(value)).get_array(), np.nan)
    np.testing.assert_array_equal(drawn, expected_grid(value[0].double().numpy(), 64))
    few = np.ma.filled(image_of(HeatMap(max_channels=4).figure(value)).get_array(), np.nan)
    np.testing.assert_array_equal(few, expected_grid(value[0].double().numpy(), 4))


def test_large_heatmap_is_block_means_over_the_tensors_own_axes():
    value = torch.randn(1030, 700)
    fig = HeatMap().figure(value)
    image = image_of(fig)
    data = value.double().numpy()
    # Blocks of ceil(1030 / 512) = 3 rows by ceil(700 / 512) = 2 columns; the last row block
    # holds the one remaining row.
    expected = np.empty((344, 350))
    for i in range(344):
        for j in range(350):
            expected[i, j] = data[3 * i : 3 * i + 3, 2 * j : 2 * j + 2].mean()
    np.testing.assert_allclose(image.get_array(), expected, rtol=1e-12, atol=1e-15)
    limit = np.abs(expected).max()
    assert image.norm.vmax == pytest.approx(limit)
    assert image.norm.vmin == pytest.approx(-limit)
    # The axes count the tensor's rows and columns, not the image's pixels.
    assert fig.axes[0].get_xlim() == (-0.5, 699.5)
    assert fig.axes[0].get_ylim() == (1029.5, -0.5)
    assert "block means 344 x 350" in title_of(fig)


def test_heatmap_with_nan_and_inf_draws_limits_from_finite_values():
    value = torch.randn(6, 6)
    value[1, 2] = float("nan")
    value[4, 4] = float("inf")
    fig = HeatMap().figure(value)
    image = image_of(fig)
    drawn = image.get_array()
    assert drawn.mask[1, 2]  # NaN is drawn in the "bad" colour
    finite = value.double().numpy()[np.isfinite(value.numpy())]
    assert image.norm.vmax == pytest.approx(np.abs(finite).max())
    assert "NaN 1, +Inf 1" in title_of(fig)
    fig.savefig(io.BytesIO(), format="png")  # and it renders

    big = torch.randn(1100, 8)
    big[5, 3] = float("nan")
    shrunk = image_of(HeatMap().figure(big)).get_array()
    assert shrunk.shape == (367, 8)
    assert shrunk.mask[1, 3]
    assert shrunk.mask.sum() == 1  # the block holding it, only


# ---------------------------------------------------------------- histogram


def test_histogram_counts_the_finite_values_and_names_the_others():
    value = torch.randn(50, 20)
    value[0, :3] = float("nan")
    value[1, 0] = float("inf")
    value[2, 0] = float("-inf")
    fig = Histogram(bins=16).figure(record_of(value))
    (bars,) = fig.axes[0].patches
    counts, edges = bars.get_data().values, bars.get_data().edges
    finite = value.double().numpy()[np.isfinite(value.numpy())]
    assert counts.sum() == finite.size == 1000 - 5
    assert (edges[0], edges[-1]) == (finite.min(), finite.max())
    np.testing.assert_array_equal(counts, np.histogram(finite, bins=16)[0])
    assert "NaN 3, +Inf 1, -Inf 1" in title_of(fig)


def test_histogram_of_nothing_finite_or_one_value_still_draws():
    nan = Histogram().figure(torch.full((4,), float("nan")))
    assert nan.axes[0].patches[0].get_data().values.sum() == 0
    assert "NaN 4" in title_of(nan)
    nan.savefig(io.BytesIO(), format="png")
    constant = Histogram().figure(torch.full((3, 3), 2.0))
    assert constant.axes[0].patches[0].get_data().values.sum() == 9


# ---------------------------------------------------------------- PCA


def reference_projection(samples, fit=None):
    """Float64 numpy PCA: SVD of the centred fit samples, largest loading of each positive."""
    fit = samples if fit is None else fit
    mean = fit.mean(axis=0)
    _, _, rows = np.linalg.svd(fit - mean, full_matrices=False)
    components = rows[:2].T.copy()
    for k in range(2):
        if components[np.abs(components[:, k]).argmax(), k] < 0:
            components[:, k] *= -1
    return (samples - mean) @ components


def low_rank(samples, features, seed):
    """Samples with two clear directions and a little noise: a well-separated spectrum."""
    generator = torch.Generator().manual_seed(seed)
    loadings = torch.randn(samples, 2, generator=generator, dtype=torch.float64)
    loadings *= torch.tensor([5.0, 2.0], dtype=torch.float64)
    directions = torch.randn(2, features, generator=generator, dtype=torch.float64)
    noise = 0.01 * torch.randn(samples, features, generator=generator, dtype=torch.float64)
    return loadings @ directions + noise + 3.0


@pytest.mark.parametrize("shape", [(256, 64), (40, 100)])
def test_pca_points_are_the_float64_projection(shape):
    value = torch.randn(*shape, dtype=torch.float64) @ torch.randn(shape[1], shape[1]).double()
    fig = PCA().figure(value.float())
    offsets = fig.axes[0].collections[0].get_offsets()
    expected = reference_projection(value.float().double().numpy())
    np.testing.assert_allclose(offsets, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    assert fig.axes[0].get_xlabel().startswith("PC1 (")


def test_pca_of_many_features_uses_the_randomised_fit_and_keeps_the_random_state():
    value = low_rank(300, 200, seed=1)  # past PCA_EXACT: torch.pca_lowrank's randomised fit
    state = torch.random.get_rng_state()
    offsets = PCA().figure(value).axes[0].collections[0].get_offsets()
    assert torch.equal(torch.random.get_rng_state(), state)
    expected = reference_projection(value.numpy())
    np.testing.assert_allclose(offsets, expected, atol=1e-6 * np.abs(expected).max())


def test_pca_samples_of_3d_and_4d_tensors():
    tokens = torch.randn(3, 10, 8)  # (batch, seq, hidden): every position a sample
    offsets = PCA().figure(tokens).axes[0].collections[0].get_offsets()
    np.testing.assert_allclose(
        offsets, reference_projection(tokens.double().numpy().reshape(30, 8)), atol=1e-5
    )
    images = torch.randn(16, 5, 4, 4)  # (N, C, H, W): channels averaged over space
    offsets = PCA().figure(images).axes[0].collections[0].get_offsets()
    pooled = images.double().numpy().mean(axis=(2, 3))
    np.testing.assert_allclose(offsets, reference_projection(pooled), atol=1e-5)


def test_pca_leaves_out_non_finite_samples_and_caps_the_points():
    value = torch.randn(30, 6, dtype=torch.float64)
    value[4, 1] = float("nan")
    fig = PCA().figure(value)
    offsets = fig.axes[0].collections[0].get_offsets()
    kept = np.delete(value.numpy(), 4, axis=0)
    np.testing.assert_allclose(offsets, reference_projection(kept), atol=1e-9)
    assert "29 samples, 1 samples with NaN/Inf left out" in title_of(fig)
    many = PCA(max_points=100).figure(torch.randn(1000, 4))
    assert len(many.axes[0].collections[0].get_offsets()) == 100


@pytest.mark.parametrize("value", [torch.tensor([1.5]), torch.randn(1, 16), torch.randn(20, 1)])
def test_pca_of_one_sample_or_feature_is_a_clear_error(value):
    with pytest.raises(ValueError, match=r"value: PCA needs at least 2 samples .* and 2 features"):
        PCA().figure(value)


def test_values_that_cannot_be_drawn_say_why():
    with pytest.raises(ValueError, match="value: an empty tensor"):
        HeatMap().figure(torch.zeros(0, 3))
    with pytest.raises(TypeError, match="value: a complex tensor"):
        Histogram().figure(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="value: expected a Tensor or a"):
        PCA().figure([[1.0, 2.0]])
    with pytest.raises(ValueError, match="max_side: expected a positive int"):
        HeatMap(max_side=0)
    with pytest.raises(ValueError, match="values: no tensors"):
        HeatMap().frames([])


# ---------------------------------------------------------------- frames over steps


def test_frames_share_colour_limits_bins_and_one_pca_projection():
    small, large = torch.randn(8, 6), 10 * torch.randn(8, 6)
    heat = HeatMap().frames([small, large])
    heat.draw(0)
    image = heat.moving[0]
    np.testing.assert_array_equal(image.get_array(), small.double().numpy())
    limit = max(np.abs(small.numpy()).max(), np.abs(large.numpy()).max())
    assert image.norm.vmax == pytest.approx(limit)

    values = Histogram(bins=8).frames([small, large])
    values.draw(0)
    data = values.moving[0].get_data()
    both = np.concatenate([small.double().numpy().ravel(), large.double().numpy().ravel()])
    assert (data.edges[0], data.edges[-1]) == (both.min(), both.max())
    assert data.values.sum() == 48
    top = max(np.histogram(v.double().numpy(), bins=data.edges)[0].max() for v in (small, large))
    assert values.figure.axes[0].get_ylim()[1] == pytest.approx(1.05 * top)

    early, late = low_rank(50, 10, seed=2), low_rank(50, 10, seed=3)
    pca = PCA().frames([early, late])
    drawn = []
    for index in range(2):
        pca.draw(index)
        drawn.append(pca.moving[0].get_offsets().copy())
    # One projection, fit on the last frame: its mean and components for both.
    np.testing.assert_allclose(drawn[1], reference_projection(late.numpy()), atol=1e-8)
    np.testing.assert_allclose(
        drawn[0], reference_projection(early.numpy(), fit=late.numpy()), atol=1e-8
    )
    low, high = pca.figure.axes[0].get_xlim()
    assert low <= min(d[:, 0].min() for d in drawn)
    assert high >= max(d[:, 0].max() for d in drawn)


# ---------------------------------------------------------------- the callback form


@pytest.mark.parametrize("renderer", [HeatMap(), Histogram(bins=8), PCA()])
def test_callback_writes_a_png_at_the_documented_path_after_pickling(renderer, tmp_path):
    callback = pickle.loads(pickle.dumps(renderer))
    assert callback == renderer
    value = torch.randn(12, 5)
    path = callback(record_of(value, step=42), tmp_path)
    folder = {HeatMap: "heatmap", Histogram: "histogram", PCA: "pca"}[type(renderer)]
    assert path == tmp_path / "renders" / folder / "blocks.0_attn-activation-out" / (
        "step-000000042-train-0.png"
    )
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (640, 480)
        image.load()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left


def test_callback_of_the_root_module_and_without_a_directory(tmp_path):
    path = HeatMap()(record_of(torch.randn(3, 3), module=""), str(tmp_path))
    assert path.parent.name == "root-activation-out"
    with pytest.raises(ValueError, match="directory: HeatMap as an on_tensor callback"):
        HeatMap()(record_of(torch.randn(3, 3)), None)
    with pytest.raises(TypeError, match=r"record: expected a layerscope\.tensors\.Record"):
        HeatMap()(torch.randn(3, 3), tmp_path)


# ---------------------------------------------------------------- animate


@pytest.mark.parametrize("what", ["heatmap", "pca", "values"])
def test_animate_a_capture_writes_a_frame_per_step(trained, what, tmp_path):
    path = layerscope.animate(trained, "0", "activation", what=what, path=tmp_path / "a.gif")
    assert path == tmp_path / "a.gif"
    assert gif_frames(path) == 5
    with Image.open(path) as image:
        assert image.size == (512, 288)
    chosen = layerscope.animate(trained, "2", "grad", what, tmp_path / "g.gif", steps=[4, 1])
    assert gif_frames(chosen) == 2


def test_animate_draws_each_steps_record_in_the_order_asked(trained, monkeypatch, tmp_path):
    drawn = []

    def keep(frames, path, fps):
        for index in range(len(frames)):
            frames.draw(index)
            step = int(re.search(r"step (\d+)", frames.moving[1].get_text()).group(1))
            drawn.append((step, np.asarray(frames.moving[0].get_array()).copy()))
        return path

    monkeypatch.setattr(animation, "tensor_animation", keep)
    layerscope.animate(trained, "2", what="heatmap", path=tmp_path / "x.gif", steps=[3, 0, 4])
    values = {
        r.step: r.value for r in trained.records if r.module == "2" and r.kind == "activation"
    }
    assert [step for step, _ in drawn] == [3, 0, 4]
    for step, image in drawn:
        np.testing.assert_array_equal(image, values[step].double().numpy())


def test_animate_a_saved_capture_and_a_renderer_with_options(trained, tmp_path):
    saved = layerscope.load_capture(trained.save(tmp_path / "cap"))
    path = layerscope.animate(saved, "0", what=Histogram(bins=4), path=tmp_path / "v.gif")
    assert gif_frames(path) == 5


def test_animate_a_tensor_with_nan(tmp_path):
    model = nn.Linear(3, 8)
    with layerscope.capture(model, kinds=["activation"]) as cap:
        for step in range(3):
            inputs = torch.randn(10, 3)
            if step == 1:
                inputs[2, 0] = float("nan")
            model(inputs)
            cap.step()
    for what in ("heatmap", "values", "pca"):
        assert (
            gif_frames(layerscope.animate(cap, "", what=what, path=tmp_path / f"{what}.gif")) == 3
        )


def test_animate_pca_of_one_sample_is_a_clear_error(tmp_path):
    model = nn.Linear(3, 4)
    with layerscope.capture(model, kinds=["activation"]) as cap:
        model(torch.randn(1, 3))
    with pytest.raises(ValueError, match="value: PCA needs at least 2 samples"):
        layerscope.animate(cap, "", what="pca", path=tmp_path / "p.gif")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"what": "scatter"}, r"what: expected one of \('histogram', 'heatmap', 'pca', 'values'\)"),
        ({"what": "histogram"}, "what: 'histogram' draws the histograms a run recorded"),
        ({"module": "9"}, r"module: no whole tensors of '9'; kept of modules \['0', '2'\]"),
        ({"kind": "input"}, r"kind: no 'input' tensors of module '0'; kept \['activation', 'grad'"),
        ({"kind": "gradient"}, "kind: expected one of"),
        ({"tensor": "out.1"}, r"tensor: module '0' kept activation tensors \['out'\]"),
        ({"phase": "eval"}, r"phase: no 'eval' records"),
        ({"steps": [7]}, r"steps: \[7\] not kept; 5 steps were: \[0, 1, 2, 3, 4\]"),
        ({"path": None}, "path: a capture has no run directory; give path="),
        ({"path": "x.png"}, r"path: expected a name ending in \.gif or \.mp4"),
    ],
)
def test_bad_arguments_name_themselves(trained, arguments, match, tmp_path):
    arguments = {"module": "0", "what": "heatmap", "path": tmp_path / "x.gif", **arguments}
    with pytest.raises(ValueError, match=match):
        layerscope.animate(trained, **arguments)


def test_source_of_the_wrong_type(tmp_path):
    with pytest.raises(TypeError, match="source: expected a Capture, a SavedCapture, a Run"):
        layerscope.animate(3, "0", what="heatmap", path=tmp_path / "x.gif")


def test_a_run_without_whole_tensors_says_how_to_keep_them(tmp_path):
    model = nn.Linear(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with layerscope.watch(model, run=tmp_path / "run", every=1) as scope:
            model(torch.randn(4, 3)).sum().backward()
            scope.step()
    run = layerscope.load(tmp_path / "run")
    for source in (run, run.path):
        with pytest.raises(
            ValueError, match=r"kept no whole tensors.*tensors= to layerscope\.watch"
        ):
            layerscope.animate(source, "", what="pca")


def test_animate_the_whole_tensors_a_run_kept(tmp_path):
    pytest.importorskip("safetensors")
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with layerscope.watch(model, run=tmp_path / "run", every=1, tensors=r"^0$") as scope:
            for _ in range(4):
                model(torch.randn(5, 4)).sum().backward()
                scope.step()
            scope.flush()
            from_scope = layerscope.animate(scope, "0", what="values")
    assert from_scope == tmp_path / "run" / "animations" / "0-activation-values.gif"
    assert gif_frames(from_scope) == 4
    run = layerscope.load(tmp_path / "run")
    path = layerscope.animate(run.path, "0", "grad", what="heatmap", steps=[2, 3])
    assert path == tmp_path / "run" / "animations" / "0-grad-heatmap.gif"
    assert gif_frames(path) == 2


@pytest.mark.skipif(_video.ffmpeg_path() is None, reason="no ffmpeg")
def test_animate_a_capture_as_mp4(trained, tmp_path):
    path = layerscope.animate(trained, "0", what="pca", path=tmp_path / "p.mp4", fps=5)
    probe = subprocess.run(
        [_video.ffmpeg_path(), "-i", str(path), "-map", "0:v:0", "-f", "null", "-"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert re.findall(r"frame=\s*(\d+)", probe.stderr)[-1] == "5"
