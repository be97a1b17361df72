"""The base runs and the classifier the damage tests share: made once a session.

(Not a conftest.py: the conftest modules of other test folders have that name too.)
"""

from __future__ import annotations

from typing import Any

import classify
import corpus

_made: dict[str, classify.Classifier] = {}


def classifier(tmp_path_factory: Any, request: Any) -> classify.Classifier:
    """The session's classifier, its base runs written at the first call; ``request``, a
    session fixture's, closes it at the session's end."""
    if "classifier" not in _made:
        folder = tmp_path_factory.mktemp("damage")
        made = classify.Classifier(corpus.make_bases(folder / "bases"), folder)
        request.addfinalizer(made.close)
        _made["classifier"] = made
    return _made["classifier"]
