"""``ranks="merge"`` with the log2 histogram split by sign: two gloo ranks merge their halves.

Each rank holds the rows of its own values; rank 0's merged row must be the split of all the
values, as numpy counts it. Where one rank's rows are not split (its sinks did not ask), the
ranks add magnitudes instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
from tests.stats.stats_reference import log2_reference, signed_log2_reference

# One process per rank: a rank's values, its RankMerge told whether its rows are split, the
# merged row written to a JSON file by rank 0.
CHILD = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    from layerscope.model import Form, Identities, Identity, Kind
    from layerscope.stats import Log2Histogram, SignedLog2Histogram, parse_stats, tensor_partials
    from layerscope.writer._merging import Merged, finalize_merged
    from layerscope.writer._rank_merge import RankMerge

    rank, rendezvous, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2)
    values = torch.tensor(json.loads(sys.argv[4])[rank])
    results = {}
    for case, split in (("both split", (True, True)), ("rank 1 not split", (True, False))):
        identities = Identities()
        merge = RankMerge(identities, Log2Histogram(), {})
        counted = SignedLog2Histogram() if split[rank] else Log2Histogram()
        merge.counted = counted
        row, hist = tensor_partials(values, counted)
        identity = Identity("train", "lin", "Linear", Kind.ACTIVATION, "out", 0)
        done = Merged(
            keys=torch.tensor([[0, identities.code(identity)]]),
            forms=torch.tensor([identities.form_code(Form("float32", tuple(values.shape)))]),
            rows=torch.cat([row, hist.double()])[None],
            custom=None,
            signed=counted.signed,
        )
        merged = merge.merge(done)
        if rank == 0:
            rows = finalize_merged(merged, 0, parse_stats(None), identities)
            negative = None if rows.negative is None else rows.negative[0].tolist()
            results[case] = {"hist": rows.hist[0].tolist(), "negative": negative}
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()
    """
)

VALUES = [
    [-8895.0, -2.0, -0.0, 0.0, 1e-40, 0.25, 3.0, float("-inf")],
    [-1.5, -1.5, -1e-40, 1.0, 2.0, 300.0, float("nan")],
]


def test_the_halves_merge_across_ranks_and_fall_back_to_magnitudes(tmp_path):
    out = tmp_path / "merged.json"
    arguments = [str(tmp_path / "rendezvous"), str(out), json.dumps(VALUES)]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(rank), *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    printed = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], printed
    merged = json.loads(out.read_text())
    values = np.array(VALUES[0] + VALUES[1], dtype=np.float32).astype(np.float64)
    want = signed_log2_reference(values)

    both = merged["both split"]
    assert both["negative"] == want[256:].tolist()
    assert both["hist"] == (want[:256] + want[256:]).tolist()

    fallback = merged["rank 1 not split"]
    assert fallback["negative"] is None
    assert fallback["hist"] == log2_reference(values).tolist()
