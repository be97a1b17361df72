"""``layerscope.precision(run, fmt)``: what a low-precision format would lose, per tensor.

It reads the counts every recorded floating tensor's row holds (``{fmt}_over``,
``{fmt}_under``, ``{fmt}_scale_exp``; ``layerscope.stats.FORMATS`` defines them) and adds
their fractions of the tensor's elements. Reading needs no torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from layerscope.model import quote_identifier
from layerscope.stats import format_named

if TYPE_CHECKING:
    import pandas

#: The columns ``precision`` returns, in order.
PRECISION_COLUMNS = (
    "step",
    "phase",
    "rank",
    "module",
    "kind",
    "tensor",
    "call",
    "dtype",
    "numel",
    "overflow",
    "underflow",
    "overflow_frac",
    "underflow_frac",
    "lost_frac",
    "scale_exp",
)
# The dtypes whose rows hold the formats' counts (``float32``, ``bfloat16``, ...).
_FLOATING = ("float", "bfloat")
_KEYS = ("step", "phase", "rank", "module", "kind", "tensor", "call", "dtype", "numel")


def precision(run: Any, fmt: str) -> pandas.DataFrame:
    """What storing each recorded floating tensor in ``fmt`` would lose, one row per reading.

    ``overflow`` counts the finite values with ``|x|`` above the format's largest finite
    value, ``underflow`` the values with ``0 < |x|`` below its smallest subnormal (they would
    flush to zero), both exactly as the kernels counted them, at those limits, in the same
    pass as the other statistics; NaN and Inf are counted apart (``nan_count``,
    ``inf_count``). ``lost_frac`` is their sum over ``numel``. ``scale_exp`` is the largest
    k with ``absmax * 2**k <= max``: the power-of-two scale that would fit the tensor's
    largest magnitude into the format (NaN where absmax is 0 or there is no finite value).
    The sentinel's rows and integer tensors have no counts and are left out.

    Args:
        run: a ``Run`` (``layerscope.load``), a ``Scope``, or the path of a run.
        fmt: ``"e4m3"`` (fp8, max 448, smallest subnormal 2**-9), ``"e5m2"`` (fp8, 57,344;
            2**-16), ``"fp16"`` (65,504; 2**-24) or ``"bf16"`` (about 3.39e38; 2**-133).

    Returns:
        A DataFrame with columns step, phase, rank, module, kind, tensor, call, dtype, numel,
        overflow, underflow, overflow_frac, underflow_frac, lost_frac and scale_exp; with no
        rows where the run has recorded no floating tensor yet.

    Raises:
        ValueError: ``fmt`` is none of the formats, or the run recorded no counts of it
            (``stats=`` left them out, or an older layerscope wrote it).

    Examples:
        >>> import torch, layerscope
        >>> model = torch.nn.Sequential(torch.nn.ReLU())
        >>> x = torch.tensor([1000.0, 0.0, 1e-5, 1.0], requires_grad=True)
        >>> with layerscope.watch(model, every=1) as scope:
        ...     model(x).sum().backward()
        ...     scope.step()
        >>> frame = layerscope.precision(scope, "e4m3")
        >>> frame[frame.kind == "activation"][["numel", "overflow", "underflow", "scale_exp"]]
           numel  overflow  underflow  scale_exp
        0      4         1          1       -2.0
    """
    chosen = format_named(fmt)
    counts = (chosen.over, chosen.under, chosen.scale_exp)
    frame = _stats_frame(run, counts)
    missing = [name for name in counts if name not in frame]
    if missing:
        raise ValueError(
            f"run: it holds no {chosen.label} counts (no column {', '.join(missing)}): it was "
            "recorded with a stats= that left them out, or by a layerscope that did not count them"
        )
    # Rows picked by .loc: ``frame[mask]`` reads an empty mask as no columns, not no rows.
    frame = frame.loc[~frame["sentinel"].astype("boolean").fillna(False).astype(bool)]
    frame = frame.loc[frame["dtype"].map(lambda dtype: str(dtype).startswith(_FLOATING))]
    frame = frame.loc[frame[chosen.over].notna()]
    out = frame[list(_KEYS)].copy()
    numel = frame["numel"].astype("float64")
    numel = numel.where(numel > 0)
    out["overflow"] = frame[chosen.over].astype("int64")
    out["underflow"] = frame[chosen.under].astype("int64")
    out["overflow_frac"] = out["overflow"] / numel
    out["underflow_frac"] = out["underflow"] / numel
    out["lost_frac"] = (out["overflow"] + out["underflow"]) / numel
    out["scale_exp"] = frame[chosen.scale_exp].astype("float64")
    return out.sort_values("step", kind="stable").reset_index(drop=True)


def _stats_frame(run: Any, counts: tuple[str, ...]) -> pandas.DataFrame:
    """``_KEYS``, ``sentinel`` and those of ``counts`` the stats table of ``run`` has.

    Only these names, from the code's own lists, are ever put into SQL: a column a file holds
    under any other name is not read. A key column the table lacks reads as nulls.
    """
    if isinstance(run, str | os.PathLike):
        from layerscope.store._reader import load

        run = load(run)
    wanted = (*_KEYS, "sentinel")
    if hasattr(run, "sql"):  # a stored run, or a scope's run in memory
        present = set(run.sql("select * from stats limit 0").columns)
        selected = [
            quote_identifier(name) if name in present else f"null as {quote_identifier(name)}"
            for name in wanted
        ]
        selected += [quote_identifier(name) for name in counts if name in present]
        frame: pandas.DataFrame = run.sql(f"select {', '.join(selected)} from stats")
        return frame
    if callable(getattr(run, "frame", None)):  # a Scope
        frame = run.frame("stats")
        return frame.reindex(columns=[*wanted, *(name for name in counts if name in frame)])
    raise TypeError(f"run: expected a Run, a Scope or the path of a run, got {run!r}")
