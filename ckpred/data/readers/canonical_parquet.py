"""Reader of canonical parquet tables (the output of ``ckpred ingest`` or the simulator).

Rows keep their ``source``, ``run_id``, ``repeats``, ``spread`` and invalid reasons; values are
checked again (NaN, negative, zero TFLOPS) except TFLOPS-vs-latency consistency, which was
judged at ingestion against the source's printing precision; rows of another op, arch, dtype or
layout than the config are rejected (never silently mixed). The kernel name is resolved like
in every other reader, so a table merges with fresh measurements of the same kernels.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

# the module, not its names: ckpred.data.mapping imports the readers package, which imports this module
from ckpred.data import mapping as input_mapping
from ckpred.data.readers.common import FileRead, ReadContext, Reject, RowBuffer, to_int
from ckpred.data.table import canonical_columns
from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition

NAME = "parquet"


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one canonical parquet table.

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is not readable parquet or lacks canonical columns of the op.
    """
    op = ctx.op
    columns = _columns(path, op)
    n = len(columns["kernel_name"])
    # Vectorised per column; Python loops run only over rejected or invalid rows.
    reason = np.full(n, "", dtype=object)
    mapping = input_mapping.InputMapping.of_op(op)
    mapped = dict(mapping.columns) if mapping is not None else {}
    per_row = [h for h in input_mapping.ROW_HEADERS if h in mapped and h not in op.problem_names and h in columns]
    _mark_combos(reason, columns, per_row, ctx)
    codes = _kernel_codes(reason, columns, ctx)
    typed: dict[str, np.ndarray] = {}
    if per_row or any(f.kind not in ("int", "bool") for f in op.problem_fields):
        typed = _typed_fields(reason, columns, per_row, op)
    problem = [] if typed else _int_problem(reason, columns, op)
    keep = reason == ""
    rejects = [Reject(f"{ctx.label}:row {i + 1}", reason[i], _row_text(columns, int(i)))
               for i in np.flatnonzero(~keep)]
    if typed:  # an op with text or float problem fields, or per-row headers: rows as a frame
        return FileRead(RowBuffer(op.problem_names), rejects, frame=_frame(columns, np.flatnonzero(keep), codes,
                                                                           typed, per_row, ctx))
    return FileRead(_rows(columns, np.flatnonzero(keep), codes, problem, ctx), rejects)


def _columns(path: Path, op: OpDefinition) -> dict[str, np.ndarray]:
    """Every column of the table at ``path`` as an array; refuses a file that is not readable
    Parquet or lacks a canonical column ``op`` needs."""
    try:
        frame = pq.read_table(path).to_pandas()
        # Materialise every column now: a damaged string column (invalid UTF-8) fails only here.
        columns = {c: frame[c].to_numpy() for c in frame.columns}
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise InputFileError(str(path), f"not a readable parquet file ({type(exc).__name__}: {exc})") from exc
    required = [c for c in ("op", "arch", "dtype", "layout") if c not in op.problem_names]
    required += ["kernel_name", "tflops", "latency_ms", "is_valid"]
    required += [f.name for f in op.problem_fields if f.default is None]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputFileError(str(path), f"not a canonical ckpred table for op {op.name!r}: missing columns "
                                        f"{missing}; a canonical table has {canonical_columns(op)}")
    return columns


def _mark(reason: np.ndarray, bad: np.ndarray, text: Callable[..., str]) -> None:
    """Give each ``bad`` row without a reason yet the reason ``text(row)``."""
    for i in np.flatnonzero(bad & (reason == "")):
        reason[i] = text(int(i))


