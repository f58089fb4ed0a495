"""Streaming ingestion equals the reference: block readers and partitioned merge change nothing.

Three ways through one pipeline are compared on the same input:

* the **reference**: every line through the per-line readers, one partition in memory
  (``read_files(..., vectorised=False)``, the ingestion as it was before the block readers);
* the **block readers**: ``read_files`` with small chunks (many blocks per file, so block
  borders fall anywhere, repeats of a pair in different blocks);
* the **stream to Parquet**: ``ingest_to_parquet`` with small chunks, so the rows are
  hash-partitioned and spilled, each partition merged on its own, the table written part by
  part and the rejects streamed to CSV.

They must give the same summary (the reconciliation table), the same rejects with the same
reasons per row, and the same rows (in the same order for the first two; sorted for the
stream, whose parts follow the partitions). Inputs: hypothesis mutations of valid samples of
each chunked format (the fuzz corpus of ``test_ingest_fuzz``), hand-written odd lines, and the
real CK tables in ``data/``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpred.config import compose
from ckpred.data.partitions import MANIFEST, read_manifest
from ckpred.data.ingest import IngestResult, IngestSummary, ingest_to_parquet, read_files
from ckpred.data.table import conform
from ckpred.errors import InputFileError
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.kernels.gemm_universal import OP
from tests import fixtures_gen as fg
from tests.conftest import data_file

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORK = Path(tempfile.mkdtemp(prefix="ckpred_stream_"))  # hypothesis re-runs a test body: no tmp_path
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
KW = {"arch": "gfx950", "dtype": "fp8", "layout": "rcr"}

KERNELS = fg.kernel_names(6)
ROWS = fg.measurements(fg.SHAPES[:3], KERNELS)
LOG_ROWS = fg.measurements(fg.SHAPES[:3], KERNELS, decimals=2)
# every row twice (a second run of the sweep): repeats to merge across blocks and partitions
CSV = ("\n".join(fg.csv_lines(ROWS) + fg.csv_lines(ROWS)[1:]) + "\n").encode()
LOG = ("\n".join(fg.log_lines(LOG_ROWS) * 2) + "\n").encode()
SAMPLES = {"csv": CSV, "log": LOG}


def _table_key(table: pd.DataFrame) -> pd.DataFrame:
    return table.sort_values(["m", "n", "k", "kernel_name"] if "m" in table else list(table.columns[:8])) \
        .reset_index(drop=True)


def _rejects_key(rejects: pd.DataFrame) -> pd.DataFrame:
    return rejects.astype(str).sort_values(list(rejects.columns)).reset_index(drop=True)


def assert_same(reference: IngestResult, other: IngestResult) -> None:
    """Same summary, same rejects (in order) and the same table (in order)."""
    assert other.summary.as_dict() == reference.summary.as_dict()
    pd.testing.assert_frame_equal(other.rejects.astype(str), reference.rejects.astype(str))
    pd.testing.assert_frame_equal(other.table, reference.table)


def streamed(paths: Any, op: OpDefinition, out_name: str, chunk_bytes: int,
             **kw: Any) -> tuple[IngestSummary, pd.DataFrame, pd.DataFrame]:
    """``ingest_to_parquet`` into ``WORK``: (summary, table read back, rejects read back)."""
    out, rejects = WORK / out_name, WORK / f"{out_name}.rejects.csv"
    summary = ingest_to_parquet(paths, op, out, rejects, chunk_bytes=chunk_bytes, **kw)
    table = conform(pq.read_table(out).to_pandas(), op) if summary.valid_rows else None
    got_rejects = pd.read_csv(rejects, dtype=str, keep_default_na=False)
    return summary, table, got_rejects


def assert_stream_same(reference: IngestResult, summary: IngestSummary, table: pd.DataFrame | None,
                       rejects: pd.DataFrame) -> None:
    """The streamed output holds what the reference holds (rows and rejects in any order)."""
    assert summary.as_dict() == reference.summary.as_dict()
    pd.testing.assert_frame_equal(_rejects_key(rejects), _rejects_key(reference.rejects))
    if reference.summary.valid_rows == 0:
        assert table is None  # nothing usable: nothing written
        return
    # through the same Parquet round trip as the stream's output
    pd.testing.assert_frame_equal(_table_key(table), _table_key(conform(reference.table, OP)))


def _check_all_ways(data: bytes, fmt: str, chunk_bytes: int) -> None:
    path = WORK / f"in.{fmt}"
    path.write_bytes(data)
    try:
        reference = read_files(path, OP, fmt=fmt, vectorised=False, **KW)
    except InputFileError as exc:  # refused by the reference: refused the same way by the others
        with pytest.raises(InputFileError) as blocked:
            read_files(path, OP, fmt=fmt, chunk_bytes=chunk_bytes, **KW)
        assert str(blocked.value) == str(exc)
        return
    assert_same(reference, read_files(path, OP, fmt=fmt, chunk_bytes=chunk_bytes, **KW))
    assert_stream_same(reference, *streamed(path, OP, "out", chunk_bytes, fmt=fmt, **KW))


@st.composite
def _mutated(draw: Any, sample: bytes) -> bytes:
    """``sample`` with 1-3 spans replaced by random bytes (or by bytes of another line)."""
    data = sample
    for _ in range(draw(st.integers(1, 3))):
        a = draw(st.integers(0, len(data)))
        b = draw(st.integers(a, min(len(data), a + 24)))
        new = draw(st.one_of(st.binary(max_size=8),
                             st.sampled_from([b"-", b"0", b"null", b"NaN", b"1e400", b"\xff", b"\t", b"\r\n", b"\n",
                                              b"  ", b'"', b",", b"{", b"}", b"1.5", b"999999999999999999999",
                                              b"dtype=fp16 ", b"M=3 "])))
        data = data[:a] + new + data[b:]
    return data


@pytest.mark.slow
@SETTINGS
@given(st.sampled_from(sorted(SAMPLES)), st.data(), st.integers(1, 1500))
def test_mutated_inputs_read_the_same_all_ways(fmt: str, data: st.DataObject, chunk_bytes: int) -> None:
    _check_all_ways(data.draw(_mutated(SAMPLES[fmt])), fmt, chunk_bytes)


@pytest.mark.slow
def test_a_kernel_field_beyond_int64_is_refused_by_name() -> None:
    """A tile size past int64 in a kernel name is a reject with its reason, the same all ways
    (it once reached the int64 cast of the table and stopped ingestion)."""
    data = SAMPLES["csv"].replace(b"64x64x64_1x4x1_16x16x32,1,", b"64x64x99999999999999999999964_1x4x1_16x16x32,1,", 1)
    assert data != SAMPLES["csv"]
    for chunk_bytes in (1, 97, 1 << 20):
        _check_all_ways(data, "csv", chunk_bytes)
    path = WORK / "huge.csv"
    path.write_bytes(data)
    result = read_files(path, OP, fmt="csv", **KW)
    assert result.summary.rejected == {"unparseable kernel name": 1}
    assert result.rejects["reason"].tolist() == ["unparseable kernel name: tile_k=99999999999999999999964 is beyond int64"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(SAMPLES))
@pytest.mark.parametrize("chunk_bytes", [1, 97, 1 << 20])
def test_unmutated_samples_read_the_same_all_ways(fmt: str, chunk_bytes: int) -> None:
    _check_all_ways(SAMPLES[fmt], fmt, chunk_bytes)


def _log_line(kernel: str, m: int, *, split_k: Any = 1, tflops: Any = 12.5, extra: str = "") -> str:
    return (f'{{"name": "{kernel}", "problem": {{"split_k": {split_k}, "m": {m}, "n": 64, "k": 64{extra}}}, '
            f'"perf_result": {{"latency(ms)": 0.01, "tflops(TFlops)": {tflops}, "bandwidth(GB/s)": 5.0}}}}')


ODD_LOG_LINES = [
    "\ufeff" + "=" * 20,
    "Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr",
    _log_line(KERNELS[0], 16),
    _log_line(KERNELS[1], 16, tflops="NaN"),
    _log_line(KERNELS[2], 16, tflops="null"),
    _log_line(KERNELS[3], 17),  # disagrees with its header
    _log_line(KERNELS[4], -16),  # negative, and disagrees
    "   " + _log_line(KERNELS[5], 16),  # indented
    _log_line("gemm_universal_fp8_rcr_not_a_kernel", 16),
    _log_line(KERNELS[0] + "\u00e9", 16),
    _log_line(KERNELS[1], 16, split_k="true"),
    '{"name": "' + KERNELS[2] + '", "problem": {"m": 16, "n": 64, "k": 64}, '
    '"perf_result": {"latency(ms)": 0.01, "tflops(TFlops)": 12}}',  # no split_k, int TFLOPS, no bandwidth
    _log_line(KERNELS[3], 16, extra=', "m": 16'),  # a repeated key
    '{"name": 5}',
    "{not json",
    "garbage line",
    "Shape 1: M=32 N=64 K=64 dtype=fp16 layout=rcr",  # another dtype: its rows are rejected
    _log_line(KERNELS[0], 32),
    "Shape 2: M=x N=64 K=64",  # a header that does not parse
    _log_line(KERNELS[0], 48),
    "Shape 3: M=16 N=64 K=64 dtype=fp8 layout=rcr",
    _log_line(KERNELS[0], 16, tflops=13.5) + "\r",  # CRLF
    _log_line(KERNELS[1], 16, tflops=1e400),
    "",
    _log_line(KERNELS[2], 16, tflops=0.0),
]


@pytest.mark.parametrize("chunk_bytes", [1, 300, 1 << 20])
def test_odd_log_lines_read_the_same_all_ways(chunk_bytes: int) -> None:
    _check_all_ways(("\n".join(ODD_LOG_LINES)).encode(), "log", chunk_bytes)


ODD_CSV_LINES = [
    "kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero",
    f"{KERNELS[0]},0,16,64,64,0.01,12.5,1",
    f" {KERNELS[1]} ,0, 16,64,64,0.01,12.5,1",
    f'"{KERNELS[2]}",0,16,64,64,0.01,12.5,1',
    f"{KERNELS[3]},0,-16,64,64,0.01,12.5,1",
    f"{KERNELS[4]},0,16,64,64,nan,12.5,1",
    f"{KERNELS[5]},0,16,64,64,0.01,,1",
    f"{KERNELS[0]},0,16.0,64,64,0.01,12.5,1",
    f"{KERNELS[1]},0,1e3,64,64,0.01,12.5,1",
    f"{KERNELS[2]},0,16,64,64,0.01,12.5",
    "gemm_universal_fp8_rcr_nonsense,0,16,64,64,0.01,12.5,1",
    "",
    "   ",
    f"{KERNELS[3]},0,16,64,64,0.01,12.5,1\r",
    f"{KERNELS[4]},0,16,64,64,0.01,1_0,1",
    f"{KERNELS[5]},0,16,64,64,0.01,inf,1",
    f"{KERNELS[0]}\u00e9,0,16,64,64,0.01,12.5,1",
]


@pytest.mark.parametrize("chunk_bytes", [1, 200, 1 << 20])
def test_odd_csv_lines_read_the_same_all_ways(chunk_bytes: int) -> None:
    _check_all_ways(("\n".join(ODD_CSV_LINES) + "\n").encode(), "csv", chunk_bytes)


@pytest.mark.parametrize("parse_bytes", [150, 400, 5000])
@pytest.mark.parametrize("sample", ["sweep", "odd"])
def test_csv_blocks_parsed_in_pieces_read_the_same_all_ways(parse_bytes: int, sample: str, monkeypatch: Any) -> None:
    """A block pyarrow parses a piece at a time (its columns in several chunks, a line
    across two pieces, a kernel dictionary per piece) reads as the reference does."""
    from ckpred.data.readers import csv_sweep

    monkeypatch.setattr(csv_sweep, "_PARSE_BLOCK_BYTES", parse_bytes)
    data = CSV if sample == "sweep" else ("\n".join(ODD_CSV_LINES) + "\n").encode()
    _check_all_ways(data, "csv", 1 << 20)


_GOOD_CSV_LINE = f"{KERNELS[0]},0,16,64,64,0.01,12.5,1"


@pytest.mark.slow
@pytest.mark.parametrize("chunk_bytes", [1, 200, 1 << 20])
@pytest.mark.parametrize("odd", [
    _GOOD_CSV_LINE + "\r" + _GOOD_CSV_LINE.replace(",16,", ",32,"),  # two rows one line apart by a lone CR
    _GOOD_CSV_LINE + "\r",  # CRLF
    _GOOD_CSV_LINE.replace(",16,", ",\r16,"),  # a CR inside a field
])
def test_csv_blocks_with_a_carriage_return_read_the_same_all_ways(chunk_bytes: int, odd: str) -> None:
    """pyarrow ends a line at a lone CR too: a block that parses must still give one row per line."""
    lines = ["kernel,problem_idx,m,n,k,latency_ms,tflops,non_zero", *[_GOOD_CSV_LINE] * 5, odd, *[_GOOD_CSV_LINE] * 5]
    _check_all_ways(("\n".join(lines) + "\n").encode(), "csv", chunk_bytes)


# -- the log block reader's fast paths, and where each leaves a line to the per-line reader -------
def _run(m: int = 16) -> list[str]:
    return [_log_line(kernel, m) for kernel in KERNELS]


FAST_PATH_LOG_LINES = [
    "Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr",
    *_run(),
    _log_line(KERNELS[0], 16).replace(", ", ",\x0b", 1),  # a control byte between tokens: malformed
    _log_line(KERNELS[1] + "\x00", 16),  # a control byte in a string: malformed
    _log_line(KERNELS[2] + "\x7f", 16),  # DEL in a string: JSON, but no kernel of the op
    "\t" + _log_line(KERNELS[3], 16),  # indented by a tab
    *_run(),
    _log_line(KERNELS[3], 16) + " " + _log_line(KERNELS[4], 16),  # two objects on one line: malformed
    *_run(),
    _log_line(KERNELS[5], 16, split_k="1.0"),  # an integer written as a float: read as 1 by the line reader
    *_run(),
]


@pytest.mark.slow
@pytest.mark.parametrize("chunk_bytes", [1, 300, 2500, 1 << 20])
@pytest.mark.parametrize("piece_bytes", [1, 700, 1 << 20])
def test_log_fast_path_lines_read_the_same_all_ways(chunk_bytes: int, piece_bytes: int, monkeypatch: Any) -> None:
    """Runs decoded in pieces (down to a line each), control bytes, DEL, a tab, two objects on
    a line and a float where the decoder wants an integer (the block falls back to the per-line
    reader): the same rows and rejects as the reference."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PIECE_BYTES", piece_bytes)
    _check_all_ways(("\n".join(FAST_PATH_LOG_LINES) + "\n").encode(), "log", chunk_bytes)
    result = read_files(WORK / "in.log", OP, fmt="log", chunk_bytes=chunk_bytes, **KW)
    assert result.summary.rejected == {"malformed JSON": 3, "unparseable kernel name": 1}
    assert result.summary.records == 4 * len(KERNELS) + 2 + 4  # with the tab-indented row and split_k=1.0


