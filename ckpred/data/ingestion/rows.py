"""The rows between the stages of ingestion: arrow tables of numbers.

A chunk of rows carries the op's problem fields, the measured values and
:data:`CARRIER_COLUMNS`: the kernel's code (into the run's kernel resolver), the invalid reason
and run id as codes into the run's :class:`Texts`, and where the row was read (file index and
line). Texts are built once, when a part is written.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpred.data.readers import FileRead
from ckpred.data.readers.common import RowBuffer
from ckpred.kernels.base import OpDefinition

#: Columns of the rows between reading and writing that the canonical table does not have:
#: the kernel's code, the codes of the invalid reason and run id (:class:`Texts`) and where
#: the row was read (the file's index and the line).
CARRIER_COLUMNS = ("kernel", "reason", "run", "file", "line")


class Texts:
    """The texts of one ingestion stored once each (``""`` is code 0); rows carry their codes.

    Reasons and run ids repeat across many rows; coding them keeps the rows numeric until a
    part is written. ``labels`` are the files' names in ``source`` (by file index).
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = list(labels)
        self.values: list[str] = [""]
        self.codes: dict[str, int] = {"": 0}
        self._array: pa.Array | None = None

    def code(self, text: str) -> int:
        """The code of ``text`` (new texts are added)."""
        found = self.codes.get(text)
        if found is None:
            found = self.codes[text] = len(self.values)
            self.values.append(text)
        return found

    def codes_of(self, values: Any) -> np.ndarray:
        """The codes of each text in ``values``, looked up once per distinct text."""
        found, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
        table = np.array([self.code("" if u is None or u != u else str(u)) for u in uniques] or [0], dtype=np.int32)
        return table[found] if len(found) else np.zeros(0, dtype=np.int32)

    def take(self, codes: np.ndarray) -> pa.Array:
        """The texts of ``codes``, dictionary-coded (the texts are distinct: a Parquet writer
        stores them once, without hashing a text per row)."""
        if self._array is None or len(self._array) != len(self.values):
            self._array = pa.array(self.values, pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, dtype=np.int32)), self._array)


def buffer_rows(read: FileRead | None, op: OpDefinition, texts: Texts, file: int, run_id: str) -> pa.Table:
    """One chunk's row buffer as an arrow table (no per-row Python work except reasons).

    Besides the canonical measurement columns: :data:`CARRIER_COLUMNS` and the format's
    printing steps ``quantum_ms``/``quantum_tflops`` (for :func:`_validate`).
    """
    rows = read.rows if read is not None else RowBuffer(op.problem_names)
    n = len(rows)

    def ints(values: Any) -> np.ndarray:  # a view of the buffer: no copy of the big columns
        return np.frombuffer(values, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

    def floats(values: Any) -> np.ndarray:
        return np.frombuffer(values, dtype=np.float64) if n else np.zeros(0)

    columns: dict[str, Any] = {name: ints(values) for name, values in zip(op.problem_names, rows.problem)}
    columns["kernel"] = ints(rows.kernel)
    columns.update(tflops=floats(rows.tflops), latency_ms=floats(rows.latency), bandwidth_gbs=floats(rows.bandwidth))
    reason = np.zeros(n, dtype=np.int32)
    for i, text in rows.reasons.items():
        reason[i] = texts.code(text)
    columns["reason"] = reason
    columns["run"] = (texts.codes_of([r or run_id for r in rows.run_ids]) if rows.run_ids is not None
                      else np.full(n, texts.code(run_id), dtype=np.int32))
    columns["file"] = np.full(n, file, dtype=np.int32)
    columns["line"] = ints(rows.line)
    if rows.sources is not None:  # the reader names each row's source itself
        columns["source"] = pa.array(rows.sources, pa.string())
    columns["repeats"] = ints(rows.repeats) if rows.repeats is not None else np.ones(n, dtype=np.int64)
    columns["spread"] = floats(rows.spreads) if rows.spreads is not None else np.full(n, np.nan)
    columns["quantum_ms"] = np.full(n, rows.quantum_ms)
    columns["quantum_tflops"] = np.full(n, rows.quantum_tflops)
    return pa.table(columns)


def frame_rows(frame: pd.DataFrame, texts: Texts, file: int) -> pa.Table:
    """A table reader's row frame (``invalid_reason``, ``run_id`` and ``source`` as text, or a
    ``line`` number for the source ``<file>:<line>``) as the rows :func:`buffer_rows` gives."""
    n = len(frame)
    coded = {"reason": texts.codes_of(frame["invalid_reason"]) if "invalid_reason" in frame else np.zeros(n, np.int32),
             "run": texts.codes_of(frame["run_id"]) if "run_id" in frame else np.zeros(n, np.int32),
             "file": np.full(n, file, dtype=np.int32),
             "line": frame["line"].to_numpy(np.int64) if "line" in frame else np.zeros(n, dtype=np.int64)}
    table = pa.Table.from_pandas(frame.drop(columns=[c for c in ("invalid_reason", "run_id", "line") if c in frame]),
                                 preserve_index=False)
    # pandas' own string columns arrive as large_string, and an empty object column (every
    # record of the chunk rejected) as null: one text type throughout
    table = table.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type)
                                  or pa.types.is_null(f.type) else f for f in table.schema]))
    for name, values in coded.items():
        table = table.append_column(name, pa.array(values))
    return table


