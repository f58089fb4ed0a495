"""Reader of any Parquet table (not a canonical ckpred table: that one has its own reader).

Columns keep their Parquet types (a null is a missing value); rows are named ``file:row n``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ckpred.data.readers.common import RawTable, ReadContext
from ckpred.data.table import is_table_file
from ckpred.errors import InputFileError

NAME = "parquet"


def is_canonical(path: Path) -> bool:
    """Whether ``path`` is a canonical ckpred table (written by ``ckpred ingest`` or the simulator)."""
    return is_table_file(path)


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one Parquet file.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is not readable Parquet.
    """
    try:
        frame = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise InputFileError(str(path), f"not a readable parquet file ({type(exc).__name__}: {exc})") from exc
    sources = np.asarray([f"{ctx.label}:row {i + 1}" for i in range(len(frame))], dtype=object)
    return RawTable(frame.reset_index(drop=True), sources)