def _names_log() -> bytes:
    """A log whose kernel names come and go across blocks: new names in later shapes, a rejected
    name in every shape, a name written with a JSON escape, a new name first met under a header
    that rejects its rows, and odd lines (BOM, CRLF, a long line, non-ASCII) between them."""
    kernels = fg.kernel_names(12)
    lines = ["\ufeff" + "=" * 20]
    shapes = [(16, kernels[:4], "fp8"), (24, kernels[9:11], "fp16"), (32, kernels[2:8], "fp8"),
              (48, kernels[6:] + kernels[:2], "fp8")]
    for number, (m, names, dtype) in enumerate(shapes):
        lines.append(f"Shape {number}: M={m} N=64 K=64 dtype={dtype} layout=rcr")
        for i, kernel in enumerate(names):
            lines.append(_log_line(kernel, m, tflops=10.0 + i))
            if i == 1:
                lines.append(_log_line("gemm_universal_fp8_rcr_not_a_kernel", m))  # rejected, every shape
                lines.append(_log_line(kernel.replace("gemm", "\\u0067emm", 1), m))  # the same kernel, escaped
        lines.append(_log_line(names[0], m) + "\r")
        lines.append(_log_line(names[-1], m, extra=', "note": "' + "x" * 5000 + '"'))  # past the decoder's line limit
        lines.append(_log_line(names[0] + "\u00e9", m))  # non-ASCII: no kernel of the op
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow
@pytest.mark.parametrize("chunk_bytes", [1, 700, 3000, 1 << 20])
@pytest.mark.parametrize("piece_bytes", [1, 500, 1 << 20])
def test_log_kernel_codes_across_blocks_read_the_same_all_ways(chunk_bytes: int, piece_bytes: int,
                                                               monkeypatch: Any) -> None:
    """Kernel codes looked up per decoded piece in the file's name -> code map (names new in a
    later block or piece, a rejected name met again, an escaped name, a name first met under a
    rejecting header): the same rows and rejects as the per-line reader, blocks and pieces cut
    anywhere."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PIECE_BYTES", piece_bytes)
    data = _names_log()
    _check_all_ways(data, "log", chunk_bytes)
    result = read_files(WORK / "in.log", OP, fmt="log", chunk_bytes=chunk_bytes, **KW)
    assert result.summary.rejected == {"dtype mismatch": 7, "unparseable kernel name": 2 * 3}
    assert result.summary.records == 4 + 6 + 8 + 3 * 3 + 7 + 2 * 3  # the escaped, CRLF and long rows kept


@pytest.mark.parametrize("chunk_bytes", [1, 300, 1 << 20])
def test_a_log_problem_field_beyond_int64_is_a_reject(chunk_bytes: int) -> None:
    """A problem value past int64 in a log row is a reject with its reason, the same all ways
    (it once stopped the per-line reader at the int64 buffer, and the block decoder at its cast)."""
    lines = ["Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr", *_run(),
             _log_line(KERNELS[0], 2**63), _log_line(KERNELS[1], -10**30), *_run()]
    _check_all_ways(("\n".join(lines) + "\n").encode(), "log", chunk_bytes)
    result = read_files(WORK / "in.log", OP, fmt="log", chunk_bytes=chunk_bytes, **KW)
    assert result.rejects["reason"].tolist() == [f"bad problem field: m={2**63} is beyond int64",
                                                 "bad problem field: m=-1e+30 is not an integer"]  # JSON reads it as a float
    assert result.summary.records == 2 * len(KERNELS) + 2


def _block_read_is_the_line_read(data: bytes, chunk_bytes: int) -> None:
    """``stream_log.read_chunks`` of ``data`` gives exactly what ``stream_log.read`` gives: every
    column (the floats bit for bit), reason, reject and kernel code (resolvers met in the same
    order give the same codes)."""
    from ckpred.data.readers import stream_log
    from ckpred.data.readers.common import KernelResolver, ReadContext, RowBuffer

    path = WORK / "direct.log"
    path.write_bytes(data)

    def context() -> ReadContext:
        return ReadContext(OP, KernelResolver(OP, dtype="fp8", layout="rcr"), "fp8", "rcr", "gfx950", path.name)

    ref_ctx, ctx = context(), context()
    reference = stream_log.read(path, ref_ctx)
    reads = list(stream_log.read_chunks(path, ctx, chunk_bytes))
    rows = RowBuffer.merged([r.rows for r in reads]) if reads else stream_log.new_buffer(ctx)
    want = reference.rows
    for column in ("line", "kernel"):
        assert np.asarray(getattr(rows, column), dtype=np.int64).tolist() == \
            np.asarray(getattr(want, column), dtype=np.int64).tolist(), column
    for got, expected in zip(rows.problem, want.problem):
        assert np.asarray(got, dtype=np.int64).tolist() == np.asarray(expected, dtype=np.int64).tolist()
    for column in ("latency", "tflops", "bandwidth"):
        assert np.asarray(getattr(rows, column), dtype=np.float64).view(np.int64).tolist() == \
            np.asarray(getattr(want, column), dtype=np.float64).view(np.int64).tolist(), column
    assert rows.reasons == want.reasons
    assert [r for read in reads for r in read.rejects] == reference.rejects
    assert ctx.resolver.canonical_names == ref_ctx.resolver.canonical_names


def _del_lines() -> list[str]:
    """Rows with DEL (a plain byte to the block scan) in each place a row can hold it."""
    good = _log_line(KERNELS[0], 16)
    return ["Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr", *_run(),
            _log_line(KERNELS[1], 16, extra=', "dtype_a": "fp8\x7f"'),  # in a string the table does not read
            _log_line(KERNELS[2], 16, extra=', "n\x7f": 5'),  # in a key the table does not read
            _log_line(KERNELS[3] + "\x7f", 16),  # in the kernel name: no kernel of the op
            good.replace('"m"', '"m\x7f"'),  # in a problem key: the field missing, from the header
            good.replace('"tflops(TFlops)"', '"tflops\x7f(TFlops)"'),  # in a perf key: missing value
            good.replace(', "problem"', ',\x7f"problem"'),  # outside a string: malformed
            good + "\x7f", *_run()]


@pytest.mark.parametrize("chunk_bytes", [1, 500, 1 << 20])
def test_log_rows_with_del_read_the_same(chunk_bytes: int) -> None:
    """DEL inside a string (decoded as any other character), in a key, or outside a string
    (the block read line by line): exactly what the per-line reader gives, all ways."""
    data = ("\n".join(_del_lines()) + "\n").encode()
    _block_read_is_the_line_read(data, chunk_bytes)
    _check_all_ways(data, "log", chunk_bytes)


#: Perf values at the edges of a double: 17 significant digits, subnormal, the largest, beyond
#: it, negative zero, integers, exponents.
_PERF_VALUES = ["0.1", "0.30000000000000004", "24.43478743058634", "5e-324", "2.2250738585072014e-308",
                "1.7976931348623157e308", "1e400", "-0.0", "0", "7", "-3", "1E2", "123456789012345678901234567890",
                "0.000001", "9007199254740993"]


@pytest.mark.parametrize("chunk_bytes", [1, 900, 1 << 20])
@pytest.mark.parametrize("piece_bytes", [1, 2000, 1 << 20])
def test_log_perf_values_read_bit_for_bit(chunk_bytes: int, piece_bytes: int, monkeypatch: Any) -> None:
    """Perf values read out of the packed perf structs, pieces of 1 to hundreds of rows (the
    packed array's header of 1 or 3 bytes): the same doubles as the per-line reader's."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PIECE_BYTES", piece_bytes)
    lines = ["Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr"]
    for i in range(300):
        value = _PERF_VALUES[i % len(_PERF_VALUES)]
        other = _PERF_VALUES[(i * 7 + 3) % len(_PERF_VALUES)]
        lines.append(_log_line(KERNELS[i % len(KERNELS)], 16, tflops=value).replace('"latency(ms)": 0.01',
                                                                                  f'"latency(ms)": {other}'))
    _block_read_is_the_line_read(("\n".join(lines) + "\n").encode(), chunk_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 15, 16, 65535, 65536])
