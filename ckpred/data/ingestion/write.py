"""Writing: merged rows as canonical table parts into Parquet (one file, or a directory of parts
with its manifest), and the rejects into a CSV, as they are found."""

from __future__ import annotations

import csv
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckpred.data.ingestion.rows import CARRIER_COLUMNS, Texts, array_of, set_column, source_texts
from ckpred.data.partitions import DATASET_DIR, describe_part, write_manifest
from ckpred.data.readers.common import KernelResolver, Reject
from ckpred.data.table import HEADER_COLUMNS, TABLE_FILE, canonical_schema, conform_arrow
from ckpred.kernels.base import OpDefinition
from ckpred.util import OwnFile, atomic_dir, atomic_path

#: Columns of the rejects: where (``file:line``), why, and the record as read.
REJECT_COLUMNS = ("source", "reason", "raw")


def _is_rejects_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.readline().rstrip(b"\r\n") == ",".join(REJECT_COLUMNS).encode()


#: A rejects CSV (its header line): a write replaces an existing file only when it is one (or empty).
REJECTS_FILE = OwnFile("a rejects CSV", _is_rejects_file)


class RejectsWriter:
    """Rejects into an open CSV file: the header, then each batch as it comes. Every field is
    quoted: a raw line may hold a bare carriage return, which an unquoted field would turn
    into a line break."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        pd.DataFrame(columns=list(REJECT_COLUMNS)).to_csv(fh, index=False)

    def __call__(self, batch: list[Reject]) -> None:
        if batch:
            pd.DataFrame([(r.source, r.reason, r.raw) for r in batch],
                         columns=list(REJECT_COLUMNS)).to_csv(self.fh, index=False, header=False,
                                                              quoting=csv.QUOTE_ALL)


def canonical_part(rows: pa.Table, sources: tuple[np.ndarray, pa.Array], op: OpDefinition,
                    kernels: dict[str, np.ndarray | pa.Array], constants: dict[str, str], texts: Texts) -> pa.Table:
    """Merged rows as a canonical table part (:func:`ckpred.data.table.conform_arrow`).

    The kernel fields come from the rows' kernel codes (:func:`kernel_columns`), the header
    columns the rows do not carry from ``constants``; the text columns are built here, once
    per row: until now rows carried codes and line numbers. ``sources`` are the merged pairs'
    joined sources (:func:`ckpred.data.ingestion.merge.merge`).
    """
    codes = array_of(rows, "kernel")
    columns = {name: by_code(values, codes) for name, values in kernels.items()}
    for name, value in constants.items():
        columns[name] = by_code(pa.array([value]), np.zeros(rows.num_rows, dtype=np.int32))
    columns["source"] = patched(source_texts(rows, texts), *sources)
    columns["invalid_reason"] = texts.take(array_of(rows, "reason"))
    columns["run_id"] = texts.take(array_of(rows, "run"))
    table = rows.drop_columns([c for c in CARRIER_COLUMNS if c in rows.column_names])
    for name, values in columns.items():
        table = set_column(table, name, values)
    return conform_arrow(table, op)


#: Canonical columns written without a Parquet dictionary (their values rarely repeat).
UNIQUE_PER_ROW = frozenset({"source", "tflops", "latency_ms", "bandwidth_gbs", "spread"})


class TableWriter:
    """Canonical table parts into one Parquet file (a row group each) or a directory of parts.

    Nothing is visible at ``out`` until the end: the file is written beside it and renamed,
    the directory of parts is written as a sibling and swapped in with one rename
    (:func:`ckpred.util.atomic_dir`), so a failed or killed run leaves the previous table
    whole, never a mix of old and new parts.
    """

    def __init__(self, out: Path, op: OpDefinition) -> None:
        self.out, self.op = out, op
        self.single = out.suffix == ".parquet"
        self.schema = canonical_schema(op)
        self.parts = 0
        self.entries: list[dict[str, Any]] = []
        self.discarded = False
        # Measured values and sources are (nearly) unique per row: a dictionary page for them
        # is built and thrown away. Min/max statistics serve filters on the problem and its
        # hardware; of the measured values and the texts they would cost a quarter of the write.
        names = self.schema.names
        self.options: dict[str, Any] = {
            "use_dictionary": [c for c in names if c not in UNIQUE_PER_ROW],
            "write_statistics": [c for c in names if c in (*HEADER_COLUMNS, *op.problem_names, "is_valid")],
            # values handed to the encoders per call: fewer calls, the same pages and bytes
            "write_batch_size": 1 << 16}

    def __enter__(self) -> "TableWriter":
        self._atomic: Any = atomic_path(self.out, TABLE_FILE) if self.single else atomic_dir(self.out, DATASET_DIR)
        self.tmp = self._atomic.__enter__()
        self.writer: Any = None
        return self

    def _writer(self, path: Path, schema: pa.Schema) -> Any:
        """A Parquet writer of the canonical table: text columns that arrive dictionary-encoded
        are written as the plain text columns they stand for (no arrow schema is stored, so they
        read back as ``string``); the table's metadata is added at :meth:`_close`."""
        return pq.ParquetWriter(path, schema, store_schema=False, **self.options)

    def _close(self, writer: pq.ParquetWriter) -> None:
        writer.add_key_value_metadata(self.schema.metadata)
        writer.close()

    def write(self, table: pa.Table) -> None:
        """Write one canonical part (:func:`ckpred.data.table.conform_arrow`)."""
        if self.single:
            self.writer = self.writer or self._writer(self.tmp, table.schema)
            self.writer.write_table(table)
        else:
            file = self.tmp / f"part-{self.parts:05d}.parquet"
            writer = self._writer(file, table.schema)
            writer.write_table(table)
            self._close(writer)
            # a part of an op whose dtype (say) is a problem field mixes dtypes: described with
            # null there, the manifest still marks the directory (Dask refuses such a dataset)
            self.entries.append(describe_part(file, table, mixed=True))
        self.parts += 1

    def discard(self) -> None:
        """Leave ``out`` as it was (nothing usable was read)."""
        self.discarded = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.single:  # an input without rows still leaves a table with the schema
            self._close(self.writer or self._writer(self.tmp, self.schema))
        if kind is None and self.discarded:
            kind, exc = Discarded, Discarded()
        if kind is None:
            if not self.single:
                write_manifest(self.tmp, self.op, self.entries)
            self._atomic.__exit__(None, None, None)
            return
        try:
            self._atomic.__exit__(kind, exc, tb)
        except Discarded:
            pass


