"""The trainer callbacks take ``kinds=`` as ``watch()`` does, and ``capture=``, its old name.

``capture=`` warns once, when the callback is made, with a FutureWarning that points at the
line that made it; the run then records the kinds it named. Both names at once fail at once.
"""

from __future__ import annotations

import importlib
import warnings

import pytest

pytest.importorskip("pandas")

FRAMEWORKS = ["lightning", "transformers"]


def _framework(name, tmp_path):
    """The framework's callback class, and a short training under a callback of it."""
    if name == "lightning":
        pytest.importorskip("lightning")
        fit = importlib.import_module("tests.integration.test_lightning_callback")._fit
        from layerscope.integrations.lightning import LayerscopeCallback

        return LayerscopeCallback, lambda callback: fit([callback])
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    trainer = importlib.import_module("tests.integration.test_transformers_callback")._trainer
    from layerscope.integrations.transformers import LayerscopeCallback as HuggingFaceCallback

    return HuggingFaceCallback, lambda callback: trainer(tmp_path, [callback]).train()


def _renamed(caught):
    return [w for w in caught if "capture=" in str(w.message)]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_kinds_chooses_what_the_callback_records(name, tmp_path):
    callback_class, train = _framework(name, tmp_path)
    callback = callback_class(every=1, run=None, kinds=["weight", "weight_grad"])
    train(callback)
    assert set(callback.scope.frame().kind) == {"weight", "weight_grad"}


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_capture_warns_once_where_the_callback_is_made_and_records_those_kinds(name, tmp_path):
    callback_class, train = _framework(name, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback = callback_class(every=1, run=None, capture=["weight"])
        train(callback)
    (renamed,) = _renamed(caught)
    assert issubclass(renamed.category, FutureWarning)
    assert "kinds=" in str(renamed.message)
    assert renamed.filename == __file__
    assert set(callback.scope.frame().kind) == {"weight"}


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_kinds_and_capture_together_fail_when_the_callback_is_made(name, tmp_path):
    callback_class, _ = _framework(name, tmp_path)
    with pytest.raises(TypeError, match=r"kinds=.*capture="):
        callback_class(kinds=["weight"], capture=["grad"])
