"""A run's statistics as the DataFrame ``run.stats`` hands over, from their Arrow table.

Histograms are stored trimmed (``hist_lo``, then the counts from there): the frame has each
row's 256 counts, as in memory, in one 2-D array whose rows the cells are. Shapes are tuples,
a whole tensor's ``shard`` None, and the columns in the order the run's configuration names
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.model import KEY_COLUMNS, META_COLUMNS

if TYPE_CHECKING:
    import pandas


def stats_frame(data: Any, meta: dict[str, Any]) -> pandas.DataFrame:
    """The DataFrame of ``data``, a stats table read or merged; ``meta``: the run's run.json."""
    from layerscope.store._arrow import shape_tuples, widened_histograms  # pyarrow: when read

    edges = meta.get("histogram_edges")
    histograms = None
    if edges and "hist" in data.column_names and "hist_lo" in data.column_names:
        histograms = widened_histograms(data["hist_lo"], data["hist"], len(edges))
        data = data.drop_columns(["hist_lo", "hist"])
    frame: pandas.DataFrame = data.to_pandas()
    if histograms is not None:
        frame["hist"] = histograms
    frame["shape"] = shape_tuples(frame["shape"])
    # None for a whole tensor, as in memory; a string column would show NaN.
    frame["shard"] = frame["shard"].astype(object).where(frame["shard"].notna(), None)
    config = meta.get("config", {})
    order = [*KEY_COLUMNS, *META_COLUMNS, *config.get("stats", ()), *config.get("custom_stats", ())]
    known = [name for name in order if name in frame]
    ordered: pandas.DataFrame = frame[known + [name for name in frame if name not in known]]
    return ordered