def test_perf_columns_of_packed_structs_are_the_structs_floats(k: int, monkeypatch: Any) -> None:
    """``_perf_columns`` around each size of the packed array's header (1, 3, 5 bytes), and its
    Python-level way for structs packed otherwise (a layout that does not fit): the floats of
    the structs, in order."""
    from ckpred.data.readers import stream_log

    decoder = stream_log._decoder(OP.problem_names)
    values = np.random.default_rng(k).standard_normal((k, 3)) * 1e3
    text = "\n".join(f'{{"name": "{KERNELS[0]}", "problem": {{"m": 16}}, "perf_result": {{"latency(ms)": {a!r}, '
                     f'"tflops(TFlops)": {b!r}, "bandwidth(GB/s)": {c!r}}}}}' for a, b, c in values.tolist()).encode()
    perfs = [r.perf_result for r in decoder.row.decode_lines(text)] if k else []
    assert len(perfs) == k
    out = np.full((3, k), np.nan)
    with monkeypatch.context() as patch:  # read out of the packed bytes, not by the Python-level way
        patch.setattr(stream_log, "chain", None)
        stream_log._perf_columns(out, perfs, decoder)
    assert out.T.tolist() == values.tolist()
    monkeypatch.setattr(decoder, "perf_dtype", np.dtype({"names": ["latency", "tflops", "bandwidth"],
                                                         "formats": [">f8"] * 3, "offsets": [0, 8, 16],
                                                         "itemsize": decoder.perf_dtype.itemsize + 1}))
    out = np.full((3, k), np.nan)
    stream_log._perf_columns(out, perfs, decoder)
    assert out.T.tolist() == values.tolist()


