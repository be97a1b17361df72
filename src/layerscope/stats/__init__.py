"""Statistics kernels: partials of a tensor, their merge, and their final form.

These are pure functions with no hooks, files or threads:

- ``tensor_partials(x, histogram)`` runs on ``x``'s device with no host sync and returns a
  float64 row of mergeable partials (``Field`` names its columns) and an int64 histogram;
- ``merge`` / ``merge_groups`` combine rows exactly (Chan's formula, float64, host);
- ``finalize`` turns rows into mean, std, min, max, absmax, l2, fractions and counts;
- ``attention_partials`` / ``merge_attention`` / ``finish_attention`` do the same for the
  entropy of an attention call's heads, recomputed from its query and key in chunks.

Examples:
    >>> import torch
    >>> from layerscope import stats
    >>> x = torch.tensor([1.0, 2.0, 3.0, float("inf")])
    >>> row, hist = stats.tensor_partials(x, stats.Log2Histogram())
    >>> out = stats.finalize(row[None])
    >>> out["mean"].item(), out["std"].item(), out["inf_count"].item()
    (2.0, 1.0, 1)
    >>> int(hist[127]), int(hist[128]), int(hist[255])  # [1, 2), [2, 4), non-finite
    (1, 2, 1)
"""

from typing import TYPE_CHECKING

from layerscope._lazy import lazy_names

# What a user computing statistics by hand, or writing a sink or a custom statistic, needs,
# and what the recorder, the writer and the readers of a run take from here.
from layerscope.stats._formats import (
    FORMAT_NAMES,
    FORMATS,
    PRECISION_COUNTS,
    PRECISION_STATS,
    Format,
    format_named,
    scale_exponent,
)
from layerscope.stats._histogram import (
    LOG2_BINS,
    HistogramSpec,
    LinearHistogram,
    Log2Histogram,
    SignedLog2Histogram,
    check_fits,
    log2_bin_edges,
    parse_histogram,
    signed_log2_bin_edges,
)
from layerscope.stats._layout import WIDTH, Field, Merge
from layerscope.stats._selection import (
    BUILTIN_STATS,
    CustomStat,
    StatSelection,
    is_custom_stat_name,
    parse_stats,
)

if TYPE_CHECKING:
    from layerscope.stats._attention import (
        ATTENTION_WIDTH,
        attention_partials,
        chunk_queries,
        finish_attention,
        merge_attention,
        multihead_query_key,
    )
    from layerscope.stats._finalize import finalize
    from layerscope.stats._merge import merge, merge_groups
    from layerscope.stats._partials import (
        group_reads,
        kernel_name,
        tensor_partials,
        write_extremes,
        write_group_extremes,
        write_group_partials,
        write_partials,
    )
    from layerscope.stats._stance import follow_eager_stance, release_eager_stance
    from layerscope.stats._torch_kernels import own_graph_count

# The kernels need torch; a reader of a stored run needs only the names above.
__getattr__ = lazy_names(
    __name__,
    {
        **dict.fromkeys(
            (
                "ATTENTION_WIDTH",
                "attention_partials",
                "chunk_queries",
                "finish_attention",
                "merge_attention",
                "multihead_query_key",
            ),
            "layerscope.stats._attention",
        ),
        "finalize": "layerscope.stats._finalize",
        "merge": "layerscope.stats._merge",
        "merge_groups": "layerscope.stats._merge",
        **dict.fromkeys(
            (
                "group_reads",
                "kernel_name",
                "tensor_partials",
                "write_extremes",
                "write_group_extremes",
                "write_group_partials",
                "write_partials",
            ),
            "layerscope.stats._partials",
        ),
        "follow_eager_stance": "layerscope.stats._stance",
        "release_eager_stance": "layerscope.stats._stance",
        "own_graph_count": "layerscope.stats._torch_kernels",
    },
)

__all__ = [
    "ATTENTION_WIDTH",
    "BUILTIN_STATS",
    "FORMATS",
    "FORMAT_NAMES",
    "LOG2_BINS",
    "PRECISION_COUNTS",
    "PRECISION_STATS",
    "WIDTH",
    "CustomStat",
    "Field",
    "Format",
    "HistogramSpec",
    "LinearHistogram",
    "Log2Histogram",
    "Merge",
    "SignedLog2Histogram",
    "StatSelection",
    "attention_partials",
    "check_fits",
    "chunk_queries",
    "finalize",
    "finish_attention",
    "follow_eager_stance",
    "format_named",
    "group_reads",
    "is_custom_stat_name",
    "kernel_name",
    "log2_bin_edges",
    "merge",
    "merge_attention",
    "merge_groups",
    "multihead_query_key",
    "own_graph_count",
    "parse_histogram",
    "parse_stats",
    "release_eager_stance",
    "scale_exponent",
    "signed_log2_bin_edges",
    "tensor_partials",
    "write_extremes",
    "write_group_extremes",
    "write_group_partials",
    "write_partials",
]
