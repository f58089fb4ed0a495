"""Reader of any delimited text table: CSV (``.csv``, ``.csv.gz``, ``.csv.bz2``) or TSV.

The first non-blank line is the header; every later non-blank line is one record. Values stay
text here (the op's ``input`` section types them), so a value that is not a number is named in
its row's reason instead of turning a whole column into strings. Quoted fields follow the
:mod:`csv` rules. A line with another number of fields than the header is rejected with its
line number; a UTF-8 byte-order mark before the header is dropped. Duplicate header names are
kept as they are: the column map refuses to read a duplicated column (it cannot know which one
is meant).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from ckpred.data.readers.common import RawTable, ReadContext, Reject, decode_line, open_binary
from ckpred.errors import InputFileError

NAME = "csv"


def _delimiter(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    return "\t" if name.endswith((".tsv", ".tab")) else ","


def read(path: Path, ctx: ReadContext) -> RawTable:
    """Read one delimited table; see the module docstring.

    Raises
    ------
    ckpred.errors.InputFileError
        When the compressed stream is damaged (the message names the line reached).
    """
    delimiter = _delimiter(path)
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    rejects: list[Reject] = []
    numbered: list[tuple[int, str]] = []

    def text_lines() -> Iterator[str]:
        with open_binary(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                text = decode_line(raw) if lineno == 1 else raw.decode("utf-8", "replace").rstrip("\r\n")
                numbered.append((lineno, text))
                yield text

    try:
        reader = csv.reader(text_lines(), delimiter=delimiter)
        for parts in reader:
            lineno, text = numbered[-1]
            numbered.clear()
            if not parts or all(not p.strip() for p in parts):
                continue
            parts = [p.strip() for p in parts]
            if header is None:
                header = parts
                continue
            if len(parts) != len(header):
                rejects.append(Reject(f"{ctx.label}:{lineno}", f"wrong field count: expected {len(header)} "
                                      f"{'tab' if delimiter == chr(9) else 'comma'}-separated fields, got "
                                      f"{len(parts)}", text))
                continue
            rows.append(parts)
            lines.append(lineno)
    except (OSError, EOFError) as exc:  # a truncated or damaged gzip/bz2 stream
        raise InputFileError(str(path), f"damaged compressed stream after {len(lines)} rows ({exc})") from exc
    except csv.Error as exc:
        raise InputFileError(str(path), f"not a readable CSV ({exc})") from exc
    header = header or []
    columns = {i: [r[i] for r in rows] for i in range(len(header))}
    frame = pd.DataFrame({i: pd.Series(v, dtype=object) for i, v in columns.items()}, index=range(len(rows)))
    frame.columns = header  # set afterwards: duplicate names stay (the column map refuses them)
    sources = np.asarray([f"{ctx.label}:{n}" for n in lines], dtype=object)
    return RawTable(frame, sources, rejects)