def _sweep_log(kernels: list[str]) -> bytes:
    """A sweep whose kernel order changes between shapes: the same order again, a kernel
    missing, the order reversed, new kernels between old ones, a rejected name and an escaped
    one in the middle, one kernel over and over, and the first order once more."""
    shapes = [kernels[:12], kernels[:12], kernels[:3] + kernels[4:12], kernels[11::-1],
              [k for pair in zip(kernels[:6], kernels[12:18]) for k in pair],
              kernels[:5] + ["gemm_universal_fp8_rcr_not_a_kernel", kernels[5].replace("gemm", "\\u0067emm", 1)]
              + kernels[6:12], [kernels[7]] * 40, kernels[:18]]
    lines = []
    for number, names in enumerate(shapes):
        lines.append(f"Shape {number}: M={16 + number} N=64 K=64 dtype=fp8 layout=rcr")
        lines += [_log_line(kernel, 16 + number, tflops=10.0 + i) for i, kernel in enumerate(names)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow
@pytest.mark.parametrize("chunk_bytes", [1, 2000, 1 << 20])
@pytest.mark.parametrize("piece_bytes", [1, 700, 3000, 1 << 20])
@pytest.mark.parametrize("stretches", [1, 8])
def test_log_kernel_names_in_changing_orders_read_the_same(chunk_bytes: int, piece_bytes: int, stretches: int,
                                                           monkeypatch: Any) -> None:
    """Kernel codes of pieces compared with stretches of the names' first-met order, the order
    changing between shapes (see ``_sweep_log``): exactly what the per-line reader gives."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PIECE_BYTES", piece_bytes)
    monkeypatch.setattr(stream_log, "_STRETCHES", stretches)
    _block_read_is_the_line_read(_sweep_log(fg.kernel_names(18)), chunk_bytes)


class _CountingResolver:
    """Codes in the order names are first resolved; a name starting with ``bad`` is rejected."""

    def __init__(self) -> None:
        self.codes: dict[str, int | str] = {}
        self.resolved: list[str] = []

    def resolve_all(self, names: list[str]) -> list[int | str]:
        for name in names:
            if name not in self.codes:
                self.resolved.append(name)
                self.codes[name] = "rejected" if name.startswith("bad") else len(self.codes)
        return [self.codes[name] for name in names]


@SETTINGS
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "bad1", "bad2"]), min_size=1, max_size=40),
                max_size=12), st.integers(1, 10))
def test_kernel_codes_of_pieces_are_those_of_the_names(pieces: list[list[str]], stretches: int) -> None:
    """``_KernelCodes.fill`` over pieces of names (repeats, new names, rejected names, in any
    order): the code of each name, new names resolved in the order first met."""
    from ckpred.data.readers import stream_log

    saved, stream_log._STRETCHES = stream_log._STRETCHES, stretches
    try:
        codes, resolver, reference = stream_log._KernelCodes(), _CountingResolver(), _CountingResolver()
        for piece in pieces:
            out = np.full(len(piece), -99, dtype=np.int64)
            codes.fill(out, [str(name) for name in piece], resolver)  # new str objects: compared by value
            want = [code if type(code) is int else -1 for code in reference.resolve_all(piece)]
            assert out.tolist() == want
        assert resolver.resolved == reference.resolved
    finally:
        stream_log._STRETCHES = saved


def test_kernel_codes_of_a_repeated_order_come_from_its_stretches(monkeypatch: Any) -> None:
    """Pieces that repeat the first-met order (across its end too) are not looked up by name."""
    from ckpred.data.readers import stream_log

    names = [f"k{i}" for i in range(50)]
    codes, resolver = stream_log._KernelCodes(), _CountingResolver()
    out = np.empty(50, dtype=np.int64)
    codes.fill(out, names, resolver)
    looked_up: list[int] = []
    monkeypatch.setattr(codes, "_look_up", lambda out, names, resolver: looked_up.append(len(names)))
    for start in (0, 10, 45, 49):
        piece = (names * 3)[start:start + 70]
        out = np.full(70, -99, dtype=np.int64)
        codes.fill(out, piece, resolver)
        assert out.tolist() == [int(name[1:]) for name in piece]
    assert looked_up == []
    codes.fill(np.empty(3, dtype=np.int64), ["k1", "k3", "k4"], resolver)  # a kernel missing: looked up
    assert looked_up == [3]


_PROBLEM_TEXTS = st.sampled_from([b'{"m": 1}', b'{"m":1}', b'{"m": 2}', b'{"m": 1, "n": 2}'])


@SETTINGS
@given(st.lists(st.tuples(_PROBLEM_TEXTS, st.integers(1, 150)), max_size=12), st.lists(_PROBLEM_TEXTS, max_size=300),
       st.booleans(), st.integers(2, 80))
def test_problem_text_changes_are_every_change(runs: list[tuple[bytes, int]], loose: list[bytes], in_runs: bool,
                                               pairwise: int) -> None:
    """``_changes`` (runs found by counts and binary searches, stretches of short runs pair by
    pair) against the pair-by-pair definition, on raw texts in long runs (a run coming back
    after another, runs of one) or in any order."""
    import msgspec

    from ckpred.data.readers import stream_log

    texts = [text for text, length in runs for _ in range(length)] if in_runs else loose
    raws = [msgspec.Raw(bytes(text)) for text in texts]  # equal texts are distinct objects
    saved, stream_log._PAIRWISE = stream_log._PAIRWISE, pairwise
    try:
        out = [0]
        stream_log._changes(raws, 0, len(raws), out)
    finally:
        stream_log._PAIRWISE = saved
    assert out == [0] + [i for i in range(1, len(texts)) if texts[i] != texts[i - 1]]


@pytest.mark.parametrize("pairwise", [2, 5, 64])
def test_problem_text_changes_around_every_position(pairwise: int, monkeypatch: Any) -> None:
    """``_changes`` on one text with a short run of another anywhere in it (inside, at an end,
    at each halving point), and on two long runs meeting anywhere: every change, no other."""
    import msgspec

    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PAIRWISE", pairwise)
    cases = [["a"] * start + ["b"] * length + ["a"] * (n - start - length)
             for n in (3, 66, 131) for length in (1, 2, 3) for start in range(n - length + 1)]
    cases += [["a"] * cut + ["b"] * (n - cut) for n in (70, 131) for cut in range(1, n)]
    for texts in cases:
        raws = [msgspec.Raw(text.encode()) for text in texts]
        out = [0]
        stream_log._changes(raws, 0, len(raws), out)
        assert out == [0] + [i for i in range(1, len(texts)) if texts[i] != texts[i - 1]], texts


def _problem_runs_log() -> bytes:
    """Rows whose problem texts change inside a shape and inside a piece: the same problem in
    another key order, with other spaces, with a key more, a value changed for one row, runs of
    one row, and long runs."""
    problems = ['{"split_k": 1, "m": 16, "n": 64, "k": 64}', '{"m": 16, "n": 64, "k": 64, "split_k": 1}',
                '{"split_k":1,"m":16,"n":64,"k":64}', '{"split_k": 1, "m": 16, "n": 64, "k": 64, "x": [1, {"m": 3}]}',
                '{"split_k": 1, "m": 16, "n": 64, "k": 65}', '{"split_k": 2, "m": 16, "n": 64, "k": 64}']
    lines = ["Shape 0: M=16 N=64 K=64 dtype=fp8 layout=rcr"]
    pattern = [0] * 70 + [1, 2, 0, 3, 3, 4, 0] + [5] * 3 + [1] * 90 + [2, 1, 2, 1] + [0] * 40
    for i, which in enumerate(pattern):
        perf = f'{{"latency(ms)": 0.01, "tflops(TFlops)": {10 + i % 7}.5, "bandwidth(GB/s)": 5.0}}'
        lines.append(f'{{"name": "{KERNELS[i % len(KERNELS)]}", "problem": {problems[which]}, "perf_result": {perf}}}')
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 20])
@pytest.mark.parametrize("piece_bytes", [1, 1000, 9000, 1 << 20])
@pytest.mark.parametrize("pairwise", [2, 64])
def test_log_problem_runs_broken_anywhere_read_the_same(chunk_bytes: int, piece_bytes: int, pairwise: int,
                                                        monkeypatch: Any) -> None:
    """Each run of identical problem texts decoded once, runs broken mid-piece by texts that
    differ in key order, spaces, a key or a value: exactly what the per-line reader gives
    (rows of another k or split_k keep their shape-mismatch reason)."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_PIECE_BYTES", piece_bytes)
    monkeypatch.setattr(stream_log, "_PAIRWISE", pairwise)
    _block_read_is_the_line_read(_problem_runs_log(), chunk_bytes)


