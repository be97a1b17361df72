"""This process's place in a distributed job, and its shard of a distributed tensor.

``ProcessRank`` takes the rank and world size when first needed, never at import;
``local_tensor`` reads a DTensor's local shard with no collective; ``rank_zero_choice`` has
rank 0 choose for every rank. Merging rows across ranks
is the writer's (``layerscope.writer``).
"""

from layerscope.distributed._rank_zero import rank_zero_choice
from layerscope.distributed._ranks import ProcessRank
from layerscope.distributed._shards import local_tensor, shard_label

__all__ = [
    "ProcessRank",
    "local_tensor",
    "rank_zero_choice",
    "shard_label",
]
