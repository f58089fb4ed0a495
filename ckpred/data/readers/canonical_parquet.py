"""Reader of canonical parquet tables (the output of ``ckpred ingest`` or the simulator).

Rows keep their ``source``, ``run_id`` and ``repeats``; rows of another op, arch, dtype or
layout than the config are rejected (never silently mixed). The kernel name is resolved like
in every other reader, so a table merges with fresh measurements of the same kernels.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ckpred.data.readers.common import FileRead, ReadContext, Reject, RowBuffer, to_int
from ckpred.data.table import canonical_columns
from ckpred.errors import InputFileError

NAME = "parquet"


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one canonical parquet table.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is not readable parquet or lacks canonical columns of the op.
    """
    op = ctx.op
    try:
        frame = pq.read_table(path).to_pandas()
        # Materialise every column now: a damaged string column (invalid UTF-8) fails only here.
        columns = {c: frame[c].to_numpy() for c in frame.columns}
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise InputFileError(str(path), f"not a readable parquet file ({type(exc).__name__}: {exc})") from exc
    required = ["op", "arch", "dtype", "layout", "kernel_name", "tflops", "latency_ms", "is_valid"]
    required += [f.name for f in op.problem_fields if f.default is None]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputFileError(str(path), f"not a canonical ckpred table for op {op.name!r}: missing columns "
                                        f"{missing}; a canonical table has {canonical_columns(op)}")
    rows = RowBuffer(op.problem_names)
    rows.sources, rows.run_ids, rows.repeats, rows.spreads = [], [], array("q"), array("d")
    rejects: list[Reject] = []
    n = len(frame)
    want = {"op": op.name, "arch": ctx.arch, "dtype": ctx.dtype, "layout": ctx.layout}
    problem_cols = []
    for f in op.problem_fields:
        if f.name in columns:
            problem_cols.append(columns[f.name])
        else:
            problem_cols.append(np.full(n, int(f.default), dtype=np.int64))
    tflops = _floats(columns["tflops"])
    latency = _floats(columns["latency_ms"])
    bandwidth = _floats(columns["bandwidth_gbs"]) if "bandwidth_gbs" in columns else np.full(n, np.nan)
    valid = columns["is_valid"]
    reasons = columns.get("invalid_reason")
    sources = columns.get("source")
    run_ids = columns.get("run_id")
    repeats = columns.get("repeats")
    spreads = _floats(columns["spread"]) if "spread" in columns else np.full(n, np.nan)
    for i in range(n):
        label = f"{ctx.label}:row {i + 1}"
        own = str(sources[i]) if sources is not None and isinstance(sources[i], str) and sources[i] else label
        reason = ""
        for key, expected in want.items():
            got = columns[key][i]
            if got != expected:
                reason = f"{key} mismatch: table row says {key}={got}, config has {key}={expected}"
                break
        if not reason:
            code = ctx.resolver.resolve(columns["kernel_name"][i])
            reason = code if isinstance(code, str) else ""
        problem = []
        for name, column in zip(op.problem_names, problem_cols):
            value = to_int(column[i])
            if value is None:
                reason = reason or f"bad problem field: {name}={column[i]!r} is not an integer"
            else:
                problem.append(value)
        if reason:
            rejects.append(Reject(label, reason, _row_text(columns, i)))
            continue
        row_reason = ""
        if not bool(valid[i]):
            text = str(reasons[i]) if reasons is not None and isinstance(reasons[i], str) else ""
            row_reason = text or "invalid in source table"
        rows.add(i + 1, code, problem, tflops[i], latency[i], bandwidth[i], row_reason)  # type: ignore[arg-type]
        rows.sources.append(own)
        rows.run_ids.append(str(run_ids[i]) if run_ids is not None and isinstance(run_ids[i], str) else "")
        rep = repeats[i] if repeats is not None else 1
        rows.repeats.append(int(rep) if isinstance(rep, (int, np.integer)) and rep > 0 else 1)
        rows.spreads.append(spreads[i])
    return FileRead(rows, rejects)


def _floats(values: np.ndarray) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([_float(v) for v in values], dtype=np.float64)


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _row_text(columns: dict[str, np.ndarray], i: int) -> str:
    return ",".join(f"{c}={v[i]}" for c, v in columns.items())