@SETTINGS
@given(st.binary(max_size=400), st.data())
def test_block_scan_finds_every_newline_and_odd_byte(block: bytes, data: st.DataObject) -> None:
    """``_scan`` (passes of ``_SCAN_BYTES`` for the control bytes and the bytes past ASCII)
    against its definition, byte by byte, on the whole lines ``block[:end]``."""
    from ckpred.data.readers import stream_log

    end = data.draw(st.integers(0, len(block)))
    step = data.draw(st.sampled_from([1, 7, 64, stream_log._SCAN_BYTES]))
    saved, stream_log._SCAN_BYTES = stream_log._SCAN_BYTES, step
    try:
        ends, odd = stream_log._scan(np.frombuffer(block, dtype=np.uint8, count=end))
    finally:
        stream_log._SCAN_BYTES = saved
    assert ends.tolist() == [i for i in range(end) if block[i] == 10]
    assert odd.tolist() == [i for i in range(end) if not (32 <= block[i] < 128 or block[i] in (9, 10, 13))]


@pytest.mark.parametrize("step", [1, 7, 64, 1 << 20])
def test_block_scan_sorts_every_byte_value(step: int, monkeypatch: Any) -> None:
    """Each of the 256 byte values (the edges: 31, 32, 126, DEL, 128, 255), alone and between
    newlines: newlines, and tab, CR and DEL as plain bytes."""
    from ckpred.data.readers import stream_log

    monkeypatch.setattr(stream_log, "_SCAN_BYTES", step)
    block = bytes(range(256)) + b"\n".join(bytes([i]) for i in range(256))
    ends, odd = stream_log._scan(np.frombuffer(block, dtype=np.uint8))
    assert ends.tolist() == [i for i, byte in enumerate(block) if byte == 10]
    assert {block[i] for i in odd.tolist()} == set(range(32)) - {9, 10, 13} | set(range(128, 256))
    assert len(odd) == 2 * (256 - 96 - 3)