class Discarded(Exception):
    """Thrown into the atomic writer of a table that is not to be written."""


def by_code(values: np.ndarray | pa.Array, codes: np.ndarray) -> np.ndarray | pa.Array:
    """The per-row column of the per-code ``values``: numbers taken, text dictionary-coded
    (the rows share the texts instead of copying them)."""
    if isinstance(values, np.ndarray):
        return values[codes]
    if isinstance(values, pa.DictionaryArray):  # per code, an index into its distinct texts
        return pa.DictionaryArray.from_arrays(pa.array(values.indices.to_numpy()[codes]), values.dictionary)
    if pa.types.is_string(values.type) and not values.null_count:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), values)
    return values.take(pa.array(codes)) if len(values) else pa.array([], values.type)


def kernel_columns(resolver: KernelResolver, op: OpDefinition) -> dict[str, np.ndarray | pa.Array]:
    """Each kernel field and ``kernel_name`` of every resolved kernel, by code: numbers and
    flags as numpy arrays (a row's value is then one numpy take), text without nulls as a
    dictionary array of its distinct values (a Parquet writer then adds each distinct text to
    its dictionary once, not once per kernel), other text as arrow arrays."""
    kernels = resolver.frame()
    columns: dict[str, np.ndarray | pa.Array] = {}
    for name in (*op.kernel_names, "kernel_name"):
        values = pa.array(kernels[name])
        if pa.types.is_large_string(values.type):  # pandas' text columns: one text type throughout
            values = values.cast(pa.string())
        plain = len(values) and not values.null_count and (pa.types.is_integer(values.type) or pa.types.is_boolean(
            values.type) or pa.types.is_floating(values.type))
        if plain:
            columns[name] = values.to_numpy(zero_copy_only=False)
        elif pa.types.is_string(values.type) and not values.null_count:
            columns[name] = pc.dictionary_encode(values)
        else:
            columns[name] = values
    return columns


def patched(column: Any, at: np.ndarray, values: pa.Array) -> pa.Array:
    """The text ``column`` with the text array ``values`` at the ascending positions ``at``."""
    base = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not len(at):
        return base
    mask = np.zeros(len(base), dtype=bool)
    mask[at] = True
    return pc.replace_with_mask(base.cast(pa.string()), pa.array(mask), values.cast(pa.string()))