def source_texts(rows: pa.Table, texts: Texts, at: np.ndarray | None = None) -> pa.Array:
    """``source`` of the rows (at the positions ``at``): the reader's own, else ``<file>:<line>``."""
    file, line = array_of(rows, "file"), array_of(rows, "line")
    if at is not None:
        file, line = file[at], line[at]
    names = pa.array([f"{label}:" for label in texts.labels] or [""], pa.string())
    lines = pc.cast(pa.array(line), pa.string())
    if len(file) and file.min() == file.max():  # rows of one file (the usual part): one prefix inserted
        built = pc.binary_replace_slice(lines, start=0, stop=0, replacement=names[int(file[0])].as_py())
    else:
        built = pc.binary_join_element_wise(names.take(pa.array(file)), lines, "")
    if "source" not in rows.column_names:
        return built
    given = rows.column("source").combine_chunks()
    return pc.coalesce(given if at is None else given.take(pa.array(at)), built)


def array_of(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as a numpy array (read-only view when arrow allows; null floats NaN)."""
    column = table.column(name)
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return array.to_numpy(zero_copy_only=False)


def set_column(table: pa.Table, name: str, values: Any) -> pa.Table:
    """``table`` with column ``name`` replaced by (or appended as) ``values``."""
    if isinstance(values, np.ndarray):
        values = pa.array(values)
    at = table.schema.get_field_index(name)
    return table.set_column(at, name, values) if at >= 0 else table.append_column(name, values)


def filled(table: pa.Table, name: str, value: str) -> pa.Table:
    """``table`` with the nulls of text column ``name`` set to ``value`` (the run's own)."""
    column = table.column(name)
    if not pa.types.is_string(column.type):
        column = column.cast(pa.string())
    return set_column(table, name, pc.fill_null(column, value))


def category(reason: str) -> str:
    """The category of a reason (``<category>: <detail>``), what the summary counts."""
    return reason.split(":", 1)[0]


# -- numbering rows by key ------------------------------------------------------------------------
def group_ids(columns: Sequence[Any]) -> np.ndarray:
    """Group number of each row of the key ``columns``, groups numbered by first appearance.

    The same numbering as ``DataFrame.groupby(keys, sort=False, dropna=False).ngroup()``.
    Rows come in runs of one key (a sweep measures every kernel of a problem in a row): when
    the runs are few, only each run's first row is numbered (:func:`combined_group_ids`)
    and its number repeated over the run; otherwise every row is.
    """
    if not len(columns):
        return np.zeros(0, dtype=np.int64)
    columns = [np.asarray(c) for c in columns]
    n = len(columns[0])
    if n >= _RUN_MIN_ROWS:
        new_run = np.zeros(n, dtype=bool)
        new_run[0] = True
        for values in columns:  # a NaN starts a run of its own: runs only need to hold one key
            new_run[1:] |= values[1:] != values[:-1]
        starts = np.flatnonzero(new_run)
        if len(starts) <= n // 8:
            numbers = combined_group_ids([values[starts] for values in columns])
            return np.repeat(numbers, np.diff(np.append(starts, n)))
    return combined_group_ids(columns)


#: Rows below which :func:`group_ids` does not look for runs (it would save little).
_RUN_MIN_ROWS = 4096


def combined_group_ids(columns: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`group_ids` of every row: the columns are combined into one integer code (an
    integer column of a small range by its offset from the minimum, any other by
    ``pd.factorize``), which is factorized once: no group-by machinery over the whole frame,
    one hash pass instead of one per column."""
    gid = np.zeros(len(columns[0]), dtype=np.int64)
    groups = 1
    for values in columns:
        if values.dtype.kind in "iub" and len(values):
            low, high = int(values.min()), int(values.max())
            if low == high:  # one value: no group is split by it
                continue
            width = high - low + 1
            # added in place below; offset first where the sum could leave int64
            codes = values if values.dtype.kind in "ib" and -(1 << 61) < low and high < 1 << 61 \
                else values.astype(np.int64) - low
            low = low if codes is values else 0
        else:
            codes, uniques = pd.factorize(values, use_na_sentinel=False)
            low, width = 0, len(uniques)
        width = max(width, 1)
        if groups * width >= 1 << 62:  # keep the combined code in int64
            gid, uniques_gid = pd.factorize(gid)
            groups = max(len(uniques_gid), 1)
            if groups * width >= 1 << 62:  # a wide integer range: hash it after all
                codes, uniques = pd.factorize(values, use_na_sentinel=False)
                low, width = 0, max(len(uniques), 1)
        # in place (the key columns of a chunk are long): gid = gid * width + codes - low
        gid *= width
        gid += codes
        if low:
            gid -= low
        groups *= width
    return pd.factorize(gid)[0].astype(np.int64, copy=False)


def first_rows(gid: np.ndarray) -> np.ndarray:
    """The first row of each group of :func:`group_ids` (whose groups are numbered by first
    appearance, so a group's first row is where its id exceeds every id before it)."""
    if not len(gid):
        return np.zeros(0, dtype=np.int64)
    seen = np.maximum.accumulate(gid)
    return np.flatnonzero(np.r_[True, seen[1:] > seen[:-1]])