@SETTINGS
@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20), st.booleans(),
       st.integers(1, 64), st.integers(0, 70000))
def test_line_spans_cut_a_file_into_its_whole_lines(lines: list[bytes], last_newline: bool, chunk: int,
                                                    skip: int) -> None:
    """From any position, the spans copied as they come are the rest of the file, each ending
    at a line end except at the end of the file; the same for a stream read into a buffer
    and for a file mapped a block at a time (whose maps start at a page boundary: ``skip``
    reaches past the first pages)."""
    import io

    from ckpred.data.readers import common

    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    path = WORK / "spans.txt"
    path.write_bytes(b"x" * skip + data)
    stream = io.BufferedReader(io.BytesIO(b"x" * skip + data))
    with open(path, "rb") as mapped:
        assert not common._mappable(stream) and common._mappable(mapped) == bool(skip or data)
        for fh in (stream, mapped):
            fh.seek(skip)
            spans = [bytes(buffer[start:end]) for buffer, start, end in common.line_spans(fh, chunk)]
            assert b"".join(spans) == data
            assert all(part.endswith(b"\n") for part in spans[:-1]) and all(spans)
            assert fh.tell() == skip + len(data)


@pytest.mark.parametrize("chunk", [1, 10, 1 << 20])
def test_line_spans_of_a_file_after_its_header_line(tmp_path: Path, chunk: int) -> None:
    """A file read from after a first line taken by iteration (as the CSV reader takes its
    header), with a chunk larger than what is left: the blocks are the rest of the file,
    mapped or read."""
    import io

    from ckpred.data.readers.common import line_spans

    path = tmp_path / "lines.txt"
    path.write_bytes(b"header\n" + b"".join(b"line %d\n" % i for i in range(50)) + b"last")
    for mapped in (True, False):
        with open(path, "rb") as fh:
            if not mapped:
                fh = io.BufferedReader(io.BytesIO(fh.read()))
            assert next(iter(fh)) == b"header\n"
            blocks = [bytes(buffer[start:end]) for buffer, start, end in line_spans(fh, chunk)]
        assert b"".join(blocks) == path.read_bytes()[len(b"header\n"):]
        assert all(part.endswith(b"\n") for part in blocks[:-1]) and blocks[-1].endswith(b"last")


