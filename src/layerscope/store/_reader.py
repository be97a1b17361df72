"""Reading a run: ``load(path)`` gives a ``Run``, its tables as DataFrames and SQL over them.

A run can be read while it is being written: segments appear atomically, and every table
access lists the files anew. A damaged file is skipped with a warning and the rest is read.
The ranks of a distributed job write a directory each inside the run (see ``_layout``); a
``Run`` reads them all as one.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from layerscope.model import ModuleInfo, run_table
from layerscope.store._damage import RunFileError, warn_damaged
from layerscope.store._file_checks import check_modules, check_run_meta, parse_json
from layerscope.store._frame_limit import (
    MAX_FRAME_ROWS,
    check_frame_rows,
    limit_frame,
    merged_within,
)
from layerscope.store._layout import (
    MODULES_FILE,
    RUN_FILE,
    SEGMENTED_TABLES,
    directory_rank,
)
from layerscope.store._merged_sql import merging_inputs
from layerscope.store._objects import is_object_store
from layerscope.store._regular_files import read_bounded
from layerscope.store._run_sql import RunSql
from layerscope.store._segment_checks import SegmentChecks
from layerscope.store._stats_frame import stats_frame
from layerscope.store._status import combine_metas
from layerscope.store._table_files import table_files
from layerscope.store._tables import empty_table, plain_table, read_pieces
from layerscope.store._temporaries import clear_ended_places
from layerscope.store.locations import location_filesystem, run_path

if TYPE_CHECKING:
    import pandas

    from layerscope.plots import RunPlots
    from layerscope.tensors import SavedCapture

TABLES = (*SEGMENTED_TABLES, "calls")
#: Why a file a link leads out of the served folder is not read.
OUTSIDE = "a link to a place outside the served folder: not read"
#: Values bound to a query's placeholders: a list for ``?``, a dict for ``$name``.
Parameters = Sequence[Any] | Mapping[str, Any] | None
RANKS = ("each", "merge")


class Run:
    """A run on disk (or any fsspec filesystem): its tables as DataFrames, and SQL over them.

    Every rank's files are read as one run: the tables hold all ranks' rows, each with its
    ``rank``.

    Attributes:
        path: where the run is.
        meta: the contents of rank 0's ``run.json`` when the run was loaded (the lowest rank's,
            if rank 0 wrote none), with ``ranks``, a summary of each rank's (``rank``,
            ``status``, ``steps``, ``host``, ``pid``, ``updated``), and ``status`` the run's:
            ``"crashed"`` if a rank crashed (a rank still marked running whose process is gone,
            or whose heartbeat stopped), else ``"failed"`` if one failed, ``"running"`` if one
            runs, ``"finished"`` once all finished.
        rank_folders: how many ranks' own folders (``rank-00001``...) the run held when loaded.
        skipped: the files left out so far, path -> why: damaged, of another table, rank
            or program, a copy of another file; and each table folder whose files hold fewer
            rows than ``run.json`` counts as written. It grows as tables are read.

    ``Run(path, within=folder)`` (what the dashboard opens) reads no file whose real
    location, links followed, is outside ``folder``: such files are left out as damaged.
    ``storage_options`` go to the filesystem of a URL; ``max_frame_rows``: see ``load``.

    Raises:
        RunFileError: the run's ``run.json`` is damaged or holds a field of the wrong type.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        ranks: str = "each",
        *,
        within: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        max_frame_rows: int | None = MAX_FRAME_ROWS,
    ) -> None:
        if ranks not in RANKS:
            raise ValueError(f"ranks: expected one of {RANKS}, got {ranks!r}")
        self.ranks = ranks
        self.max_frame_rows = check_frame_rows(max_frame_rows)
        self.path = run_path(path)
        # A path, never a pattern or a chain.
        self._fs, root = location_filesystem(self.path, storage_options=storage_options)
        self._root = root.rstrip("/") or root
        # A server's folder: no file whose real location is outside it is read (a link in a
        # run that points elsewhere is left out, named).
        self._within = None if within is None else os.path.realpath(within)
        if self._fs.isfile(self._root):
            raise NotADirectoryError(f"path: {self.path} is a file, not a run directory")
        self.skipped: dict[str, str] = {}
        self._modules: tuple[bytes, list[ModuleInfo]] | None = None  # modules.json as last read
        metas = self._read_metas() if self._fs.exists(self._root) else {}
        if not metas:
            raise FileNotFoundError(f"path: no run at {self.path} (no {RUN_FILE})")
        self._meta_place = metas[min(metas)][0]
        self.meta: dict[str, Any] = combine_metas(
            {rank: rank_meta for rank, (_, rank_meta) in metas.items()}
        )
        clear_ended_places(self._fs, {rank: place for rank, (place, _) in metas.items()},
                           self.meta["ranks"])  # fmt: skip
        self._segments = SegmentChecks(
            self._fs,
            {place: (rank, rank_meta) for rank, (place, rank_meta) in metas.items()},
            self.outside,
        )
        self._rankless: set[str] = set()  # files written before tables had a rank column
        self._query_places = threading.local()  # the places a listing of every table uses
        self._sql = RunSql(
            self._fs, self._listing, self._empty, self._reject, self._rankless, self._merging
        )

    def __repr__(self) -> str:
        return f"<Run {self.meta.get('name')!r} {self.meta['status']}, {self.path}>"

    def _repr_html_(self) -> str:
        """A notebook's view: status, steps, ranks, layers and alerts."""
        return run_table(self.meta, self.path, lambda: self.modules, lambda: self.alerts)

    def _read_metas(self) -> dict[int, tuple[str, dict[str, Any]]]:
        """Each rank's place and ``run.json``, for the ranks that wrote one.

        The root's ``run.json`` damaged is a RunFileError: there is no run to show without
        it. A rank directory's is left out with a warning, and the rest read.
        """
        metas = {}
        places = self._places()
        self.rank_folders = len(places) - 1  # ranks' own folders, as the run was loaded
        for rank, place in places:
            path = f"{place}/{RUN_FILE}"
            if self.outside(path):
                if place == self._root:
                    raise RunFileError(path, OUTSIDE)
                self._skip(path, OUTSIDE)
                continue
            try:  # a regular file of bounded size: never a FIFO, never /dev/zero
                meta = check_run_meta(path, parse_json(path, read_bounded(self._fs, path)))
            except FileNotFoundError:
                continue
            except PermissionError:  # a rank's folder this user may not read: the rest is read
                if place == self._root:
                    raise
                self._skip(path, "this user may not read it: its rank is left out")
                continue
            except RunFileError as error:
                if place == self._root:
                    raise
                self._skip(path, f"{error.field}: {error.reason}" if error.field else error.reason)
                continue
            metas[meta.get("rank", rank) if place == self._root else rank] = (place, meta)
        return metas

    def outside(self, path: str) -> bool:
        """Whether ``path`` lies, links followed, outside the folder the run is read within."""
        if self._within is None or self._fs.protocol not in ("file", ("file", "local")):
            return False
        real = os.path.realpath(path)
        return real != self._within and not real.startswith(self._within + os.sep)

    def _skip(self, path: str, reason: str) -> None:
        """Leave ``path`` out, with a warning the first time and a line in ``skipped``."""
        if path not in self.skipped:
            self.skipped[path] = warn_damaged(path, reason)

    def _places(self) -> list[tuple[int, str]]:
        """(rank, directory) of the root and of every rank's directory there is now."""
        places = [(0, self._root)]
        for path in self._fs.ls(self._root, detail=False):
            rank = directory_rank(path.rstrip("/").rsplit("/", 1)[-1])
            # On an object store a name listed is a folder or the file it names: no question.
            if rank is not None and (is_object_store(self._fs) or self._fs.isdir(path)):
                places.append((rank, path.rstrip("/")))
        return sorted(places)

    @property
    def modules(self) -> list[ModuleInfo]:
        """The module tree.

        Raises:
            RunFileError: ``modules.json`` is damaged or holds a field of the wrong type.
        """
        path = f"{self._meta_place}/{MODULES_FILE}"
        if self.outside(path):
            raise RunFileError(path, OUTSIDE)
        if self._fs.isdir(path):
            raise RunFileError(path, "a folder where the file should be")
        payload = read_bounded(self._fs, path)
        # Figures and reports ask for the tree many times: the same bytes are checked once.
        if self._modules is None or self._modules[0] != payload:
            self._modules = (payload, check_modules(path, parse_json(path, payload)))
        return list(self._modules[1])

    @property
    def stats(self) -> pandas.DataFrame:
        """One row per step, phase, rank, module, kind, tensor and call.

        Every column of the run's configuration is there, also where no row has a value.
        Loaded with ``ranks="merge"``, the ranks' rows are merged into one row per step,
        phase, module, kind, tensor and call (with ``rank`` 0), as ``watch(ranks="merge")``
        would have written them: the rows of ``run.sql``'s view ``merged_stats``, which DuckDB
        merges from the files.

        Raises:
            FrameTooLargeError: the run holds more rows than ``max_frame_rows``; query the
                rows wanted with ``run.sql`` instead.
        """
        merged = self.ranks == "merge" and len(self.meta["ranks"]) > 1
        return stats_frame(self._merged_table() if merged else self._table("stats"), self.meta)

    @property
    def scalars(self) -> pandas.DataFrame:
        """step, name, value, rank: what ``scope.step(**scalars)`` recorded."""
        return self._frame("scalars")

    @property
    def alerts(self) -> pandas.DataFrame:
        """The health rules' alerts, one row each.

        Columns: step, phase, rule, module, kind, tensor, severity, value, threshold, message,
        rank.
        """
        return self._frame("alerts")

    @property
    def attention(self) -> pandas.DataFrame:
        """Each head of each attention call of recorded steps (``layerscope.model.AttentionRow``).

        Empty for a run that did not record attention (``watch(attention=True)``).
        """
        return self._frame("attention")

    @property
    def tensors(self) -> SavedCapture:
        """The whole tensors the run kept (``watch(tensors=...)``), of rank 0.

        Records in the order written, each with its step; empty if the run kept none. A
        damaged part is left out, named in ``skipped``. Another rank's:
        ``layerscope.load_capture(f"{run.path}/rank-00001/tensors")``. Needs
        ``layerscope[capture]``.
        """
        from layerscope.tensors import DIRECTORY, SavedCapture, read_parts

        records = read_parts(self._fs, f"{self._root}/{DIRECTORY}", skipped=self.skipped)
        return SavedCapture(records, {"tensors": self.meta.get("config", {}).get("tensors")})

    @property
    def plot(self) -> RunPlots:
        """Matplotlib figures of the run: ``run.plot.stats()``, ``run.plot.heatmap()``, ..."""
        from layerscope.plots import RunPlots

        return RunPlots(self)

    @property
    def calls(self) -> pandas.DataFrame:
        """step, seq, event, module, call, rank: every recorded step's call order, of each rank.

        The enter and exit order of the watched modules in each recorded step's first
        training pass, by step and ``seq``. ``calls.parquet`` stores a repeated order once
        (see ``layerscope.store._calls``); this, like the ``calls`` view of ``sql``, has it
        under every step. Runs written before steps were have one order and no ``step``.
        """
        return self._frame("calls")

    def sql(self, query: str, params: Parameters = None) -> pandas.DataFrame:
        """Run a DuckDB query over the tables stats, scalars, alerts, attention and calls.

        Each table holds the rows of every rank; the view ``merged_stats`` has them merged
        (see ``load``'s ``ranks``). Histograms are stored trimmed: ``hist`` holds the counts
        from slot ``hist_lo`` on. The run's database holds 1 GB in memory and spills the rest.

        Args:
            query: the SQL.
            params: values for its ``?`` (a list) or ``$name`` (a dict) placeholders, bound
                by DuckDB: a value from a run or a request never becomes SQL text.

        Example::

            run.sql("select module, max(absmax) from stats where kind = ? group by 1", ["grad"])
        """
        return self._sql.query(query, params)

    # ------------------------------------------------------------------ files

    def _frame(self, table: str) -> pandas.DataFrame:
        frame: pandas.DataFrame = self._table(table).to_pandas()
        return frame

    def _table(self, table: str) -> Any:
        """The table's rows as one Arrow table, once it is clear that they fit in a DataFrame."""
        listed = self._readable(table)  # counted, then read
        limit_frame(table, self._segments.rows(listed), self.max_frame_rows)
        readable = functools.partial(self._readable, table)
        pieces = read_pieces(self._fs, readable, f"{self.path}: {table}", self._reject, listed)
        if table == "calls":  # stored once where repeated: counted again as handed over
            from layerscope.store._calls import expand_orders

            pieces = [expand_orders(piece) for piece in pieces]
            limit_frame(table, sum(piece.num_rows for piece in pieces), self.max_frame_rows)
        return plain_table(pieces, self._empty(table))

    def _merged_table(self) -> Any:
        """The rows of ``merged_stats``, once it is clear that they fit in one DataFrame."""
        stored = self._segments.rows(self._readable("stats"))
        if stored == 0:
            return plain_table([], self._empty("stats"))
        ranks = len(self.meta["ranks"])
        return merged_within(stored, ranks, self.max_frame_rows, self._sql.merged)

    def _merging(self) -> tuple[tuple[str, ...], list[tuple[str, str, list[int]]]]:
        """What ``merged_stats`` needs besides the rows: custom statistics, whole shapes."""
        try:
            modules = self.modules
        except (FileNotFoundError, RunFileError):  # no tree to read: shards keep their shape
            modules = []
        return merging_inputs(self.meta, modules)

    def _listing(self) -> dict[str, list[str]]:
        """Each table's files to read now."""
        # The places listed once for all tables: on an object store, each listing is a request.
        self._query_places.now = self._places()
        try:
            return {table: self._readable(table) for table in TABLES}
        finally:
            self._query_places.now = None

    def _reject(self, path: str, reason: str) -> None:
        """Leave out ``path``, whose pages could not be read: named now, and from now on."""
        self._segments.reject(path, reason)
        self._skip(path, reason)

    def _empty(self, table: str) -> Any:
        return empty_table(table, self.meta)

    def _readable(self, table: str) -> list[str]:
        """Paths of the table's files of every rank; those not to read left out, named.

        Raises:
            FileNotFoundError: a listed file vanished (compacted meanwhile): list again.
        """
        places = getattr(self._query_places, "now", None) or self._places()
        paths, rankless = table_files(self._fs, places, self._segments, table, self._skip)
        self._rankless |= rankless
        return paths


