"""Problem-shape sets for the simulator: built from rules in ``conf/shapes/*.yaml`` or read from a CSV.

A shape set is a union of *families*. Each family is a small rule:

* product (default): every ``m`` x every (``n``, ``k``) pair, where the pairs are ``nk`` when
  given, else the product ``n`` x ``k``;
* ``zip: true``: ``m``, ``n`` and ``k`` zipped element-wise (cubes, prime triples...), an empty
  ``n`` or ``k`` meaning "the same as ``m``";

optionally thinned to ``count`` shapes by taking evenly spaced members of the family in
(M, N, K) order, so a large grid can be sampled reproducibly without randomness. Families are
concatenated in the order the YAML lists them; duplicates keep their first position; the set
may be capped at ``max_shapes`` (evenly spaced again). ``shapes=file shapes.path=<csv>`` reads
M, N, K columns (any case) from a CSV instead.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterable, Sequence, TypeVar

import numpy as np
import pandas as pd

from ckpred.errors import InputFileError
from ckpred.schema import ShapesConfig
from ckpred.util import resolve_path

SHAPE_COLUMNS: tuple[str, ...] = ("m", "n", "k")

T = TypeVar("T")


def _evenly(rows: Sequence[T], count: int) -> list[T]:
    """``count`` evenly spaced members of ``rows`` (all of them when count is 0 or too large)."""
    if count <= 0 or count >= len(rows):
        return list(rows)
    idx = np.unique(np.round(np.linspace(0, len(rows) - 1, count)).astype(int))
    return [rows[i] for i in idx]


def family_shapes(family: Any) -> list[tuple[int, int, int]]:
    """The (M, N, K) triples of one family (see the module docstring for the rule)."""
    m = [int(v) for v in family.m]
    if family.zip:
        n = [int(v) for v in family.n] or m
        k = [int(v) for v in family.k] or m
        rows = list(zip(m, n, k))
    else:
        pairs: Iterable[tuple[int, int]]
        if family.nk:
            pairs = [(int(p[0]), int(p[1])) for p in family.nk]
        else:
            pairs = [(int(a), int(b)) for a in family.n for b in family.k]
        pairs = list(pairs)
        rows = [(mm, nn, kk) for mm in m for (nn, kk) in pairs]
    rows = sorted(set(rows))
    return _evenly(rows, int(family.count))


def read_shapes_csv(path: str | Path) -> pd.DataFrame:
    """Read a CSV with M, N, K columns (header names in any case; extra columns ignored).

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is missing, lacks a column, or a value on some line is not a positive
        integer; the message names the file, the line and the bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), "no such file (shapes.path must be a CSV with M,N,K columns)")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise InputFileError(str(path), "empty file; expected a header line with M,N,K") from None
        lower = [h.strip().lower() for h in header]
        missing = [c for c in SHAPE_COLUMNS if c not in lower]
        if missing:
            raise InputFileError(str(path), f"line 1: header {header} lacks column(s) "
                                            f"{[c.upper() for c in missing]}; expected M,N,K")
        cols = [lower.index(c) for c in SHAPE_COLUMNS]
        rows = []
        for line_no, record in enumerate(reader, start=2):
            if not any(cell.strip() for cell in record):
                continue
            values = []
            for name, col in zip(SHAPE_COLUMNS, cols):
                text = record[col].strip() if col < len(record) else ""
                try:
                    value = int(text)
                except ValueError:
                    value = -1
                if value < 1:
                    raise InputFileError(str(path), f"line {line_no}: {name.upper()}={text!r} is not "
                                                    "a positive integer")
                values.append(value)
            rows.append(tuple(values))
    if not rows:
        raise InputFileError(str(path), "no shape rows after the header")
    return _frame(rows)


def _frame(rows: Sequence[tuple[int, ...]]) -> pd.DataFrame:
    seen: dict[tuple[int, ...], None] = {}
    for row in rows:
        seen.setdefault(row, None)
    frame = pd.DataFrame(list(seen), columns=list(SHAPE_COLUMNS)).astype("int64")
    frame["split_k"] = np.int64(1)
    return frame


def load_shapes(shapes_cfg: ShapesConfig) -> pd.DataFrame:
    """The shapes of a ``shapes`` config: a frame with int64 columns ``m, n, k, split_k``.

    Parameters
    ----------
    shapes_cfg
        A composed ``shapes`` group (:class:`ckpred.schema.ShapesConfig`). ``path`` (resolved
        against the original working directory) wins over ``families``.
    """
    if shapes_cfg.path:
        frame = read_shapes_csv(resolve_path(shapes_cfg.path))
    else:
        rows: list[tuple[int, int, int]] = []
        for family in shapes_cfg.families.values():
            rows.extend(family_shapes(family))
        frame = _frame(rows)
    if shapes_cfg.max_shapes and len(frame) > shapes_cfg.max_shapes:
        keep = _evenly(range(len(frame)), int(shapes_cfg.max_shapes))
        frame = frame.iloc[keep].reset_index(drop=True)
    return frame


def unseen_shapes(seen: pd.DataFrame, count: int, seed: int = 1) -> pd.DataFrame:
    """``count`` random GEMM shapes absent from ``seen`` (its ``m, n, k`` columns), for timing
    selection on problems a model never trained on.

    M is log-uniform in [1, 20480]; N and K are multiples of 64 up to 32768, so most catalogue
    kernels are valid for them, and one N in ten gets an odd remainder so the padded paths are
    timed too. Same seed, same shapes.

    Returns
    -------
    pandas.DataFrame
        Columns ``m, n, k, split_k`` (``split_k`` is 1), one row per shape, in draw order.
    """
    rng = np.random.default_rng(seed)
    taken = set(map(tuple, seen[list(SHAPE_COLUMNS)].to_numpy().tolist()))
    out: list[tuple[int, int, int]] = []
    while len(out) < count:
        m = int(np.exp(rng.uniform(0, np.log(20480))))
        n = int(rng.integers(1, 513)) * 64
        k = int(rng.integers(1, 513)) * 64
        if rng.random() < 0.1:
            n += int(rng.integers(1, 64))
        if (m, n, k) not in taken:
            taken.add((m, n, k))
            out.append((m, n, k))
    return pd.DataFrame(out, columns=list(SHAPE_COLUMNS)).assign(split_k=1)
