"""``ranks="merge"``: each flush's rows merged across the ranks of a job into whole-job rows.

Every rank's writer calls ``RankMerge.merge`` at the same flushes (in this mode the writer
flushes every ``flush_steps`` recorded steps, never on a timer) with the rows it finished, also
when it has none, so that the collectives run in lockstep. A flush lays every (step, identity)
the job has out in one order that all ranks agree on, and merges with two packed all-reduces
on a gloo group of layerscope's own: a SUM of the additive partials and histogram counts, and
a MAX of the extremes. Rank 0 writes the merged rows; the others write none.

Means and M2 merge as in ``stats._merge`` (Chan et al.), in sums: each rank adds
``n_i (mean_i - c)`` and ``M2_i + n_i (mean_i - c)**2``, from which ``mean = c + S1 / n`` and
``M2 = S2 - n (mean - c)**2``. The shift ``c`` is the identity's merged mean of the flush
before (the same on every rank, as all of them get the sums), so the subtraction loses
nothing even where the mean is far larger than the spread.

Histograms add up slot by slot; a log2 histogram split by sign (where a sink draws signed
values, ``recording.counted_histogram``) stays split where every rank's is, else the ranks add
their magnitudes.

What merges: forward and backward kinds add up over ranks (each rank saw other data); a
parameter kind adds up only where the rank holds a shard of it (FSDP2), giving statistics of
the whole parameter; a replicated parameter (DDP) is rank 0's. Custom statistics are not
merged (their values are None in merged rows).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from layerscope.model import STATE_KINDS, Form, Identities, Identity
from layerscope.stats import WIDTH, Field, HistogramSpec, Merge
from layerscope.writer._merging import Merged

if TYPE_CHECKING:
    from layerscope._config import WatchConfig
    from layerscope.model import ModuleInfo

# Columns of the SUM collective besides the histogram counts, which follow them.
_SUMMED = tuple(field for field in Field if field.merge is Merge.SUM)  # counts, in row order
_SHIFTED_SUM, _SHIFTED_SQUARES, _PRESENT = range(len(_SUMMED), len(_SUMMED) + 3)
_SUM_WIDTH = len(_SUMMED) + 3
# A flush's agreement (a MAX of 8 integers): any rank with identities not yet laid out; the
# count and sum of its steps, and their negatives, whose maxima equal minus the minima only
# where every rank agrees; the lowest and highest histogram slot holding a count (of either
# sign's half); any rank whose histograms are not split by sign.
# How long a rank waits for the others in a collective before giving merging up.
TIMEOUT = datetime.timedelta(seconds=120)


def rank_merge_for(
    config: WatchConfig, identities: Identities, modules: Sequence[ModuleInfo]
) -> RankMerge | None:
    """A ``RankMerge`` where ``ranks="merge"`` and a process group of several ranks is up.

    Without one there is nothing to merge: a single process's rows are the whole job's.
    """
    if config.ranks != "merge":
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    shapes = {
        (info.name, name): shape for info in modules for name, shape in info.parameters.items()
    }
    return RankMerge(identities, config.histogram, shapes)


class RankMerge:
    """Merges the rows of each flush across ranks, on the writer thread.

    Made on the training thread when the scope starts, where every rank calls ``watch``: that
    is where the group all ranks must create together is made.

    Args:
        identities: the scope's interned identities and forms.
        histogram: the watch's histogram; ``counted`` is the one the recorder counts (the
            writer's ``Pipeline`` sets it: the log2 one split by sign where a sink asks).
        shapes: the whole shape of each ``(module, parameter)``, for merged shards' rows.
    """

    def __init__(
        self,
        identities: Identities,
        histogram: HistogramSpec | None,
        shapes: Mapping[tuple[str, str], tuple[int, ...]],
    ) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group = dist.new_group(backend="gloo", timeout=TIMEOUT)
        self._identities = identities
        self._slots = histogram.slots if histogram is not None else 0  # of a sign's half
        self.counted = histogram
        self._shapes = dict(shapes)
        self._keys: list[Identity] = []  # the agreed order, the same on every rank
        self._index: dict[Identity, int] = {}
        self._forms: list[Form] = []  # of each key: the form its first reporter had
        self._shift = torch.zeros(0, dtype=torch.float64)

    def merge(self, done: Merged | None) -> Merged | None:
        """Every rank's ``done`` rows merged: the whole-job rows on rank 0, None elsewhere."""
        import torch.distributed as dist

        table, forms = self._identities.identities, self._identities.forms
        if done is None:
            keys: list[Identity] = []
            steps = torch.empty(0, dtype=torch.int64)
            local_forms: list[Form] = []
        else:
            keys = [table[code] for code in done.keys[:, 1].tolist()]
            steps = done.keys[:, 0].contiguous()
            local_forms = [forms[code] for code in done.forms.tolist()]
        step_values = torch.unique(steps)
        new = {
            key: form for key, form in zip(keys, local_forms, strict=True) if key not in self._index
        }
        low, high = self._occupied(done)
        own_split = self.counted is not None and self.counted.signed
        header = torch.tensor(
            [bool(new), len(step_values), int(step_values.sum()), -len(step_values), 0, -low, high,
             not own_split],
            dtype=torch.int64,
        )  # fmt: skip
        header[4] = -header[2]
        dist.all_reduce(header, dist.ReduceOp.MAX, group=self._group)
        split = not bool(header[7])  # every rank's rows are split by sign
        if header[0]:
            self._learn(new)
        if header[1] != -header[3] or header[2] != -header[4]:
            step_values = self._all_steps(step_values)
        if len(step_values) == 0 or not self._keys:
            return None
        # Histogram slots from the lowest any rank holds to the highest: a tensor's log2
        # histogram spans a few dozen of the 256, and the collectives carry no others.
        span = slice(int(-header[5]), max(int(header[6]), int(-header[5]) - 1) + 1)
        sums, extremes = self._packed(done, keys, steps, step_values, (span, split))
        dist.all_reduce(sums, dist.ReduceOp.SUM, group=self._group)
        dist.all_reduce(extremes, dist.ReduceOp.MAX, group=self._group)
        return self._merged(sums, extremes, step_values, (span, split))

    def _halves(self, rows: Tensor) -> Tensor:
        """The histogram columns of ``rows`` as ``(rows, halves, slots)``: split by sign or not."""
        halves = (rows.shape[1] - WIDTH) // self._slots if self._slots else 1
        return rows[:, WIDTH:].view(rows.shape[0], halves, self._slots)

    def _histogram_part(self, rows: Tensor, hist: tuple[slice, bool]) -> Tensor:
        """The slots ``span`` of each half side by side where ``split``, else their sum."""
        span, split = hist
        part = self._halves(rows)[:, :, span]
        return part.reshape(rows.shape[0], -1) if split else part.sum(dim=1)

    def _occupied(self, done: Merged | None) -> tuple[int, int]:
        """The first and last histogram slot holding a count in ``done``; (slots, -1) if none."""
        slots = self._slots
        if done is None or slots == 0:
            return slots, -1
        held = torch.nonzero(self._halves(done.rows).any(dim=0).any(dim=0)).flatten()
        if len(held) == 0:
            return slots, -1
        return int(held[0]), int(held[-1])

    def _learn(self, new: dict[Identity, Form]) -> None:
        """Lay out every rank's new identities, in rank order: the same order on every rank."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, list(new.items()), group=self._group)
        for reported in gathered:
            for key, form in reported:
                if key not in self._index:
                    self._index[key] = len(self._keys)
                    self._keys.append(key)
                    self._forms.append(form)
        grown = torch.zeros(len(self._keys), dtype=torch.float64)
        grown[: len(self._shift)] = self._shift
        self._shift = grown

    def _all_steps(self, step_values: Tensor) -> Tensor:
        """The steps any rank has rows of, where the ranks' steps differ."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, step_values.tolist(), group=self._group)
        return torch.tensor(sorted({step for steps in gathered for step in steps}))

    def _packed(
        self,
        done: Merged | None,
        keys: list[Identity],
        steps: Tensor,
        step_values: Tensor,
        hist: tuple[slice, bool],
    ) -> tuple[Tensor, Tensor]:
        """This rank's part of the SUM and of the MAX collective, one row per (step, key).

        ``hist``: the histogram slots carried, of each half where they are split by sign.
        """
        slots = len(step_values) * len(self._keys)
        span, split = hist
        width = _SUM_WIDTH + (span.stop - span.start) * (2 if split else 1)
        sums = torch.zeros(slots, width, dtype=torch.float64)
        extremes = torch.full((slots, 2), -torch.inf, dtype=torch.float64)
        if done is None or not keys:
            return sums, extremes
        key_index = torch.tensor([self._index[key] for key in keys])
        adds = self._adds_up(keys, done)
        if not bool(adds.any()):
            return sums, extremes
        slot = torch.searchsorted(step_values, steps) * len(self._keys) + key_index
        slot, rows = slot[adds], done.rows[adds]
        count, mean = rows[:, Field.COUNT], rows[:, Field.MEAN]
        offset = torch.where(count > 0, mean - self._shift[key_index[adds]], 0.0)
        sums[slot, : len(_SUMMED)] = rows[:, list(_SUMMED)]
        sums[slot, _SHIFTED_SUM] = count * offset
        sums[slot, _SHIFTED_SQUARES] = rows[:, Field.M2] + count * offset**2
        sums[slot, _PRESENT] = 1.0
        sums[slot, _SUM_WIDTH:] = self._histogram_part(rows, hist)
        extremes[slot, 0] = rows[:, Field.MAX]
        extremes[slot, 1] = -rows[:, Field.MIN]
        return sums, extremes

    def _adds_up(self, keys: list[Identity], done: Merged) -> Tensor:
        """Which of this rank's rows go into the sums (see the module's docstring)."""
        if self.rank == 0:
            return torch.ones(len(keys), dtype=torch.bool)
        forms = self._identities.forms
        return torch.tensor(
            [
                key.kind not in STATE_KINDS or forms[code].shard is not None
                for key, code in zip(keys, done.forms.tolist(), strict=True)
            ],
            dtype=torch.bool,
        )

    def _merged(
        self, sums: Tensor, extremes: Tensor, step_values: Tensor, hist: tuple[slice, bool]
    ) -> Merged | None:
        """The merged rows present on some rank, as rank 0's ``Merged``; None elsewhere."""
        count = sums[:, _SUMMED.index(Field.COUNT)]
        present = sums[:, _PRESENT] > 0
        slots = torch.nonzero(present).flatten()
        key_index = slots % len(self._keys)
        shift = self._shift[key_index]
        counted = count[slots]
        offset = torch.where(counted > 0, sums[slots, _SHIFTED_SUM] / counted.clamp(min=1.0), 0.0)
        mean = torch.where(counted > 0, shift + offset, 0.0)
        # The shift of the next flush: each identity's mean at its last step here.
        self._shift[key_index[counted > 0]] = mean[counted > 0]
        if self.rank != 0:
            return None
        span, split = hist
        width = WIDTH + self._slots * (2 if split else 1)
        rows = torch.zeros(len(slots), width, dtype=torch.float64)
        rows[:, list(_SUMMED)] = sums[slots, : len(_SUMMED)]
        rows[:, Field.MEAN] = mean
        m2 = sums[slots, _SHIFTED_SQUARES] - counted * offset**2
        rows[:, Field.M2] = m2.clamp(min=0.0)
        rows[:, Field.MAX] = extremes[slots, 0]
        rows[:, Field.MIN] = -extremes[slots, 1]
        halves = self._halves(rows)
        carried = (len(slots), halves.shape[1], span.stop - span.start)
        halves[:, :, span] = sums[slots, _SUM_WIDTH:].view(carried)
        identities = self._identities
        codes = [identities.code(self._keys[index]) for index in key_index.tolist()]
        forms = [identities.form_code(self._whole_form(index)) for index in key_index.tolist()]
        keys = torch.stack(
            [step_values[slots // len(self._keys)], torch.tensor(codes, dtype=torch.int64)], dim=1
        )
        forms_column = torch.tensor(forms, dtype=torch.int64)
        return Merged(keys=keys, forms=forms_column, rows=rows, custom=None, signed=split)

    def _whole_form(self, index: int) -> Form:
        """The form of a merged row: a shard's becomes its parameter's whole shape."""
        form, key = self._forms[index], self._keys[index]
        if form.shard is None:
            return form
        shape = self._shapes.get((key.module, key.tensor), form.shape)
        return Form(form.dtype, shape, None)
