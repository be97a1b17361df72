"""Names a package's face imports when first used, so that importing it stays cheap.

Reading a stored run needs no torch: a face whose names would pull torch in (or another
heavy module) lists them here with their homes instead of importing them (PEP 562).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``homes`` on first use.

    Args:
        package: the importing package's ``__name__``.
        homes: each name and the module that defines it; a name whose home is
            ``{package}.{name}`` is that submodule itself.
    """

    def load_on_first_use(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        vars(sys.modules[package])[name] = value  # later lookups skip __getattr__
        return value

    return load_on_first_use
