"""One reader per benchmark output format, and format detection from a file's content.

Record readers (:data:`READERS`) read the CK Tile formats straight into canonical rows; the
kernel fields come from the op's name grammar:

=========  ==========================================================  ==============================
format     what                                                        module
=========  ==========================================================  ==============================
json       tile-engine benchmark JSON (metadata, problem_sizes, results) :mod:`.benchmark_json`
log        streaming benchmark log (shape headers + one JSON per kernel) :mod:`.stream_log`
csv        CK CSV sweeps (``kernel,problem_idx,<problem>,latency_ms,...``) :mod:`.csv_sweep`
parquet    canonical ckpred table                                       :mod:`.canonical_parquet`
=========  ==========================================================  ==============================

Every record reader has the signature ``read(path, ctx) -> FileRead`` and raises only
:class:`ckpred.errors.InputFileError` (for a file it cannot read at all).

Table readers (:data:`TABLE_READERS`) read any other format into its own columns
(:class:`~.common.RawTable`); the op's ``input`` section maps them to canonical rows
(:mod:`ckpred.data.mapping`). A new file format is one module with ``NAME`` and
``read(path, ctx) -> RawTable``, registered here:

============  ==========================================================  =====================
format        what                                                        module
============  ==========================================================  =====================
csv           any CSV/TSV, plain, gzip or bzip2 (``.csv``, ``.csv.gz``)    :mod:`.table_csv`
parquet       any Parquet table                                           :mod:`.table_parquet`
jsonl         JSON lines, one object per line                             :mod:`.table_jsonl`
miopen_fdb    MIOpen find-db text (``*.fdb.txt[.bz2]``)                     :mod:`.miopen_fdb`
kernel_tuner  Kernel Tuner cache JSON (``*.json[.gz]``)                    :mod:`.kernel_tuner`
============  ==========================================================  =====================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

from ckpred.data.readers import (benchmark_json, canonical_parquet, csv_sweep, kernel_tuner, miopen_fdb, stream_log,
                                 table_csv, table_jsonl, table_parquet)
from ckpred.data.readers.common import FileRead, RawTable, ReadContext, read_head
from ckpred.errors import InputFileError

READERS: dict[str, Callable[[Path, ReadContext], FileRead]] = {
    benchmark_json.NAME: benchmark_json.read,
    stream_log.NAME: stream_log.read,
    csv_sweep.NAME: csv_sweep.read,
    canonical_parquet.NAME: canonical_parquet.read,
}
#: Record readers that read a file in blocks of about ``chunk_bytes`` (vectorised; the same rows,
#: reasons and rejects as the reader in :data:`READERS`): ``read_chunks(path, ctx, chunk_bytes)``.
CHUNKED_READERS: dict[str, Callable[[Path, ReadContext, int], Iterator[FileRead]]] = {
    stream_log.NAME: stream_log.read_chunks,
    csv_sweep.NAME: csv_sweep.read_chunks,
}
#: Table readers that read a file in tables of about ``chunk_bytes`` of text each, cut between
#: records: ``read_chunks(path, ctx, chunk_bytes)``. The others read their file whole.
CHUNKED_TABLE_READERS: dict[str, Callable[[Path, ReadContext, int | None], Iterator[RawTable]]] = {
    table_csv.NAME: table_csv.read_chunks,
    table_jsonl.NAME: table_jsonl.read_chunks,
    miopen_fdb.NAME: miopen_fdb.read_chunks,
}
TABLE_READERS: dict[str, Callable[[Path, ReadContext], RawTable]] = {
    table_csv.NAME: table_csv.read,
    table_parquet.NAME: table_parquet.read,
    table_jsonl.NAME: table_jsonl.read,
    miopen_fdb.NAME: miopen_fdb.read,
    kernel_tuner.NAME: kernel_tuner.read,
}
#: Bytes looked at to detect a format.
HEAD_BYTES = 1 << 16
_SHAPE = re.compile(r"^\s*Shape\s+\d+\s*:", re.MULTILINE)
_RULE = re.compile(r"^\s*={5,}\s*$", re.MULTILINE)


def detect_format(path: Path) -> str | None:
    """The format of ``path`` from its content (``None`` for an empty file).

    Raises
    ------
    ckpred.errors.InputFileError
        When the file cannot be opened or its content matches no known format.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from exc
    if head.startswith(b"PAR1"):
        return canonical_parquet.NAME
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    first = lines[0]
    if first.startswith("{") or first.startswith("["):
        # A log row is a one-line object with the kernel's perf_result; the benchmark JSON is
        # one document (usually pretty-printed) starting with its metadata.
        return stream_log.NAME if '"perf_result"' in first else benchmark_json.NAME
    if _SHAPE.search(text) or _RULE.search(text):
        return stream_log.NAME
    fields = {f.strip().strip('"').lower() for f in first.split(",")}
    if csv_sweep.KERNEL_COLUMN in fields and (csv_sweep.TFLOPS_COLUMN in fields
                                              or csv_sweep.LATENCY_COLUMN in fields):
        return csv_sweep.NAME
    raise InputFileError(str(path), f"unknown format: first line {first[:120]!r} looks like none of "
                                    f"{sorted(READERS)} (tile-engine JSON, streaming log with 'Shape i:' "
                                    "headers, CSV with kernel/latency_ms/tflops columns, canonical parquet); "
                                    "set data.format to force a reader")


_EXTENSIONS = {".csv": table_csv.NAME, ".tsv": table_csv.NAME, ".tab": table_csv.NAME,
               ".parquet": table_parquet.NAME, ".pq": table_parquet.NAME, ".jsonl": table_jsonl.NAME,
               ".ndjson": table_jsonl.NAME}
_FDB_LINE = re.compile(r"^\d+(-[0-9x]+)+(-N[A-Z]+)+-[A-Z0-9]+-[FBW](_\w+)?=")


def detect_table_format(path: Path) -> str | None:
    """The table reader of ``path`` (by extension, else by content); ``None`` for an empty file.

    Raises
    ------
    ckpred.errors.InputFileError
        When neither the name nor the content says which table reader fits.
    """
    name = path.name.lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    if ".fdb" in name:
        return miopen_fdb.NAME
    for ext, fmt in _EXTENSIONS.items():
        if name.endswith(ext):
            return fmt
    head = read_head(path, HEAD_BYTES)
    if head.startswith(b"PAR1"):
        return table_parquet.NAME
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if any(f'"{m}"' in text for m in kernel_tuner.MARKERS[:1]):
        return kernel_tuner.NAME
    if lines[0].startswith("{"):
        return table_jsonl.NAME
    if _FDB_LINE.match(lines[0]):
        return miopen_fdb.NAME
    if "," in lines[0] or "\t" in lines[0]:
        return table_csv.NAME
    raise InputFileError(str(path), f"unknown format: first line {lines[0][:120]!r} looks like none of "
                                    f"{sorted(TABLE_READERS)}; set the op's input.format to force a reader")


__all__ = ["CHUNKED_READERS", "CHUNKED_TABLE_READERS", "READERS", "TABLE_READERS", "FileRead", "RawTable", "ReadContext", "detect_format", "detect_table_format"]
