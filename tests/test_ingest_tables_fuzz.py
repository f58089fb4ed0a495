"""Property-based fuzzing of the table readers and the input mapping (hypothesis).

The same two properties as for the CK formats (``test_ingest_fuzz.py``), on mutated copies of a
generic CSV, a JSON-lines table, a MIOpen find-db and a Kernel Tuner cache:

* **only the documented error**: whatever the bytes, reading returns a result that accounts for
  every record and is a canonical table, or raises :class:`ckpred.errors.InputFileError`;
* **nothing of the unmutated part is lost**: a mutation inside one line (a CSV or JSON-lines
  record, one find-db problem) leaves every valid row of the other lines in the table.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ckpred.data.ingest import IngestResult, read_files
from ckpred.data.mapping import InputMapping
from ckpred.data.table import canonical_columns, write_table
from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition
from tests.test_ingest_tables import FIXTURES, RENAMES, _frame, _mapping, _TableOp

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORK = Path(tempfile.mkdtemp(prefix="ckpred_table_fuzz_"))  # hypothesis re-runs a test body: no tmp_path
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

TMM = _TableOp()
TMM_MAPPING = _mapping({**RENAMES, "num_warps": "WARPS", "time": "ms"})
CSV = _frame().to_csv(index=False).encode()
JSONL = "".join(json.dumps(r) + "\n" for r in _frame().to_dict("records")).encode()


def _miopen() -> tuple[OpDefinition, InputMapping]:
    """The miopen_conv op of tests/ops, as a user's config dir gives it."""
    from omegaconf import OmegaConf

    from ckpred.kernels.declared import load_declared

    text = (Path(__file__).parent / "ops" / "op" / "miopen_conv.yaml").read_text()
    cfg = {k: v for k, v in OmegaConf.to_container(OmegaConf.create(text)).items() if k != "defaults"}
    op = load_declared(cfg)
    return op, InputMapping.of_op(op)  # type: ignore[return-value]


FDB = b"\n".join(line for line in (FIXTURES / "miopen_small.fdb.txt").read_bytes().splitlines()[:4]) + b"\n"
KT = (FIXTURES / "kernel_tuner_small.json").read_bytes()


def _read(data: bytes, name: str, op: OpDefinition, mapping: InputMapping) -> IngestResult | None:
    """Read mutated bytes; ``None`` when the reader raised its documented error."""
    path = WORK / name
    path.write_bytes(data)
    try:
        result = read_files(path, op, arch="gfx950", dtype="fp16", layout="rcr", mapping=mapping)
    except InputFileError:
        return None
    s = result.summary
    assert s.records == s.valid + sum(s.invalid.values()) + sum(s.rejected.values())
    assert list(result.table.columns) == canonical_columns(op)
    write_table(result.table, WORK / "check.parquet", op)
    return result


@st.composite
def _mutation(draw: Any, lo: int, hi: int) -> tuple[int, int, bytes]:
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, min(hi, a + 16)))
    return a, b, draw(st.binary(max_size=8).filter(lambda x: b"\n" not in x and b"\r" not in x))


def _line_case(data: bytes, draw: Any, first: int) -> tuple[bytes, int]:
    """Mutate inside one line (not its newline) at or after line ``first``; (bytes, line index)."""
    lines = data.split(b"\n")[:-1]
    i = draw(st.integers(first, len(lines) - 1))
    start = sum(len(line) + 1 for line in lines[:i])
    a, b, new = draw(_mutation(start, start + len(lines[i])))
    return data[:a] + new + data[b:], i


def _keys(result: IngestResult, names: list[str]) -> set[tuple]:
    t = result.table[result.table["is_valid"]]
    return set(zip(*(t[n] for n in names)))


@pytest.mark.slow
@SETTINGS
@given(st.data(), st.sampled_from(["csv", "jsonl"]))
def test_a_mutated_record_loses_no_other_row(data: st.DataObject, fmt: str) -> None:
    sample, first = (CSV, 1) if fmt == "csv" else (JSONL, 0)
    base = _read(sample, f"base.{fmt}", TMM, TMM_MAPPING)
    assert base is not None and base.summary.valid == 22
    mutated, line = _line_case(sample, data.draw, first)
    assume(not mutated.startswith((b"\x1f\x8b", b"BZh")))  # then the file is a (damaged) compressed one
    result = _read(mutated, f"fuzz.{fmt}", TMM, TMM_MAPPING)
    assert result is not None
    names = ["m", "n", "k", "dtype", "kernel_name"]
    record = line - first  # the mutated record's row in the frame
    frame = _frame()
    lost = {(r.M, r.N, r.K, r.DTYPE, f"bm{r.BLOCK_M}_bn{r.BLOCK_N}_w{r.WARPS}")
            for r in frame.iloc[[record]].itertuples()}
    assert _keys(base, names) - lost <= _keys(result, names)


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_a_mutated_find_db_line_loses_no_other_problem(data: st.DataObject) -> None:
    op, mapping = _miopen()
    base = _read(FDB, "base.fdb.txt", op, mapping)
    assert base is not None and base.summary.valid == 11
    mutated, line = _line_case(FDB, data.draw, 0)
    assume(not mutated.startswith((b"\x1f\x8b", b"BZh")))
    result = _read(mutated, "fuzz.fdb.txt", op, mapping)
    assert result is not None
    keep = base.table[~base.table["source"].str.endswith(f":{line + 1}") & base.table["is_valid"]]
    names = [*op.problem_names, "kernel_name"]
    assert set(zip(*(keep[n] for n in names))) <= _keys(result, names)


