"""Reader of MIOpen find-db text files (``*.fdb.txt``, usually bzip2-compressed).

One convolution problem per line, every solver MIOpen timed on it after the ``=``::

    KEY=SOLVER:time_ms,workspace_bytes,algorithm;SOLVER:time_ms,workspace_bytes,algorithm;...

The key (MIOpen's ``conv::ProblemDescription::Serialize``) has ``-``-separated fields: channels,
spatial sizes (``D-H-W`` in 3-D) of the first tensor, the filter ``[ZxY]xX``, channels and
spatial sizes of the second tensor, batch, pads, strides, dilations, bias, the layout (one
name when all three tensors use the default layout, else three), the data type and the
direction ``F`` (forward), ``B`` (backward data) or ``W`` (backward weights); then an optional
``_g<groups>`` and cast-type suffixes (``_ci...``, ``_cw...``, ``_co...``).

The first tensor is the forward input x only for ``F``: for ``B`` and ``W`` the key lists dy
(the forward output) first. This reader swaps them back, so every row describes the forward
convolution: ``c, hi, wi`` are the input x and ``k, ho, wo`` the output y in all three
directions, and one convolution's F, B and W lines share their geometry columns. The number of
spatial dimensions is read from the layout name (``NCHW``/``NHWC`` 2-D, ``NCDHW``/``NDHWC``
3-D) and must agree with the filter; 2-D rows leave the depth columns empty.

One row per (line, solver): ``key`` (the whole key, as written), the geometry, ``layout``,
``dtype``, ``direction``, ``groups``, ``casts`` (the cast suffixes, empty when none),
``spatial_dims``, then ``solver``, ``time_ms``, ``workspace`` and ``algorithm`` as written. A
line without ``=``, or with a key that does not parse, is rejected whole; a solver entry that
does not read ``NAME:time,workspace,algorithm`` is rejected alone. Times are not judged here:
the op's failure encoding decides what a zero or missing time is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from ckpred.data.readers.common import RawTable, ReadContext, Reject, decode_line, open_binary, to_int
from ckpred.errors import InputFileError

NAME = "miopen_fdb"
_LAYOUT = re.compile(r"^N[CDHW]{3,4}$|^N[DHW]{2,3}C$")
#: Columns of the geometry, in output order (depth columns empty for 2-D problems).
GEOMETRY = ("c", "di", "hi", "wi", "k", "do", "ho", "wo", "n", "z", "y", "x", "pad_d", "pad_h", "pad_w",
            "stride_d", "stride_h", "stride_w", "dilation_d", "dilation_h", "dilation_w", "bias")
COLUMNS = ("key", *GEOMETRY, "layout", "dtype", "direction", "groups", "casts", "spatial_dims",
           "solver", "time_ms", "workspace", "algorithm")


class FindDbKeyError(ValueError):
    """A key that does not follow the serialisation (the message says which part)."""


def _int(text: str) -> int | None:
    """A non-negative decimal integer (what every number of a key is), else ``None``."""
    return int(text) if text.isdigit() else to_int(text)


def _dims(text: str, count: int, what: str) -> list[int]:
    parts = text.split("x")
    values = [_int(p) for p in parts]
    if len(parts) != count or any(v is None for v in values):
        raise FindDbKeyError(f"{what} {text!r} is not {count} integers joined by 'x'")
    return values  # type: ignore[return-value]


def parse_key(key: str) -> dict[str, Any]:
    """The forward-view problem of one find-db key (see the module docstring).

    Raises
    ------
    FindDbKeyError
        When the key does not follow the serialisation; the message names the part.
    """
    base, _, suffix = key.partition("_")
    fields = base.split("-")
    if len(fields) < 15:
        raise FindDbKeyError(f"expected at least 15 '-'-separated fields, got {len(fields)}")
    direction, dtype = fields[-1], fields[-2]
    if direction not in ("F", "B", "W"):
        raise FindDbKeyError(f"direction {direction!r} is not F, B or W")
    layout_fields: list[str] = []
    i = len(fields) - 3
    while i >= 0 and _LAYOUT.match(fields[i]):
        layout_fields.insert(0, fields[i])
        i -= 1
    if len(layout_fields) not in (1, 3):
        raise FindDbKeyError(f"expected 1 or 3 layout names before the data type, got {layout_fields}")
    d = len(layout_fields[0]) - 2
    head = fields[:i + 1]
    if len(head) != 8 + 2 * d:
        raise FindDbKeyError(f"a {d}-D key (layout {layout_fields[0]}) has {8 + 2 * d} fields before the layout, "
                        f"got {len(head)}")
    first = [_int(v) for v in head[:1 + d]]
    second = [_int(v) for v in head[2 + d:3 + 2 * d]]
    batch, bias = _int(head[3 + 2 * d]), _int(head[7 + 2 * d])
    if any(v is None for v in (*first, *second, batch, bias)):
        raise FindDbKeyError("a channel, spatial, batch or bias field is not an integer")
    filt = _dims(head[1 + d], d, "filter")
    pads = _dims(head[4 + 2 * d], d, "pads")
    strides = _dims(head[5 + 2 * d], d, "strides")
    dilations = _dims(head[6 + 2 * d], d, "dilations")
    x_side, y_side = (first, second) if direction == "F" else (second, first)
    groups, casts = 1, []
    for part in suffix.split("_") if suffix else []:
        if part.startswith("g") and _int(part[1:]) is not None:
            groups = _int(part[1:])  # type: ignore[assignment]
        elif part[:2] in ("ci", "cw", "co"):
            casts.append(part)
        else:
            raise FindDbKeyError(f"unknown key suffix {part!r} (expected g<groups>, ci..., cw..., co...)")

    def spatial(values: list[Any]) -> list[Any]:
        return ([""] + values) if d == 2 else values

    out: dict[str, Any] = {"key": key}
    out.update(zip(("c", "di", "hi", "wi"), [x_side[0], *spatial(x_side[1:])]))
    out.update(zip(("k", "do", "ho", "wo"), [y_side[0], *spatial(y_side[1:])]))
    out["n"] = batch
    for names, values in ((("z", "y", "x"), filt), (("pad_d", "pad_h", "pad_w"), pads),
                          (("stride_d", "stride_h", "stride_w"), strides),
                          (("dilation_d", "dilation_h", "dilation_w"), dilations)):
        out.update(zip(names, spatial(values)))
    out.update(bias=bias, layout="-".join(layout_fields), dtype=dtype, direction=direction, groups=groups,
               casts="_".join(casts), spatial_dims=d)
    return out


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one find-db file whole; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged.
    """
    (table,) = read_chunks(path, ctx, None)
    return table


