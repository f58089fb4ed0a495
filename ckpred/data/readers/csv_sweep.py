"""Reader of CK CSV sweeps: ``kernel,problem_idx,<problem columns>,latency_ms,tflops,non_zero``.

The reader is op-generic: the problem columns are the op's problem fields, matched to the
header case-insensitively (``M,N,K`` for GEMM; ``N,C,K,G,Hi,Wi,...`` for grouped conv), fields
with a default may be absent, and the kernel fields always come from ``op.parse_name(kernel)``.
Other columns (``problem_idx``, ``non_zero``) are ignored. A column the reader needs that
appears twice in the header is refused (the file does not say which one holds the value).

Lines are split on commas by hand rather than with :mod:`csv`: CK writes no quoted fields, and
one stray quote must not swallow the lines after it.
"""

from __future__ import annotations

import math
from pathlib import Path

from ckpred.data.readers.common import FileRead, ReadContext, Reject, RowBuffer, to_float, to_int
from ckpred.errors import InputFileError

NAME = "csv"
KERNEL_COLUMN = "kernel"
LATENCY_COLUMN = "latency_ms"
TFLOPS_COLUMN = "tflops"


def _split(text: str) -> list[str]:
    return [part.strip().strip('"').strip() for part in text.split(",")]


def read(path: Path, ctx: ReadContext) -> FileRead:
    """Read one CSV sweep; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the header lacks the kernel, latency, TFLOPS or a required problem column.
    """
    op = ctx.op
    rows = RowBuffer(op.problem_names)
    rejects: list[Reject] = []
    with open(path, "rb") as fh:
        header: list[str] | None = None
        for lineno, raw in enumerate(fh, start=1):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not text.strip():
                continue
            if header is None:
                header = _split(text.lstrip("\ufeff"))
                index = _column_index(path, header, ctx)
                continue
            _read_line(text, lineno, header, index, ctx, rows, rejects)
    return FileRead(rows, rejects)


def _column_index(path: Path, header: list[str], ctx: ReadContext) -> dict[str, int | None]:
    lower: dict[str, int] = {}
    wanted = {KERNEL_COLUMN, LATENCY_COLUMN, TFLOPS_COLUMN, *(f.name.lower() for f in ctx.op.problem_fields)}
    for i, name in enumerate(header):
        if name.lower() in lower and name.lower() in wanted:
            raise InputFileError(str(path), f"CSV header has column {name!r} twice (columns {lower[name.lower()] + 1} "
                                            f"and {i + 1}, matched case-insensitively); which one holds the value "
                                            "is ambiguous, so the file is refused")
        lower.setdefault(name.lower(), i)
    index: dict[str, int | None] = {}
    missing = []
    for column in (KERNEL_COLUMN, LATENCY_COLUMN, TFLOPS_COLUMN):
        if column in lower:
            index[column] = lower[column]
        else:
            missing.append(column)
    for field in ctx.op.problem_fields:
        pos = lower.get(field.name.lower())
        if pos is None and field.default is None:
            missing.append(field.name)
        index[field.name] = pos
    if missing:
        raise InputFileError(str(path), f"CSV header lacks column(s) {missing} (matched case-insensitively); "
                                        f"header is {header}; op {ctx.op.name!r} needs kernel, latency_ms, "
                                        f"tflops and problem columns {list(ctx.op.problem_names)}")
    return index


def _read_line(text: str, lineno: int, header: list[str], index: dict[str, int | None], ctx: ReadContext,
               rows: RowBuffer, rejects: list[Reject]) -> None:
    source = f"{ctx.label}:{lineno}"
    parts = _split(text)
    if len(parts) != len(header):
        rejects.append(Reject(source, f"wrong field count: expected {len(header)} comma-separated fields, "
                                      f"got {len(parts)}", text))
        return
    code = ctx.resolver.resolve(parts[index[KERNEL_COLUMN]])  # type: ignore[index]
    if isinstance(code, str):
        rejects.append(Reject(source, code, text))
        return
    reason = ""
    problem = []
    for field in ctx.op.problem_fields:
        pos = index[field.name]
        if pos is None:
            problem.append(int(field.default))
            continue
        value = to_int(parts[pos])
        if value is None:
            rejects.append(Reject(source, f"bad problem field: {header[pos]}={parts[pos]!r} is not an integer",
                                  text))
            return
        if value < 0 and not reason:
            reason = f"negative problem field: {header[pos]}={value}"
        problem.append(value)
    values = []
    for column in (TFLOPS_COLUMN, LATENCY_COLUMN):
        pos = index[column]
        value = to_float(parts[pos])  # type: ignore[index]
        if value is None:
            reason = reason or f"non-numeric value: {header[pos]}={parts[pos]!r}"  # type: ignore[index]
            value = math.nan
        values.append(value)
    rows.add(lineno, code, problem, values[0], values[1], math.nan, reason)