def test_mapped_line_spans_follow_a_growing_file_and_outlive_a_held_view(tmp_path: Path) -> None:
    """Lines appended while a file is read are read too (a writer that holds the file open gets
    it read into a buffer: no lease is granted then); a caller that keeps a view of a mapped
    block past the next one still reads its bytes (the map is released with the view, not
    closed under it); a compressed file is read through its decompressed stream."""
    import gzip
    from unittest import mock

    from ckpred.data.readers import common
    from ckpred.data.readers.common import line_spans, open_binary

    path = tmp_path / "growing.txt"
    path.write_bytes(b"a\nb\n")
    held = []
    with open(path, "rb") as fh, open(path, "ab") as writer:  # a writer appending as it runs
        for buffer, start, end in line_spans(fh, 2):
            held.append(memoryview(buffer)[start:end])
            if len(held) == 1:
                writer.write(b"c\nd")
                writer.flush()
    assert [bytes(view) for view in held] == [b"a\n", b"b\n", b"c\n", b"d"]
    del held
    held = []
    with open(path, "rb") as fh, mock.patch.object(common, "_read_spans", side_effect=AssertionError("read")):
        for buffer, start, end in line_spans(fh, 2):  # mapped: no writer holds the file open
            assert isinstance(buffer, common.mmap.mmap)
            held.append(memoryview(buffer)[start:end])
    assert [bytes(view) for view in held] == [b"a\n", b"b\n", b"c\n", b"d"]
    del held
    packed = tmp_path / "lines.txt.gz"
    packed.write_bytes(gzip.compress(b"a\nb\n"))
    with open_binary(packed) as fh:
        assert b"".join(bytes(b[s:e]) for b, s, e in line_spans(fh, 1)) == b"a\nb\n"


@pytest.mark.skipif(not Path("/proc/sys/fs/lease-break-time").exists(), reason="needs Linux file leases")
def test_a_mapped_block_holds_writers_off_until_it_is_done(tmp_path: Path) -> None:
    """While a mapped block is being read, opening the file for writing (which a truncation
    needs) waits: here a non-blocking open is refused; between blocks and after the read it
    is not. So no page of a mapped block can vanish under its reader (SIGBUS)."""
    import errno
    import os

    from ckpred.data.readers.common import line_spans

    path = tmp_path / "lines.txt"
    path.write_bytes(b"a\nb\n")

    def try_write() -> int:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except BlockingIOError as exc:
            return exc.errno
        return 0

    refused = []
    with open(path, "rb") as fh:
        for _ in line_spans(fh, 2):
            refused.append(try_write())
    assert refused == [errno.EWOULDBLOCK] * 2
    assert try_write() == 0


def test_line_spans_read_what_cannot_be_mapped(tmp_path: Path) -> None:
    """A file that tells no size (``/proc``), an empty file and a file whose system refuses a
    map are read into a buffer, whole."""
    from unittest import mock

    from ckpred.data.readers import common

    proc = Path("/proc/self/status")
    if proc.exists():
        with open(proc, "rb") as fh:
            assert not common._mappable(fh)
            assert b"".join(bytes(b[s:e]) for b, s, e in common.line_spans(fh, 64)).startswith(b"Name:")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with open(empty, "rb") as fh:
        assert not common._mappable(fh) and list(common.line_spans(fh, 64)) == []
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a\nb\nc")
    with open(path, "rb") as fh, mock.patch.object(common.mmap, "mmap", side_effect=OSError(19, "No such device")):
        assert not common._mappable(fh)
        assert [bytes(b[s:e]) for b, s, e in common.line_spans(fh, 2)] == [b"a\n", b"b\n", b"c"]


# -- real CK tables --------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_real_parity_sweeps_read_the_same_all_ways(chunk_bytes: int) -> None:
    paths = [data_file("ck_gemm_gfx950_results", "parity_sweep_results.csv"),
             data_file("ck_gemm_gfx950_results", "parity_sweep_results_b.csv")]
    kw = {"arch": "gfx942", "dtype": "fp16", "layout": "rcr"}
    reference = read_files(paths, OP, vectorised=False, **kw)
    assert reference.summary.rows == 128 and reference.summary.merged == 128  # the two runs merge
    assert_same(reference, read_files(paths, OP, chunk_bytes=chunk_bytes, **kw))
    assert_stream_same(reference, *streamed(paths, OP, f"parity_{chunk_bytes}", chunk_bytes, **kw))


@pytest.mark.slow
@pytest.mark.parametrize(("table", "op_name", "dtype"), [
    ("benchmark_forward_300_bf16_gfx950.csv", "grouped_conv_fwd", "bf16"),
    ("training_data_forward_bf16_20.csv", "grouped_conv_fwd", "bf16"),
])
def test_real_conv_tables_stream_the_same(table: str, op_name: str, dtype: str) -> None:
    """A table read through the op's column map: streamed in partitions, merged the same."""
    path = data_file("ck_grouped_conv_fwd_bf16_gfx950", table)
    cfg = compose("ingest", [f"data.path={path}", f"op={op_name}", f"dtype={dtype}"])
    op = load_op(cfg.op)
    kw = {"arch": "gfx950", "dtype": dtype, "layout": cfg.layout.name, "arch_config": cfg.arch}
    reference = read_files(path, op, **kw)
    summary, got, rejects = streamed(path, op, f"conv_{table}", 64 << 10, **kw)
    assert summary.as_dict() == reference.summary.as_dict()
    pd.testing.assert_frame_equal(_rejects_key(rejects), _rejects_key(reference.rejects))
    keys = [*op.problem_names, "kernel_name"]
    pd.testing.assert_frame_equal(got.sort_values(keys).reset_index(drop=True),
                                  conform(reference.table, op).sort_values(keys).reset_index(drop=True))


