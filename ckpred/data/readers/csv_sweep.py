"""Reader of CK CSV sweeps: ``kernel,problem_idx,<problem columns>,latency_ms,tflops,non_zero``.

The reader is op-generic: the problem columns are the op's problem fields, matched to the
header case-insensitively (``M,N,K`` for GEMM; ``N,C,K,G,Hi,Wi,...`` for grouped conv), fields
with a default may be absent, and the kernel fields always come from ``op.parse_name(kernel)``.
Other columns (``problem_idx``, ``non_zero``) are ignored. A column the reader needs that
appears twice in the header is refused (the file does not say which one holds the value).

Lines are split on commas by hand rather than with :mod:`csv`: CK writes no quoted fields, and
one stray quote must not swallow the lines after it. :func:`read_chunks` reads blocks of lines
with pyarrow's CSV parser (quoting off, so the same split) into typed columns and leaves every
line it cannot vouch for to the per-line reader :func:`read`'s rules.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from ckpred.data.readers.common import (FileRead, IntColumn, ReadContext, Reject, RowBuffer, line_spans, sorted_rejects, to_float,
                                        to_int)
from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition

NAME = "csv"
KERNEL_COLUMN = "kernel"
LATENCY_COLUMN = "latency_ms"
TFLOPS_COLUMN = "tflops"
#: Bytes pyarrow parses at a time within a block: its parse of a few MB at a time stays in the CPU
#: caches (one parse of a whole 64 MB block is slower, and smaller pieces cost more per piece).
_PARSE_BLOCK_BYTES = 8 << 20


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
    values: list[float] = []
    for column in (TFLOPS_COLUMN, LATENCY_COLUMN):
        pos = index[column]
        number = to_float(parts[pos])  # type: ignore[index]
        if number is None:
            reason = reason or f"non-numeric value: {header[pos]}={parts[pos]!r}"  # type: ignore[index]
            number = math.nan
        values.append(number)
    rows.add(lineno, code, problem, values[0], values[1], math.nan, reason)


def read_chunks(path: Path, ctx: ReadContext, chunk_bytes: int) -> Iterator[FileRead]:
    """Read one CSV sweep in blocks of about ``chunk_bytes`` (whole lines), vectorised.

    A block is parsed by ``pyarrow.csv`` with quoting off and no null values, the kernel
    column as text and the problem and value columns typed; the kernel names are resolved
    once per distinct name. A block pyarrow refuses (a wrong field count, a blank line, a
    value that is not a plain number, bytes that are not UTF-8...) or that parses into another
    number of rows than it has lines is read line by line; a line with a rejected kernel
    name goes to the per-line reader too. Same rows, reasons and rejects as :func:`read`.

    Raises
    ------
    ckpred.errors.InputFileError
        When the header lacks the kernel, latency, TFLOPS or a required problem column.
    """
    op = ctx.op
    with open(path, "rb") as fh:
        lineno = 0
        header: list[str] | None = None
        for raw in fh:  # the header: the first line that is not blank
            lineno += 1
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if text.strip():
                header = _split(text.lstrip("\ufeff"))
                index = _column_index(path, header, ctx)
                break
        if header is None:
            yield FileRead(RowBuffer(op.problem_names), [])
            return
        for block, start, end in line_spans(fh, chunk_bytes):
            read, lines = _read_block(block, start, end, lineno + 1, header, index, ctx)
            yield read
            lineno += lines


def _read_block(block: bytes | bytearray | mmap.mmap, start: int, end: int, first_line: int, header: list[str],
                index: dict[str, int | None], ctx: ReadContext) -> tuple[FileRead, int]:
    """Rows and rejects of the whole lines in ``block[start:end]``, the first being line
    ``first_line``; and the number of those lines."""
    op = ctx.op
    names = [f"c{i}" for i in range(len(header))]
    table = _parse(memoryview(block)[start:end], names, index, op)
    if table is not None and block.find(b"\r", start, end) < 0:
        # Without a carriage return (which pyarrow also ends a line at) every line is one of
        # pyarrow's rows: a blank line has too few fields and fails the parse.
        lines = table.num_rows
    else:
        lines = block[start:end].count(b"\n") + (block[end - 1:end] != b"\n")
    if table is None or table.num_rows != lines:
        return _by_line(block[start:end], first_line, header, index, ctx, range(lines)), lines
    kernel_col = table.column(names[index[KERNEL_COLUMN]]).combine_chunks()  # type: ignore[index]
    codes, uniques = kernel_col.indices.to_numpy(), kernel_col.dictionary.to_pylist()
    resolved = ctx.resolver.resolve_all([u.strip().strip('"').strip() for u in uniques])
    kernel = np.array([c if isinstance(c, int) else -1 for c in resolved], dtype=np.int64)[codes]
    keep = kernel >= 0
    every = bool(keep.all())  # the common case: no row is left to the per-line reader

    def kept(values: np.ndarray) -> np.ndarray:  # arrow's read-only view when every row is kept
        return values if every else values[keep]

    rows = RowBuffer(op.problem_names)
    rows.line = np.arange(first_line, first_line + lines, dtype=np.int64) if every else np.flatnonzero(keep) + first_line
    rows.kernel = kernel if every else kernel[keep]
    problem: list[IntColumn] = []
    reason = np.zeros(len(rows.kernel), dtype=np.int64)  # 1 + i: problem field i is the first negative
    for i, field in enumerate(op.problem_fields):
        pos = index[field.name]
        if pos is None:
            values = np.full(len(reason), int(field.default), dtype=np.int64)
        else:
            values = kept(table.column(names[pos]).to_numpy())
            reason[(reason == 0) & (values < 0)] = i + 1
        problem.append(values)
    rows.problem = problem
    rows.tflops = kept(table.column(names[index[TFLOPS_COLUMN]]).to_numpy())  # type: ignore[index]
    rows.latency = kept(table.column(names[index[LATENCY_COLUMN]]).to_numpy())  # type: ignore[index]
    rows.bandwidth = np.full(len(reason), math.nan)
    for j in np.flatnonzero(reason).tolist():
        i = int(reason[j]) - 1
        rows.reasons[j] = f"negative problem field: {header[index[op.problem_fields[i].name]]}={int(problem[i][j])}"  # type: ignore[index]
    if every:
        return FileRead(rows, []), lines
    rest = _by_line(block[start:end], first_line, header, index, ctx, np.flatnonzero(~keep).tolist())
    return FileRead(RowBuffer.merged([rows, rest.rows]), rest.rejects), lines


def _parse(view: memoryview, names: list[str], index: dict[str, int | None], op: OpDefinition) -> pa.Table | None:
    """The lines of ``view`` parsed by pyarrow into columns ``names`` (the kernel column as
    text, the values and problem fields typed); ``None`` when pyarrow refuses them."""
    types = {names[index[KERNEL_COLUMN]]: pa.dictionary(pa.int32(), pa.string()),  # type: ignore[index]
             names[index[TFLOPS_COLUMN]]: pa.float64(), names[index[LATENCY_COLUMN]]: pa.float64()}  # type: ignore[index]
    for field in op.problem_fields:
        if index[field.name] is not None:
            types[names[index[field.name]]] = pa.int64()  # type: ignore[index]
    try:
        return pcsv.read_csv(
            pa.py_buffer(view),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                          block_size=min(len(view) + 1, _PARSE_BLOCK_BYTES)),
            parse_options=pcsv.ParseOptions(quote_char=False, double_quote=False, escape_char=False,
                                            newlines_in_values=False, ignore_empty_lines=False),
            convert_options=pcsv.ConvertOptions(column_types=types, include_columns=list(types), null_values=[],
                                                strings_can_be_null=False, quoted_strings_can_be_null=False,
                                                check_utf8=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        return None


def _by_line(block: bytes | bytearray, first_line: int, header: list[str], index: dict[str, int | None], ctx: ReadContext,
             which: Iterator[int] | list[int] | range) -> FileRead:
    """The per-line reader on the lines ``which`` (indices into ``block``'s lines)."""
    rows = RowBuffer(ctx.op.problem_names)
    rejects: list[Reject] = []
    lines = block.split(b"\n")
    for i in which:
        text = lines[i].decode("utf-8", "replace").rstrip("\r\n")
        if not text.strip():
            continue
        _read_line(text, first_line + i, header, index, ctx, rows, rejects)
    return FileRead(rows, sorted_rejects(rejects))