def _mark_combos(reason: np.ndarray, columns: dict[str, np.ndarray], per_row: list[str], ctx: ReadContext) -> None:
    """Mark the rows of another op, arch, dtype or layout than the config (unless the op makes
    the column a problem field or a per-row header)."""
    op = ctx.op
    for key, expected in (("op", op.name), ("arch", ctx.arch), ("dtype", ctx.dtype), ("layout", ctx.layout)):
        if key in op.problem_names or key in per_row:
            continue  # the row's own value
        column = columns[key]
        _mark(reason, np.asarray(column != expected, dtype=bool),
              lambda i, key=key, column=column, expected=expected:
              f"{key} mismatch: table row says {key}={column[i]}, config has {key}={expected}")


def _kernel_codes(reason: np.ndarray, columns: dict[str, np.ndarray], ctx: ReadContext) -> np.ndarray:
    """Each row's kernel code (-1 and a marked reason where the name does not resolve)."""
    names = columns["kernel_name"]
    name_codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    resolved = [ctx.resolver.resolve(u) for u in uniques]
    code_of = np.array([c if isinstance(c, int) else -1 for c in resolved] + [-1], dtype=np.int64)
    codes = code_of[name_codes]  # factorize marks a missing name -1, which indexes the trailing -1
    _mark(reason, codes < 0, lambda i: str(resolved[name_codes[i]]) if name_codes[i] >= 0
          else f"missing kernel name: got {names[i]!r}")
    return codes


def _typed_fields(reason: np.ndarray, columns: dict[str, np.ndarray], per_row: list[str],
                  op: OpDefinition) -> dict[str, np.ndarray]:
    """The problem fields converted to their kinds (rows with a bad value marked) and the
    per-row headers, for an op with text or float fields or per-row headers."""
    n = len(reason)
    typed: dict[str, np.ndarray] = {}
    for f in op.problem_fields:
        values = pd.Series(columns[f.name] if f.name in columns else [f.default] * n, dtype=object)
        out, ok, allowed = input_mapping._typed(f, values)
        _mark(reason, ~ok, lambda i, f=f, values=values, allowed=allowed:
              f"bad problem field: {f.name}={values.iloc[i]!r} is not {allowed}")
        typed[f.name] = out
    for h in per_row:
        typed[h] = np.asarray(columns[h], dtype=object)
    return typed


def _int_problem(reason: np.ndarray, columns: dict[str, np.ndarray], op: OpDefinition) -> list[np.ndarray]:
    """The integer problem fields (a missing optional one at its default; rows with a value
    that is not an integer marked)."""
    n = len(reason)
    problem = []
    for f in op.problem_fields:
        if f.name not in columns:
            problem.append(np.full(n, int(f.default), dtype=np.int64))
            continue
        ints, ok = _ints(columns[f.name])
        _mark(reason, ~ok, lambda i, name=f.name, column=columns[f.name]:
              f"bad problem field: {name}={column[i]!r} is not an integer")
        problem.append(ints)
    return problem


def _rows(columns: dict[str, np.ndarray], idx: np.ndarray, codes: np.ndarray, problem: list[np.ndarray],
          ctx: ReadContext) -> RowBuffer:
    """The kept rows ``idx`` of an op with integer problem fields, as a row buffer."""
    n = len(codes)
    # The table was checked when it was made, against the precision of its source (a log's
    # latency is quantised to 10 us): TFLOPS vs latency is not re-judged at full precision.
    rows = RowBuffer(ctx.op.problem_names, quantum_ms=math.inf, quantum_tflops=math.inf)
    rows.line = _array("q", idx + 1)
    rows.kernel = _array("q", codes[idx])
    rows.problem = [_array("q", values[idx]) for values in problem]
    rows.tflops = _array("d", _floats(columns["tflops"])[idx])
    rows.latency = _array("d", _floats(columns["latency_ms"])[idx])
    rows.bandwidth = _array("d", _floats(columns["bandwidth_gbs"])[idx] if "bandwidth_gbs" in columns
                            else np.full(len(idx), np.nan))
    rows.spreads = _array("d", _floats(columns["spread"])[idx] if "spread" in columns
                          else np.full(len(idx), np.nan))
    repeats, ok = _ints(columns["repeats"]) if "repeats" in columns else (np.ones(n, np.int64), np.ones(n, bool))
    rows.repeats = _array("q", np.where(ok & (repeats > 0), repeats, 1)[idx])
    labels = f"{ctx.label}:row " + pd.Series(idx + 1).astype(str)
    rows.sources = _strings(columns.get("source"), idx, labels.to_numpy(dtype=object))
    rows.run_ids = _strings(columns.get("run_id"), idx, np.full(len(idx), "", dtype=object))
    valid = np.asarray(columns["is_valid"]).astype(bool)[idx]
    texts = _strings(columns.get("invalid_reason"), idx, np.full(len(idx), "invalid in source table", dtype=object))
    rows.reasons = {int(j): texts[j] for j in np.flatnonzero(~valid)}
    return rows