SAMPLES = {"csv": (CSV, "t.csv"), "jsonl": (JSONL, "t.jsonl"), "fdb": (FDB, "t.fdb.txt"), "kt": (KT, "t_W7800.json")}


@pytest.mark.slow
@SETTINGS
@given(st.sampled_from(sorted(SAMPLES)), st.data())
def test_any_mutation_raises_only_the_documented_error(fmt: str, data: st.DataObject) -> None:
    sample, name = SAMPLES[fmt]
    mutations = data.draw(st.lists(_mutation(0, len(sample)), min_size=1, max_size=3))
    mutated = sample
    for a, b, new in mutations:
        a, b = min(a, len(mutated)), min(b, len(mutated))
        mutated = mutated[:a] + new + mutated[b:]
    if fmt in ("csv", "jsonl"):
        _read(mutated, name, TMM, TMM_MAPPING)
    elif fmt == "fdb":
        _read(mutated, name, *_miopen())
    else:
        from ckpred.data.readers import kernel_tuner
        from ckpred.data.readers.common import ReadContext

        path = WORK / name
        path.write_bytes(mutated)
        ctx = ReadContext(op=None, resolver=None, dtype="", layout="", arch="", label=name)  # type: ignore[arg-type]
        try:
            raw = kernel_tuner.read(path, ctx)
        except InputFileError:
            return
        assert len(raw.sources) == len(raw.frame)


# -- chunks: the same table whatever the chunk size --------------------------------------------------
#: Bytes that change how a CSV is split: quotes, carriage returns, blank lines, non-ASCII, controls.
_AWKWARD = st.sampled_from([b'"', b'""', b"\r", b"\n\n", b"\n  \n", b" ", b"\t", "é".encode(), b"\x1f", b",", b"\n"])


@st.composite
def _awkward(draw: Any, sample: bytes) -> bytes:
    out = sample
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(out)))
        out = out[:at] + draw(_AWKWARD) + out[at:]
    return out


def _read_all(data: bytes, name: str, op: OpDefinition, mapping: InputMapping, chunk: int) -> Any:
    path = WORK / name
    path.write_bytes(data)
    try:
        result = read_files(path, op, arch="gfx950", dtype="fp16", layout="rcr", mapping=mapping, chunk_bytes=chunk)
    except InputFileError as exc:
        return str(exc)
    return result.table, result.rejects, result.summary.as_dict()


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, str):
        assert a == b
        return
    assert a[0].equals(b[0]), (a[0], b[0])
    assert a[1].equals(b[1]), (a[1], b[1])
    assert a[2] == b[2]


@pytest.mark.slow
@SETTINGS
@given(st.sampled_from(["csv", "jsonl", "fdb"]), st.data(), st.integers(1, 200), st.integers(1, 64))
def test_chunks_and_blocks_of_any_size_read_the_whole_files_table(fmt: str, data: st.DataObject, chunk: int,
                                                                  block: int) -> None:
    """Tables read in chunks of ``chunk`` bytes (pyarrow's blocks of ``block``) equal the table
    read whole: rows, reasons, rejects and counts, whatever quotes, blank lines or bytes the
    file holds (a quote switches the rest of a CSV to the line reader)."""
    from unittest import mock

    from ckpred.data.readers import table_csv

    sample, name, op_mapping = {"csv": (CSV, "c.csv", (TMM, TMM_MAPPING)), "jsonl": (JSONL, "c.jsonl", (TMM, TMM_MAPPING)),
                                "fdb": (FDB, "c.fdb.txt", None)}[fmt]
    op, mapping = op_mapping or _miopen()
    mutated = data.draw(_awkward(sample))
    assume(not mutated.startswith((b"\x1f\x8b", b"BZh")))
    whole = _read_all(mutated, name, op, mapping, 1 << 30)
    with mock.patch.object(table_csv, "_BLOCK_BYTES", block):
        _same(_read_all(mutated, name, op, mapping, chunk), whole)


@SETTINGS
@given(st.data())
def test_pyarrows_split_of_a_plain_block_is_the_line_readers(data: st.DataObject) -> None:
    from unittest import mock

    from ckpred.data.readers import table_csv

    mutated = data.draw(_awkward(CSV))
    fast = _read_all(mutated, "p.csv", TMM, TMM_MAPPING, 1 << 30)
    with mock.patch.object(table_csv, "_plain", lambda block: False):
        _same(_read_all(mutated, "p.csv", TMM, TMM_MAPPING, 1 << 30), fast)
