"""Reader of JSON lines (``.jsonl``, ``.ndjson``, optionally gzip/bz2): one JSON object per line.

Nested objects become dotted columns (``{"perf": {"ms": 1}}`` -> ``perf.ms``). A line that is
not one JSON object is rejected with its line number ("malformed JSON"); blank lines are
skipped; a UTF-8 byte-order mark before the first line is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    """Read one JSON-lines file; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged.
    """
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    rejects: list[Reject] = []
    lineno = 0
    try:
        with open_binary(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                text = decode_line(raw)
                if not text.strip():
                    continue
                obj, why = _loads(text.encode())
                if not isinstance(obj, dict):
                    rejects.append(Reject(f"{ctx.label}:{lineno}", why or "malformed JSON: not an object", text))
                    continue
                records.append(obj)
                lines.append(lineno)
    except (OSError, EOFError) as exc:
        raise InputFileError(str(path), f"damaged compressed stream after line {lineno} ({exc})") from exc
    frame = pd.json_normalize(records) if records else pd.DataFrame()
    sources = np.asarray([f"{ctx.label}:{n}" for n in lines], dtype=object)
    return RawTable(frame, sources, rejects)
