"""A rank's place in a run directory: opened as the run starts, moved once the rank is known.

``watch()`` opens the place at once: a claim on it (see ``_claim``), its table directories,
``modules.json``, ``run.json`` (status running) and the reserve beside it. So a run is there,
and says it runs, from its first moment; a place that another process holds, or that cannot
be written (a full disk), is said at ``watch()``, before any training. Where the rank is not
known yet (a process group that comes up after ``watch()``), the root is opened as rank 0's;
if the rank turns out another once rows come, the rank's own place is opened instead and what
was opened at the root goes. On an object store nothing is made before the files: a folder
there is the prefix of the files under it (see ``_objects``).
"""

from __future__ import annotations

import contextlib
import json

from layerscope.store._claim import Claim, check_free, claim_place
from layerscope.store._files import file_names, remove_if_empty, remove_written, write_bytes
from layerscope.store._layout import MODULES_FILE, SEGMENTED_TABLES, next_segment, rank_directory
from layerscope.store._objects import make_directory
from layerscope.store._rank_files import RankFiles
from layerscope.store._run_meta import RunFile, opening_meta
from layerscope.store._temporaries import remove_stale_temporaries


class RankPlaces(RankFiles):
    """Opening, moving and giving up this writer's place; the files themselves: ``RankFiles``."""

    path: str
    name: str
    flush_seconds: float
    _root: str
    _first_segments: dict[str, int]
    _claim: Claim
    _settled: bool  # whether the place is the rank's, the rank fixed

    def _open_place(self, rank: int, world_size: int, *, reserve: bool) -> None:
        """Claim rank ``rank``'s place and make its files; nothing of them stays if that fails.

        Temporaries a killed writer left there go first (no writer of the place lives: it
        would hold the claim).

        Args:
            rank: the rank whose place it is.
            world_size: how many ranks the job has, for ``run.json``.
            reserve: whether a reserve that does not fit fails the opening (as the run
                starts); otherwise the first flush with rows tries again.

        Raises:
            FileExistsError: another process holds the place, or a run is there.
            OSError: the files cannot be written.
        """
        info = self._info
        assert info is not None, "start() first"
        relative = rank_directory(rank)
        place = f"{self._root}/{relative}".rstrip("/")
        made = bool(relative) and not self._fs.exists(place)
        make_directory(self._fs, place)
        claim = claim_place(self._fs, place, self.path)
        segments: dict[str, int] = {}
        try:
            check_free(self._fs, self._root, self.path, relative)
            with contextlib.suppress(OSError):  # they only take space; writing says what fails
                remove_stale_temporaries(self._fs, place)
            for table in SEGMENTED_TABLES:
                if table == "attention" and not info.config.get("attention"):
                    segments[table] = next_segment([])  # a run without: no folder
                    continue
                make_directory(self._fs, f"{place}/{table}")
                segments[table] = next_segment(file_names(self._fs, f"{place}/{table}"))
            meta = opening_meta(
                info,
                name=self.name,
                rank=rank,
                world_size=world_size,
                heartbeat_seconds=self.flush_seconds,
            )
            modules = [module.to_dict() for module in info.modules]
            write_bytes(self._fs, f"{place}/{MODULES_FILE}", json.dumps(modules, indent=1).encode())
            run_file = RunFile(self._fs, place)
            run_file.write(meta)
            try:
                run_file.hold_reserve()
            except OSError:
                if reserve:
                    raise
        except BaseException:
            if segments:  # the place was free: what is in it now is this writer's
                with contextlib.suppress(OSError):
                    remove_written(self._fs, place, segments)
            claim.release()
            if made:
                remove_if_empty(self._fs, place)
            raise
        self._place, self._claim, self._run_file, self._meta = place, claim, run_file, meta
        self._segments, self._first_segments = segments, dict(segments)

    def _settle_rank(self) -> None:
        """Fix the rank; where the run was opened at the root for another rank, move there.

        Raises:
            FileExistsError: the rank's place holds another process's run; nothing of this
                writer's is left at the root, and the next flush with rows tries again.
            OSError: the rank's files cannot be written.
        """
        if self._settled:
            return
        info = self._info
        assert info is not None, "start() first"
        rank, world_size = info.place.fix()
        place = f"{self._root}/{rank_directory(rank)}".rstrip("/")
        if self._place == place:
            self._meta.update(rank=rank, world_size=world_size)
        else:
            self._drop_place()  # opened as rank 0's, and this rank is not: none of it stays
            self._open_place(rank, world_size, reserve=False)
        self._settled = True

    def _drop_place(self) -> None:
        """Remove what this writer wrote in its place and let the place go."""
        if not self._place:
            return
        place, self._place = self._place, ""
        self._release_reserve()
        self._run_file = None
        remove_written(self._fs, place, self._first_segments)
        self._claim.release()
        if place != self._root:
            remove_if_empty(self._fs, place)