def read_chunks(path: Path, ctx: ReadContext, chunk_bytes: int | None) -> Iterator[RawTable]:
    """The rows of one find-db file in tables of about ``chunk_bytes`` bytes of text each
    (``None``: one table), cut between lines (a line is one problem).

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged.
    """
    chunk = _Chunk()
    lineno = consumed = 0
    try:
        with open_binary(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                consumed += len(raw)
                text = decode_line(raw).strip()
                if text:
                    chunk.add(text, ctx.label, lineno)
                if chunk_bytes is not None and consumed - chunk.offset >= chunk_bytes:
                    yield chunk.table(consumed, ctx.label)
                    chunk = _Chunk(consumed)
    except (OSError, EOFError) as exc:
        raise InputFileError(str(path), f"damaged compressed stream after line {lineno} ({exc})") from exc
    yield chunk.table(consumed, ctx.label)


class _Chunk:
    """The rows of the lines of one chunk: a problem per line, a row per solver entry."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # bytes of the file before the chunk
        self.problems: list[dict[str, Any]] = []
        self.problem_lines: list[int] = []
        self.entries: dict[str, list[Any]] = {"line": [], "solver": [], "time_ms": [], "workspace": [],
                                              "algorithm": []}
        self.rejects: list[Reject] = []

    def add(self, text: str, label: str, lineno: int) -> None:
        source = f"{label}:{lineno}"
        key, eq, value = text.partition("=")
        if not eq:
            self.rejects.append(Reject(source, "unrecognised line: no '=' between key and solvers", text))
            return
        try:
            problem = parse_key(key)
        except FindDbKeyError as exc:
            self.rejects.append(Reject(source, f"bad find-db key: {exc}", text))
            return
        at = len(self.problems)
        used = False
        entries = self.entries
        for entry in value.split(";"):
            if not entry:
                continue
            name, colon, rest = entry.partition(":")
            parts = rest.split(",")
            if not colon or not name or len(parts) != 3:
                self.rejects.append(Reject(source, "bad solver entry: expected NAME:time_ms,workspace,"
                                                   f"algorithm, got {entry!r}", text))
                continue
            used = True
            entries["line"].append(at)
            entries["solver"].append(name)
            entries["time_ms"].append(parts[0])
            entries["workspace"].append(parts[1])
            entries["algorithm"].append(parts[2])
        if used:
            self.problems.append(problem)
            self.problem_lines.append(lineno)

    def table(self, consumed: int, label: str) -> RawTable:
        entries = dict(self.entries)
        line = np.asarray(entries.pop("line"), dtype=np.int64)
        by_line = pd.DataFrame.from_records(self.problems, columns=list(COLUMNS[:-4]))
        frame = by_line.take(line).reset_index(drop=True) if len(line) else by_line.iloc[:0]
        for c, v in entries.items():
            frame[c] = pd.Series(v, dtype=object)
        lines = np.asarray(self.problem_lines, dtype=np.int64)[line] if len(line) else np.zeros(0, dtype=np.int64)
        return RawTable(frame, None, self.rejects, input_bytes=consumed - self.offset, lines=lines, label=label)
