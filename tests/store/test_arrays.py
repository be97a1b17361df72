"""Arrow arrays built from buffers equal what pa.array builds; writing loads neither pandas
nor pyarrow.compute."""

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from layerscope.store._arrays import float_lists, floats, lists, numeric, strings


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (np.arange(-3, 7), pa.int64()),
        (np.array([1, 2**31 - 1, -(2**31)]), pa.int32()),
        (np.array([-5, 0, 255]), pa.int16()),
        (np.array([0.5, -np.inf, np.nan, 1e300]), pa.float64()),
        (np.array([True, False] * 9), pa.bool_()),  # more than a byte of bits
        (np.array([], dtype=np.int64), pa.int64()),
    ],
)
def test_numeric_arrays_equal_pa_array(values, kind):
    built = numeric(values, kind)
    built.validate(full=True)
    assert built.type == kind
    assert built.null_count == 0
    np.testing.assert_array_equal(built.to_numpy(zero_copy_only=False), values)  # NaN == NaN


def test_numeric_nulls_are_where_valid_is_false():
    valid = np.array([True, False, True, True, False, True, True, True, False, True])
    built = numeric(np.arange(10), pa.int16(), valid)
    built.validate(full=True)
    assert built.equals(pa.array(np.arange(10), type=pa.int16(), mask=~valid))
    assert built.null_count == 3


def test_strings_equal_pa_array():
    values = ["", "conv.0", "blöck·ß", "a" * 1000, "phase"]
    built = strings(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.string()))
    assert strings([]).equals(pa.array([], type=pa.string()))


def test_floats_and_float_lists_keep_nulls():
    values = [1.5, None, -2.0, float("inf")]
    assert floats(values).equals(pa.array(values, type=pa.float64()))
    lists = [[1.0, 2.0], None, [], 3.0]
    built = float_lists(lists)
    built.validate(full=True)
    expected = [[1.0, 2.0], None, [], [3.0]]  # a bare float is a list of one
    assert built.equals(pa.array(expected, type=pa.list_(pa.float64())))


def test_lists_equal_pa_array_with_nulls_and_empty_rows():
    offsets = np.array([0, 2, 2, 2, 5])
    valid = np.array([True, False, True, True])
    built = lists(offsets, numeric(np.arange(5), pa.int64()), valid)
    built.validate(full=True)
    expected = [[0, 1], None, [], [2, 3, 4]]
    assert built.equals(pa.array(expected, type=pa.list_(pa.int64())))
    assert lists(np.zeros(1), numeric(np.arange(0), pa.int64())).equals(
        pa.array([], type=pa.list_(pa.int64()))
    )


def test_a_watched_run_writes_its_store_without_loading_pandas(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, torch, layerscope
        from layerscope.store import ParquetStore
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        stats = ["min", "max", "hist", {{"rms": lambda t: t.pow(2).mean().sqrt(),
                                  "pair": lambda t: torch.stack([t.min(), t.max()])}}]
        store = ParquetStore({str(tmp_path / "run")!r}, flush_steps=2)
        with layerscope.watch(model, every=1, run=store, stats=stats) as scope:
            for step in range(5):
                model(torch.randn(3, 4)).sum().backward()
                scope.step(loss=float(step))
        # pandas costs 40 MB of resident memory, pyarrow.compute 9 MB
        print(sorted(name for name in sys.modules
                     if name.split(".")[0] == "pandas" or name == "pyarrow.compute"))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

    import layerscope

    run = layerscope.load(tmp_path / "run")
    stats = run.stats
    # steps x (activation and grad of Linear and ReLU; weight, bias and their grads)
    assert len(stats) == 5 * 8
    assert stats["rms"].notna().all()
    assert [list(pair) for pair in stats["pair"]] == stats[["min", "max"]].values.tolist()
    assert run.scalars["value"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
