"""Property-based fuzzing of every reader (hypothesis).

Two properties, on mutated copies of valid inputs of every format:

* **only the documented error**: whatever the bytes, reading returns a result or raises
  :class:`ckpred.errors.InputFileError`; a result always accounts for every record
  (valid + invalid + rejected) and is a canonical table that ``write_table`` accepts;
* **nothing of the unmutated part is lost**: when the mutation stays inside one record (a CSV
  or log line, a benchmark object of the JSON, a row of a parquet table), every valid
  measurement of the other records is still a valid row of the table.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpred.data.ingest import IngestResult, read_files
from ckpred.data.table import canonical_columns, write_table
from ckpred.errors import InputFileError
from ckpred.kernels.gemm_universal import OP
from tests import fixtures_gen as fg

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KERNELS = fg.kernel_names(5)
ROWS = fg.measurements(fg.SHAPES[:2], KERNELS)
LOG_ROWS = fg.measurements(fg.SHAPES[:2], KERNELS, decimals=2)
WORK = Path(tempfile.mkdtemp(prefix="ckpred_fuzz_"))  # hypothesis re-runs a test body: no tmp_path
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
Key = tuple[int, int, int, str]


def _read(data: bytes, name: str, fmt: str = "auto") -> IngestResult | None:
    """Read mutated bytes; ``None`` when the reader raised its documented error."""
    path = WORK / name
    path.write_bytes(data)
    try:
        result = read_files(path, OP, arch="gfx950", dtype="fp8", layout="rcr", fmt=fmt)
    except InputFileError:
        return None
    s = result.summary
    assert s.records == s.valid + sum(s.invalid.values()) + sum(s.rejected.values())
    assert list(result.table.columns) == canonical_columns(OP)
    write_table(result.table, WORK / "check.parquet", OP)
    return result


def _valid_keys(result: IngestResult) -> set[Key]:
    t = result.table[result.table["is_valid"]]
    return set(zip(t["m"], t["n"], t["k"], t["kernel_name"]))


# -- building blocks ---------------------------------------------------------------------------
def _lines(data: bytes) -> list[tuple[int, int]]:
    """(start, newline index) of every line of ``data`` (which ends with a newline)."""
    out, start = [], 0
    while start < len(data):
        nl = data.index(b"\n", start)
        out.append((start, nl))
        start = nl + 1
    return out


@st.composite
def _mutation(draw: Any, lo: int, hi: int) -> tuple[int, int, bytes]:
    """Replace ``data[a:b]`` (lo <= a <= b <= hi) by up to 8 random bytes."""
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, min(hi, a + 16)))
    return a, b, draw(st.binary(max_size=8))


def _apply(data: bytes, mutation: tuple[int, int, bytes]) -> bytes:
    a, b, new = mutation
    return data[:a] + new + data[b:]


def _touched(spans: list[tuple[int, int]], a: int, b: int) -> set[int]:
    """Indices of the spans (closed intervals) that the closed mutation range [a, b] meets."""
    return {i for i, (s, e) in enumerate(spans) if s <= b and a <= e}


def _record_mutation_case(data: bytes, spans: list[tuple[int, int]], keys: list[Key | None],
                          mutable: list[int], draw: Any, *, merge_next: list[bool]) -> tuple[bytes, set[Key]]:
    """Mutate inside one record; return the mutated bytes and the keys that must survive."""
    i = draw(st.sampled_from(mutable))
    start, end = spans[i]
    # the record's newline may go too (joining the next line) only when the next line is a record
    hi = end + 1 if merge_next[i] else end
    mutation = draw(_mutation(start, hi))
    touched = _touched(spans, mutation[0], mutation[1])
    survivors = {key for j, key in enumerate(keys) if key is not None and j not in touched}
    return _apply(data, mutation), survivors


# -- CSV ---------------------------------------------------------------------------------------
CSV = ("\n".join(fg.csv_lines(ROWS)) + "\n").encode()


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_csv_mutated_line_loses_no_other_row(data: st.DataObject) -> None:
    spans = _lines(CSV)
    keys: list[Key | None] = [None] + [r.key for r in ROWS]
    mutated, survivors = _record_mutation_case(CSV, spans, keys, list(range(1, len(spans))), data.draw,
                                               merge_next=[True] * len(spans))
    result = _read(mutated, "fuzz.csv", fmt="csv")
    assert result is not None  # the header is intact, so the file is readable
    assert survivors <= _valid_keys(result)


# -- streaming log -----------------------------------------------------------------------------
LOG = ("\n".join(fg.log_lines(LOG_ROWS)) + "\n").encode()


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_log_mutated_row_loses_no_other_row(data: st.DataObject) -> None:
    spans = _lines(LOG)
    lines = LOG.split(b"\n")
    rows = iter(LOG_ROWS)
    keys: list[Key | None] = [next(rows).key if lines[i].startswith(b"{") else None for i in range(len(spans))]
    is_row = [k is not None for k in keys]
    mutable = [i for i, r in enumerate(is_row) if r]
    merge_next = [i + 1 < len(is_row) and is_row[i + 1] for i in range(len(is_row))]
    mutated, survivors = _record_mutation_case(LOG, spans, keys, mutable, data.draw, merge_next=merge_next)
    result = _read(mutated, "fuzz.log", fmt="log")
    assert result is not None
    assert survivors <= _valid_keys(result)


# -- benchmark JSON ----------------------------------------------------------------------------
JSON_TEXT = json.dumps(fg.benchmark_json(ROWS, failed=[(*fg.SHAPES[0], fg.kernel_names(6)[5])]), indent=2)
JSON = JSON_TEXT.encode()


def _benchmark_spans() -> tuple[list[tuple[int, int]], list[Key | None]]:
    decoder = json.JSONDecoder()
    spans, keys = [], []
    pos = 0
    while (pos := JSON_TEXT.find('"kernel_name"', pos)) >= 0:
        start = JSON_TEXT.rindex("{", 0, pos)
        obj, end = decoder.raw_decode(JSON_TEXT, start)
        spans.append((start, end - 1))
        keys.append((obj["m"], obj["n"], obj["k"], obj["kernel_name"]) if obj["is_valid"] else None)
        pos = end
    return spans, keys


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_json_mutated_benchmark_loses_no_other_row(data: st.DataObject) -> None:
    spans, keys = _benchmark_spans()
    i = data.draw(st.integers(0, len(spans) - 1))
    start, end = spans[i]
    mutation = data.draw(_mutation(start, end + 1))
    survivors = {k for j, k in enumerate(keys) if k is not None and j not in _touched(spans, *mutation[:2])}
    result = _read(_apply(JSON, mutation), "fuzz.json", fmt="json")
    assert result is not None
    assert survivors <= _valid_keys(result)


# -- canonical parquet -------------------------------------------------------------------------
BASE_TABLE = read_files(fg.write_csv(WORK / "base.csv", ROWS), OP, arch="gfx950", dtype="fp8", layout="rcr").table
JUNK = st.one_of(st.just(np.nan), st.just(np.inf), st.floats(-1e6, 0), st.just("gfx942"), st.just("not_a_kernel"),
                 st.just(-5), st.just(True), st.text(max_size=5))


@pytest.mark.slow
@SETTINGS
@given(st.integers(0, len(ROWS) - 1), st.sampled_from(["tflops", "latency_ms", "arch", "dtype", "kernel_name",
                                                        "m", "is_valid", "invalid_reason", "source"]), JUNK)
def test_parquet_mutated_row_loses_no_other_row(row: int, column: str, junk: Any) -> None:
    table = BASE_TABLE.astype({column: object})
    table.at[row, column] = junk
    path = WORK / "fuzz.parquet"
    try:
        # A value pyarrow cannot store in the column's type cannot be written at all: nothing to read.
        import pyarrow as pa

        pa.Table.from_pandas(table, preserve_index=False).to_pandas()
        table.to_parquet(path, index=False)
    except (pa.ArrowException, TypeError, ValueError):
        return
    result = _read(path.read_bytes(), "fuzz_row.parquet", fmt="auto")
    assert result is not None
    survivors = {r.key for j, r in enumerate(ROWS) if j != row}
    assert survivors <= _valid_keys(result)


# -- anywhere, any format: only the documented error -------------------------------------------
PARQUET = write_table(BASE_TABLE, WORK / "base.parquet", OP).read_bytes()
SAMPLES = {"csv": CSV, "log": LOG, "json": JSON, "parquet": PARQUET}


@pytest.mark.slow
@SETTINGS
@given(st.sampled_from(sorted(SAMPLES)), st.data(), st.sampled_from(["auto", "own"]))
def test_any_mutation_raises_only_the_documented_error(fmt: str, data: st.DataObject, how: str) -> None:
    sample = SAMPLES[fmt]
    mutations = data.draw(st.lists(_mutation(0, len(sample)), min_size=1, max_size=3))
    mutated = sample
    for a, b, new in mutations:
        a, b = min(a, len(mutated)), min(b, len(mutated))
        mutated = mutated[:a] + new + mutated[b:]
    _read(mutated, f"any.{fmt}", fmt="auto" if how == "auto" else fmt)


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_unmutated_samples_are_fully_valid(fmt: str) -> None:
    """The base of every property: the unmutated input reads completely valid."""
    result = _read(SAMPLES[fmt], f"base.{fmt}")
    assert result is not None
    expected = {r.key for r in (LOG_ROWS if fmt == "log" else ROWS)}
    assert _valid_keys(result) == expected and len(result.rejects) == 0
    assert sum(result.summary.invalid.values()) == (1 if fmt == "json" else 0)  # the failed kernel
