"""What a row of statistics is about, interned once as small integers.

A reading's identity (phase, module, module type, kind, tensor, call) and form (dtype, shape,
shard) are each given a code the first time they are seen; readings, merges and writers carry
the codes, and decode them only where a person or a file needs the values.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from layerscope.model._kinds import Kind

KEY_COLUMNS = ("step", "phase", "rank", "module", "module_type", "kind", "tensor", "call")
META_COLUMNS = ("sentinel", "dtype", "shape", "shard", "numel")
#: What a sentinel row holds besides its keys; its other statistics are missing.
SENTINEL_STATS = ("numel", "min", "max", "absmax")
IDENTITY_COLUMNS = ("phase", "module", "module_type", "kind", "tensor", "call")
FORM_COLUMNS = ("dtype", "shape", "shard")


class Identity(NamedTuple):
    """What a row is about: readings with the same step and identity merge into one row."""

    phase: str
    module: str
    module_type: str
    kind: Kind
    tensor: str
    call: int


class Form(NamedTuple):
    """The dtype and shape of a reading; a merged row shows its first reading's.

    ``shard`` is ``"i/n"`` for this process's shard of a sharded tensor (a DTensor of FSDP2
    or tensor parallelism), whose statistics are of the local shard alone; None otherwise.
    """

    dtype: str
    shape: tuple[int, ...]
    shard: str | None = None

    @property
    def has_histogram(self) -> bool:
        """Floating dtypes have histograms; counts-only dtypes do not."""
        return self.dtype.startswith(("float", "bfloat"))


class _Interned:
    """Values each given a small integer code once.

    The training thread adds values; the writer thread reads those that readings refer to,
    and adds those of rows merged across ranks. Looking up and indexing need no lock; giving
    a new code takes one, so two threads never give the same code to different values.
    """

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {}
        self.rows: list[Any] = []
        self._lock = threading.Lock()

    def code(self, value: Any) -> int:
        """The code of ``value``, given now if it is new."""
        code = self._codes.get(value)
        if code is None:
            with self._lock:
                code = self._codes.get(value)
                if code is None:
                    code = len(self.rows)
                    self.rows.append(value)
                    self._codes[value] = code
        return code


class Identities:
    """The interned identities and forms of a scope's rows.

    ``cache`` holds views that consumers derive from them (such as Arrow arrays).
    """

    def __init__(self) -> None:
        self._identities = _Interned()
        self._forms = _Interned()
        self.cache: dict[str, Any] = {}

    @property
    def identities(self) -> list[Identity]:
        """Every identity, by code."""
        return self._identities.rows

    @property
    def forms(self) -> list[Form]:
        """Every form, by code."""
        return self._forms.rows

    def code(self, identity: Identity) -> int:
        """The code of ``identity``, given now if it is new."""
        return self._identities.code(identity)

    def form_code(self, form: Form) -> int:
        """The code of ``form``, given now if it is new."""
        return self._forms.code(form)
