"""The run store: a directory of Parquet tables that DuckDB and pandas read.

``watch(model, run="runs/exp1")`` writes it through a ``ParquetStore``; ``load(path)`` reads
it back as a ``Run``; ``runs(root)`` lists the runs under a folder. Needs
``layerscope[dataframe]``.
"""

from layerscope.store._damage import RunFileError
from layerscope.store._listing import runs
from layerscope.store._reader import Run, load
from layerscope.store._writer import ParquetStore

__all__ = ["ParquetStore", "Run", "RunFileError", "load", "runs"]
