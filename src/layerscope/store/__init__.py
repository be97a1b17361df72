"""The run store: a directory of Parquet tables that DuckDB and pandas read.

``watch(model, run="runs/exp1")`` writes it through a ``ParquetStore``; ``load(path)`` reads
it back as a ``Run``; ``runs(root)`` lists the runs under a folder. Needs
``layerscope[dataframe]``; a run on S3, ``layerscope[s3]`` (see ``_objects``), its credentials
and endpoint given as ``storage_options`` to ``ParquetStore``, ``load`` and ``runs``.
"""

from typing import TYPE_CHECKING

from layerscope._lazy import lazy_names
from layerscope.store._calls import expand_orders
from layerscope.store._damage import RunFileError, warn_damaged
from layerscope.store._files import write_bytes
from layerscope.store._frame_limit import MAX_FRAME_ROWS, FrameTooLargeError
from layerscope.store._free_runs import first_free_run
from layerscope.store._layout import RUN_FILE, directory_rank, rank_directory
from layerscope.store._listing import MISSING, UNREADABLE, holds_run, run_folders, run_row, runs
from layerscope.store._precision import PRECISION_COLUMNS, precision
from layerscope.store._reader import Parameters, Run, load

if TYPE_CHECKING:
    from layerscope.store._arrow import (
        alerts_table,
        attention_table,
        calls_table,
        scalars_table,
        stats_schema,
        stats_table,
    )
    from layerscope.store._writer import ParquetStore

# The writer (torch) and the tables of rows (pyarrow) are imported when first used: a reader
# of a stored run needs neither.
__getattr__ = lazy_names(
    __name__,
    {
        "ParquetStore": "layerscope.store._writer",
        **dict.fromkeys(
            (
                "alerts_table",
                "attention_table",
                "calls_table",
                "scalars_table",
                "stats_schema",
                "stats_table",
            ),
            "layerscope.store._arrow",
        ),
    },
)

__all__ = [
    "MAX_FRAME_ROWS",
    "MISSING",
    "PRECISION_COLUMNS",
    "RUN_FILE",
    "UNREADABLE",
    "FrameTooLargeError",
    "Parameters",
    "ParquetStore",
    "Run",
    "RunFileError",
    "alerts_table",
    "attention_table",
    "calls_table",
    "directory_rank",
    "expand_orders",
    "first_free_run",
    "holds_run",
    "load",
    "precision",
    "rank_directory",
    "run_folders",
    "run_row",
    "runs",
    "scalars_table",
    "stats_schema",
    "stats_table",
    "warn_damaged",
    "write_bytes",
]
