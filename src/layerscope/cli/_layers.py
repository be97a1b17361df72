"""Layers in model order: the order of ``run.modules``, which is ``named_modules()``'s."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerscope.store import Run

ROOT = "(root)"  # the model itself, whose name is ""


def module_types(run: Run) -> dict[str, str]:
    """Each module's class name by module name, in model order; empty if no tree was written.

    A run whose ``modules.json`` is missing or damaged still has its rows: its layers are
    then shown in name order (see ``in_model_order``), and a warning names the file. (The
    writer makes ``modules.json`` before any row: a run with rows and none lost it.)
    """
    from layerscope.store import RunFileError, warn_damaged  # imported when a run is read

    try:
        return {module.name: module.type for module in run.modules}
    except FileNotFoundError as error:
        warn_damaged(str(error.filename or "modules.json"), "missing: module types unknown")
        return {}
    except RunFileError as error:
        warn_damaged(error.path, f"{error.field}: {error.reason}" if error.field else error.reason)
        return {}
    except OSError as error:
        warn_damaged(str(error.filename), str(error.strerror))
        return {}


def in_model_order(names: Iterable[str], types: dict[str, str]) -> list[str]:
    """``names`` in the order of ``types`` (model order); names it lacks last, sorted.

    Examples:
        >>> in_model_order(["fc", "conv", "extra"], {"": "Net", "conv": "Conv2d", "fc": "Linear"})
        ['conv', 'fc', 'extra']
    """
    position = {name: index for index, name in enumerate(types)}
    return sorted(set(names), key=lambda name: (position.get(name, len(position)), name))


def shown_name(module: str) -> str:
    """A module's name as the tables show it: the root, whose name is empty, as ``(root)``."""
    return module or ROOT