def test_a_streamed_directory_is_read_back_by_training(tmp_path: Path) -> None:
    """A partitioned table directory is a data.path: its parts are read as canonical tables."""
    from ckpred.data import load_table

    path = tmp_path / "in.log"
    path.write_bytes(LOG)
    summary = ingest_to_parquet(path, OP, tmp_path / "table", tmp_path / "rejects.csv", chunk_bytes=512, **KW)
    parts = sorted((tmp_path / "table").glob("*.parquet"))
    assert len(parts) > 1 and all(p.name.startswith("part-") for p in parts)
    # the manifest the Dask backend trains from lists every part with its rows and one combo
    manifest = read_manifest(tmp_path / "table", OP)
    assert [p["file"] for p in manifest["partitions"]] == [p.name for p in parts]
    assert manifest["rows"] == summary.rows and {p["dtype"] for p in manifest["partitions"]} == {"fp8"}
    # each problem lies in one part
    seen: dict[tuple[int, int, int], str] = {}
    for part in parts:
        for key in set(map(tuple, pq.read_table(part).to_pandas()[["m", "n", "k"]].to_numpy().tolist())):
            assert seen.setdefault(key, part.name) == part.name
    table = load_table(compose("train", ["data=path", f"data.path={tmp_path / 'table'}"]))
    assert len(table) == summary.rows == len(KERNELS) * 3 and (table["repeats"] == 2).all()


@pytest.mark.parametrize("out", ["table.parquet", "table"])
def test_written_parquet_has_the_canonical_schema_and_plain_text_columns(tmp_path: Path, out: str) -> None:
    """Text columns travel dictionary-coded to the writer; on disk (one file or parts) they are
    the canonical schema's plain strings, with the table's metadata, whatever reads them."""
    from ckpred.data.table import canonical_schema

    path = tmp_path / "in.log"
    path.write_bytes(LOG)
    ingest_to_parquet(path, OP, tmp_path / out, tmp_path / "rejects.csv", chunk_bytes=512, **KW)
    files = [tmp_path / out] if out.endswith(".parquet") else sorted((tmp_path / out).glob("part-*.parquet"))
    schema = canonical_schema(OP)
    for file in files:
        read = pq.read_table(file)
        assert [(f.name, f.type) for f in read.schema] == [(f.name, f.type) for f in schema]
        assert read.schema.metadata[b"ckpred.table"] == b"canonical"
        # min/max statistics on the problem fields (filters by shape), not on the texts
        group = pq.read_metadata(file).row_group(0)
        stats = {group.column(i).path_in_schema: group.column(i).statistics for i in range(group.num_columns)}
        assert stats["m"].has_min_max and stats["m"].min <= stats["m"].max
        assert stats["kernel_name"] is None or not stats["kernel_name"].has_min_max
    whole = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    assert _table_key(whole).equals(_table_key(read_files(path, OP, **KW).table))


def test_a_run_failing_midway_leaves_the_previous_table_directory_whole(tmp_path: Path, monkeypatch: Any) -> None:
    """Parts are written beside ``out`` and swapped in at the end: a run that fails after some
    parts are written leaves the previous directory as it was, and no temporary directory."""
    from ckpred.data.ingestion import write

    path = tmp_path / "in.log"
    path.write_bytes(LOG)
    out = tmp_path / "table"
    ingest_to_parquet(path, OP, out, tmp_path / "rejects.csv", chunk_bytes=512, **KW)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert len(before) > 2

    real_write = write.TableWriter.write

    def failing_write(self: Any, table: pd.DataFrame) -> None:
        if self.parts == 2:  # two parts of the new table are on disk
            assert len(list(self.tmp.glob("part-*.parquet"))) == 2
            raise RuntimeError("killed")
        real_write(self, table)

    monkeypatch.setattr(write.TableWriter, "write", failing_write)
    path.write_bytes(LOG.replace(b"12.5", b"13.5") + LOG)  # another input: other parts
    with pytest.raises(RuntimeError, match="killed"):
        ingest_to_parquet(path, OP, out, tmp_path / "rejects.csv", chunk_bytes=256, **KW)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.log", "rejects.csv", "table"]
    monkeypatch.setattr(write.TableWriter, "write", real_write)
    summary = ingest_to_parquet(path, OP, out, tmp_path / "rejects.csv", chunk_bytes=256, **KW)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert summary.rows > 0 and after != before
    assert all(name.startswith("part-") for name in after if name != MANIFEST) and MANIFEST in after
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.log", "rejects.csv", "table"]


_REUSE_PROBE = """
import resource, sys
import numpy as np
np._core.multiarray._set_madvise_hugepage(False)  # count 4 KB faults, not huge pages
from ckpred.util import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
np.ones(1 << 24).sum()  # a 128 MB block, freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.ones(1 << 24).sum()  # the next one of the same size
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_freed_memory_is_reused_by_the_next_chunk() -> None:
    """Without the setting a freed chunk-sized block is unmapped and the next faults in all its
    pages afresh; with it, the next block reuses the freed pages."""
    import subprocess
    import sys

    pages = (1 << 27) // 4096
    faults = {}
    for mode in ("default", "keep"):
        out = subprocess.run([sys.executable, "-c", _REUSE_PROBE, mode], capture_output=True, text=True, check=True)
        kept, faults[mode] = out.stdout.split()
        assert kept == ("True" if mode == "keep" else "None")
    assert int(faults["default"]) > pages // 2
    assert int(faults["keep"]) < pages // 20


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_held_and_spilled_partition_pieces_give_the_same_table(fmt: str, monkeypatch: Any) -> None:
    """A partition's pieces held in memory, spilled to disk, or some of each (the budget full
    midway) give the table, rejects and summary of the reference; the spill files are written
    only for what does not fit the budget, and none is left behind."""
    import pyarrow as pa

    from ckpred.data.ingestion import merge

    path = WORK / f"held.{fmt}"
    path.write_bytes(SAMPLES[fmt])
    reference = read_files(path, OP, fmt=fmt, vectorised=False, **KW)
    spilled: list[str] = []
    new_file = pa.ipc.new_file

    def counted(sink: Any, *args: Any, **kwargs: Any) -> Any:
        spilled.append(str(sink))
        return new_file(sink, *args, **kwargs)

    monkeypatch.setattr(merge.pa.ipc, "new_file", counted)
    init = merge.Partitions.__init__
    written = {}
    for hold in (0, 3000, 1 << 30):
        def with_hold(self: Any, op: Any, count: int, spill: Any, hold_bytes: int = 0, hold: int = hold) -> None:
            init(self, op, count, spill, hold_bytes=hold)

        monkeypatch.setattr(merge.Partitions, "__init__", with_hold)
        spilled.clear()
        assert_stream_same(reference, *streamed(path, OP, f"held{hold}", 700, fmt=fmt, **KW))
        written[hold] = len(spilled)
        assert not any(Path(p).exists() for p in spilled)
    assert written[0] > written[3000] > written[1 << 30] == 0
