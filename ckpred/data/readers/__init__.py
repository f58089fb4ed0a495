"""One reader per benchmark output format, and format detection from a file's content.

=========  ==========================================================  ==============================
format     what                                                        module
=========  ==========================================================  ==============================
json       tile-engine benchmark JSON (metadata, problem_sizes, results) :mod:`.benchmark_json`
log        streaming benchmark log (shape headers + one JSON per kernel) :mod:`.stream_log`
csv        CK CSV sweeps (``kernel,problem_idx,<problem>,latency_ms,...``) :mod:`.csv_sweep`
parquet    canonical ckpred table                                       :mod:`.canonical_parquet`
=========  ==========================================================  ==============================

Every reader has the signature ``read(path, ctx) -> FileRead`` and raises only
:class:`ckpred.errors.InputFileError` (for a file it cannot read at all).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ckpred.data.readers import benchmark_json, canonical_parquet, csv_sweep, stream_log
from ckpred.data.readers.common import FileRead, ReadContext
from ckpred.errors import InputFileError

READERS: dict[str, Callable[[Path, ReadContext], FileRead]] = {
    benchmark_json.NAME: benchmark_json.read,
    stream_log.NAME: stream_log.read,
    csv_sweep.NAME: csv_sweep.read,
    canonical_parquet.NAME: canonical_parquet.read,
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


__all__ = ["READERS", "FileRead", "ReadContext", "detect_format"]
