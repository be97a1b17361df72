"""Optional packages, imported where they are used, with errors that say what to install."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise an ImportError naming the extra that provides it.

    Examples:
        >>> require("json", "dataframe").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is needed for this; install it with: pip install 'layerscope[{extra}]'"
        ) from error
