"""Reader of JSON lines (``.jsonl``, ``.ndjson``, optionally gzip/bz2): one JSON object per line.

Nested objects become dotted columns (``{"perf": {"ms": 1}}`` -> ``perf.ms``). A line that is
not one JSON object is rejected with its line number ("malformed JSON"); blank lines are
skipped; a UTF-8 byte-order mark before the first line is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson
import pandas as pd

from ckpred.data.readers.common import RawTable, ReadContext, Reject, decode_line, open_binary
from ckpred.errors import InputFileError

NAME = "jsonl"


def _loads(raw: bytes) -> tuple[Any, str]:
    try:
        return orjson.loads(raw), ""
    except ValueError:
        try:  # the standard library also takes NaN / Infinity literals
            return json.loads(raw), ""
        except (ValueError, RecursionError) as exc:
            return None, f"malformed JSON: {exc}"


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one JSON-lines file whole; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged.
    """
    (table,) = read_chunks(path, ctx, None)
    return table


def read_chunks(path: Path, ctx: ReadContext, chunk_bytes: int | None) -> Iterator[RawTable]:
    """The records of one JSON-lines file in tables of about ``chunk_bytes`` bytes of text each
    (``None``: one table). Every table has the columns of the whole file, in order of first
    appearance (null where a record lacks the key): when the file is larger than a chunk, its
    keys are collected by a first pass over it.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged.
    """
    chunks = _chunks(path, ctx, chunk_bytes)
    first = next(chunks)
    rest = next(chunks, None)
    if rest is None:  # one chunk: its own keys are the file's
        yield first.table(first.keys)
        return
    keys = _file_keys(path)
    yield first.table(keys)
    yield rest.table(keys)
    for chunk in chunks:
        yield chunk.table(keys)


class _Chunk:
    """The records of one chunk (objects), their lines and the chunk's rejects."""

    def __init__(self, label: str, offset: int) -> None:
        self.label, self.offset, self.consumed = label, offset, offset
        self.records: list[dict[str, Any]] = []
        self.lines: list[int] = []
        self.rejects: list[Reject] = []
        self.keys: dict[str, None] = {}  # the flattened keys of its records, in order of appearance

    def add(self, obj: dict[str, Any], lineno: int) -> None:
        self.records.append(obj)
        self.lines.append(lineno)
        self.keys.update(dict.fromkeys(_flat_keys(obj)))

    def table(self, keys: dict[str, None]) -> RawTable:
        frame = pd.json_normalize(self.records) if self.records else pd.DataFrame()
        frame = frame.reindex(columns=list(keys))
        return RawTable(frame, None, self.rejects, input_bytes=self.consumed - self.offset,
                        lines=np.asarray(self.lines, np.int64), label=self.label)


def _chunks(path: Path, ctx: ReadContext, chunk_bytes: int | None) -> Iterator[_Chunk]:
    """The chunks of one file (at least one, maybe empty)."""
    chunk = _Chunk(ctx.label, 0)
    lineno = 0
    try:
        with open_binary(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                chunk.consumed += len(raw)
                text = decode_line(raw)
                if text.strip():
                    obj, why = _loads(text.encode())
                    if isinstance(obj, dict):
                        chunk.add(obj, lineno)
                    else:
                        chunk.rejects.append(Reject(f"{ctx.label}:{lineno}", why or "malformed JSON: not an object",
                                                    text))
                if chunk_bytes is not None and chunk.consumed - chunk.offset >= chunk_bytes:
                    yield chunk
                    chunk = _Chunk(ctx.label, chunk.consumed)
    except (OSError, EOFError) as exc:
        raise InputFileError(str(path), f"damaged compressed stream after line {lineno} ({exc})") from exc
    yield chunk


def _flat_keys(obj: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """The columns ``pandas.json_normalize`` makes of one object: nested objects' keys dotted
    (an empty one gives none)."""
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flat_keys(value, f"{name}.")
        else:
            yield name


def _file_keys(path: Path) -> dict[str, None]:
    """Every column of the file's objects, in order of first appearance (a first pass)."""
    keys: dict[str, None] = {}
    with open_binary(path) as fh:
        for raw in fh:
            text = decode_line(raw)
            if text.strip():
                obj, _ = _loads(text.encode())
                if isinstance(obj, dict):
                    keys.update(dict.fromkeys(_flat_keys(obj)))
    return keys