def _frame(columns: dict[str, np.ndarray], idx: np.ndarray, codes: np.ndarray, typed: dict[str, np.ndarray],
           per_row: list[str], ctx: ReadContext) -> pd.DataFrame:
    """The kept rows as the ingest row frame (text/float problem fields, per-row arch...)."""
    n = len(idx)
    out: dict[str, object] = {name: values[idx] for name, values in typed.items()}
    out["kernel"] = codes[idx]
    out["tflops"] = _floats(columns["tflops"])[idx]
    out["latency_ms"] = _floats(columns["latency_ms"])[idx]
    out["bandwidth_gbs"] = _floats(columns["bandwidth_gbs"])[idx] if "bandwidth_gbs" in columns else np.full(n, np.nan)
    valid = np.asarray(columns["is_valid"]).astype(bool)[idx]
    texts = np.asarray(_strings(columns.get("invalid_reason"), idx, np.full(n, "invalid in source table",
                                                                          dtype=object)), dtype=object)
    out["invalid_reason"] = np.where(valid, "", texts)
    labels = (f"{ctx.label}:row " + pd.Series(idx + 1).astype(str)).to_numpy(dtype=object)
    out["source"] = np.asarray(_strings(columns.get("source"), idx, labels), dtype=object)
    out["run_id"] = np.asarray(_strings(columns.get("run_id"), idx, np.full(n, "", dtype=object)), dtype=object)
    repeats, ok = _ints(columns["repeats"]) if "repeats" in columns else (np.ones(len(codes), np.int64),
                                                                          np.ones(len(codes), bool))
    out["repeats"] = np.where(ok & (repeats > 0), repeats, 1)[idx]
    out["spread"] = _floats(columns["spread"])[idx] if "spread" in columns else np.full(n, np.nan)
    # judged at ingestion against the source's precision (see the module docstring)
    out["quantum_ms"] = np.full(n, math.inf)
    out["quantum_tflops"] = np.full(n, math.inf)
    # a canonical table of an op without FLOPs may hold an unknown latency (NaN) on valid rows
    out["latency_known"] = ~np.isnan(np.asarray(out["latency_ms"], dtype=np.float64)) | ~valid
    return pd.DataFrame(out)


def _array(typecode: str, values: np.ndarray) -> array:
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64 if typecode == "q" else np.float64).tobytes())
    return out


def _ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer values and where they are integers (a column damaged to floats or objects)."""
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int64), np.ones(len(values), dtype=bool)
    parsed = [to_int(v) for v in values]
    ok = np.array([v is not None for v in parsed], dtype=bool)
    return np.array([v if v is not None else 0 for v in parsed], dtype=np.int64), ok


def _strings(values: np.ndarray | None, idx: np.ndarray, fallback: np.ndarray) -> list[str]:
    """``values[idx]`` where it is a non-empty string, else ``fallback``."""
    if values is None:
        return fallback.tolist()
    picked = np.asarray(values, dtype=object)[idx]
    good = np.array([isinstance(v, str) and v != "" for v in picked], dtype=bool)
    return np.where(good, picked, fallback).tolist()


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