def load(
    path: str | os.PathLike[str],
    ranks: str = "each",
    *,
    storage_options: Mapping[str, Any] | None = None,
    max_frame_rows: int | None = MAX_FRAME_ROWS,
) -> Run:
    """Open a run written by ``layerscope.watch(model, run=path)``, finished or not.

    The files of every rank of a distributed job are read as one run.

    Args:
        path: the run's directory: a local path, taken as it is (``exp[1]`` is no pattern),
            or an fsspec URL (see ``layerscope.store.locations``).
        ranks: ``"each"`` shows every rank's rows; ``"merge"`` merges them in ``run.stats``
            into whole-job rows (activations and gradients of all ranks' data, sharded
            parameters whole), exactly as ``watch(ranks="merge")`` merges while training.
            ``run.sql`` reads the rows as stored either way, and has them merged in the view
            ``merged_stats``.
        storage_options: options of a URL's filesystem, as fsspec takes them (for s3fs:
            ``key``, ``secret``, ``client_kwargs={"endpoint_url": ...}``).
        max_frame_rows: the most rows a table (``run.stats``, ...) hands over as one
            DataFrame; a table holding more raises ``FrameTooLargeError``, saying how many
            rows it holds (a stats row takes about 3.5 KB in pandas). ``None``: no limit.
            ``run.sql`` answers whatever the run's size.

    Returns:
        A ``Run``; its tables are read from disk at each access, so a run still being
        written shows more rows each time.

    Raises:
        TypeError: ``path`` is not a path or URL, or ``storage_options`` not a dict.
        NotADirectoryError: ``path`` is a file.
        FileNotFoundError: no run is there.
        ValueError: a newer layerscope wrote the run, ``ranks`` is not ``"each"`` or
            ``"merge"``, or ``max_frame_rows`` not a positive int.
    """
    return Run(path, ranks, storage_options=storage_options, max_frame_rows=max_frame_rows)
