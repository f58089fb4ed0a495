"""Ingestion: every reader, every invalid/reject reason, median merge, real files, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpred.config import compose
from ckpred.data import load_table
from ckpred.data.ingest import IngestResult, expand_paths, read_files
from ckpred.data.readers import detect_format
from ckpred.data.table import canonical_columns, read_table, write_table
from ckpred.errors import ConfigValueError, InputFileError, KernelNameError
from ckpred.kernels.base import Field, OpDefinition
from ckpred.kernels.gemm_universal import OP
from ckpred.data.synthetic import write_synthetic_csv, write_synthetic_jsonl, write_synthetic_log
from tests import fixtures_gen as fg
from tests.conftest import REPO, data_file

KERNELS = fg.kernel_names(24)
SAMPLE = REPO / "tests" / "fixtures" / "sample_sweep.csv"


def read(paths: Any, **kw: Any) -> IngestResult:
    kw = {"arch": "gfx950", "dtype": "fp8", "layout": "rcr", **kw}
    return read_files(paths, OP, **kw)


def check_accounting(result: IngestResult) -> None:
    """Every record is a valid row, an invalid row or a reject; the table is canonical."""
    s = result.summary
    assert s.records == s.valid + sum(s.invalid.values()) + sum(s.rejected.values())
    assert len(result.rejects) == sum(s.rejected.values()) + s.superseded
    assert list(result.table.columns) == canonical_columns(OP)
    assert s.rows == len(result.table) and s.valid_rows == int(result.table["is_valid"].sum())
    assert (result.table.loc[~result.table["is_valid"], "tflops"] == 0).all()
    assert (result.table.loc[~result.table["is_valid"], "invalid_reason"] != "").all()
    assert (result.table.loc[result.table["is_valid"], "invalid_reason"] == "").all()


def reasons_by_key(result: IngestResult) -> dict[tuple[int, int, int, str], str]:
    t = result.table
    return {(r.m, r.n, r.k, r.kernel_name): r.invalid_reason for r in t.itertuples()}


# -- every format round-trips ------------------------------------------------------------------
def _check_rows(result: IngestResult, rows: list[fg.Measurement], *, rel: float) -> None:
    check_accounting(result)
    t = result.table
    assert len(t) == len(rows) and t["is_valid"].all() and (t["repeats"] == 1).all()
    got = {(r.m, r.n, r.k, r.kernel_name): r for r in t.itertuples()}
    for m in rows:
        row = got[m.key]
        assert row.tflops == pytest.approx(m.tflops, rel=rel)
        assert row.latency_ms == pytest.approx(m.latency_ms, rel=rel, abs=0.005 if rel else 0)
        parsed = OP.parse_name(m.kernel)
        assert all(getattr(row, f) == parsed[f] for f in OP.kernel_names)
    assert (t[["op", "arch", "dtype", "layout"]].drop_duplicates().to_numpy().tolist()
            == [["gemm_universal", "gfx950", "fp8", "rcr"]])


def test_csv_reader(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES, KERNELS[:6])
    path = fg.write_csv(tmp_path / "sweep.csv", rows)
    result = read(path)
    _check_rows(result, rows, rel=0)
    # source is file:line of the measurement (line 1 is the header)
    first = result.table.iloc[0]
    assert first["source"].endswith("sweep.csv:2") and first["kernel_name"] == rows[0].kernel
    assert first["run_id"].endswith("sweep.csv") and math.isnan(first["spread"])


def test_log_reader(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES, KERNELS[:6], decimals=2)
    path = fg.write_log(tmp_path / "bench.log", rows)
    result = read(path)
    _check_rows(result, rows, rel=1e-9)
    assert result.table["bandwidth_gbs"].notna().all()
    assert result.table.iloc[0]["source"].endswith("bench.log:4")  # after rule, header, rule


def test_big_log_helper_of_the_benchmark(tmp_path: Path) -> None:
    """The generators behind scripts/bench/ingest_speed.py write what the readers take as all valid."""
    path = write_synthetic_log(tmp_path / "big.log", 5000)
    text = path.read_text()
    assert text.count("\nShape ") + text.startswith("Shape") == 2  # 4,608 kernels per shape
    result = read(path)
    check_accounting(result)
    assert result.summary.records == result.summary.valid == 5000 and len(result.rejects) == 0
    for write in (write_synthetic_csv, write_synthetic_jsonl):  # the same rows in the other forms
        other = read(write(tmp_path / f"big_{write.__name__}", 5000))
        assert other.summary.records == other.summary.valid == 5000 and len(other.rejects) == 0
        key = ["m", "n", "k", "kernel_name"]
        assert other.table[key].equals(result.table[key])


def test_json_reader_and_failed_kernels(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:5])
    failed = [(*fg.SHAPES[0], KERNELS[5])]
    path = fg.write_json(tmp_path / "bench.json", rows, failed=failed)
    result = read(path)
    check_accounting(result)
    t = result.table
    assert len(t) == len(rows) + 1 and t["is_valid"].sum() == len(rows)
    bad = t[~t["is_valid"]].iloc[0]
    assert bad["kernel_name"] == KERNELS[5] and bad["tflops"] == 0 and bad["latency_ms"] == 0
    assert bad["invalid_reason"] == "kernel failed: kernel does not support this problem (IsSupportedArgument false)"
    # each benchmark's source is the line its object starts on
    lines = path.read_text().splitlines()
    for src in t["source"]:
        lineno = int(src.rsplit(":", 1)[1])
        assert lines[lineno - 1].strip() == "{"
        assert '"kernel_name"' in lines[lineno]


def test_parquet_roundtrip_keeps_sources_reasons_and_repeats(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:4])
    first = read([fg.write_json(tmp_path / "a.json", rows, failed=[(*fg.SHAPES[0], KERNELS[5])]),
                  fg.write_csv(tmp_path / "b.csv", rows),
                  fg.write_log(tmp_path / "c.log", fg.measurements(fg.SHAPES[:2], KERNELS[6:9], decimals=2))])
    assert (first.table["latency_ms"] == 0.0).any()  # log latency quantised to 10 us: still consistent
    out = write_table(first.table, tmp_path / "t.parquet", OP)
    again = read(out)
    check_accounting(again)
    pd.testing.assert_frame_equal(again.table, first.table)
    assert set(again.table.loc[again.table["is_valid"], "repeats"]) == {1, 2}


# -- format detection, paths -------------------------------------------------------------------
def test_detect_format_and_override(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:2])
    paths = {"csv": fg.write_csv(tmp_path / "x.txt", rows), "log": fg.write_log(tmp_path / "y.txt", rows),
             "json": fg.write_json(tmp_path / "z.txt", rows)}
    paths["parquet"] = write_table(read(paths["csv"]).table, tmp_path / "w.bin", OP)
    for fmt, path in paths.items():
        assert detect_format(path) == fmt
        assert len(read(path, fmt=fmt).table) == 2
    # A log of bare JSON rows (no header, indented) is still a log.
    bare = tmp_path / "bare.log"
    bare.write_text(fg.log_row(rows[0]) + "\n  " + fg.log_row(rows[1]) + "\n")
    assert detect_format(bare) == "log" and read(bare).summary.valid == 2
    # forcing the wrong reader is a clear file error, not a crash
    with pytest.raises(InputFileError, match="CSV header lacks column"):
        read(paths["log"], fmt="csv")
    with pytest.raises(InputFileError, match="not a readable parquet file"):
        read(paths["csv"], fmt="parquet")


def test_unknown_and_empty_files(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello world\nthis is not a benchmark\n")
    with pytest.raises(InputFileError) as err:
        read(junk)
    assert "notes.txt" in str(err.value) and "unknown format" in str(err.value) and "data.format" in str(err.value)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    result = read(empty)
    assert result.summary.records == 0 and len(result.table) == 0


def test_paths_globs_lists_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:2])
    for name in ("a.csv", "b.csv", "c.log"):
        (fg.write_log if name.endswith("log") else fg.write_csv)(tmp_path / name, rows)
    assert [p.name for p in expand_paths("*.csv")] == ["a.csv", "b.csv"]
    assert [p.name for p in expand_paths("c.log, *.csv")] == ["c.log", "a.csv", "b.csv"]
    assert [p.name for p in expand_paths(["b.csv", "a.csv", "b.csv"])] == ["b.csv", "a.csv"]
    assert read("*.csv,c.log").summary.records == 6
    with pytest.raises(InputFileError, match=r"nothing\*\.csv: no file matches this pattern"):
        read("a.csv,nothing*.csv")
    with pytest.raises(InputFileError, match="missing.csv: no such file"):
        read("missing.csv")
    with pytest.raises(InputFileError, match="is a directory"):
        read(str(tmp_path))
    with pytest.raises(ConfigValueError, match="data.format"):
        read("a.csv", fmt="xml")


# -- every invalid and reject reason -----------------------------------------------------------
def _csv_line(kernel: str, m: int, n: int, k: int, latency: Any, tflops: Any) -> str:
    return f"{kernel},0,{m},{n},{k},{latency},{tflops},{m * n}"


def test_csv_invalid_and_reject_reasons(tmp_path: Path) -> None:
    m = n = k = 1024
    flops = 2.0 * m * n * k
    lat = 0.01
    good = flops / (lat * 1e9)
    K = KERNELS
    fields = {f: OP.parse_name(K[0])[f] for f in OP.kernel_names}  # the kernel alone, not the name's dtype
    fp16_name = OP.format_name(fields, dtype="fp16", layout="rcr")
    rrr_name = OP.format_name(fields, dtype="fp8", layout="rrr")
    lines = ["kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero",
             _csv_line(K[0], m, n, k, lat, good),                       # 2 valid
             _csv_line(K[1], m, n, k, lat, "abc"),                      # 3 non-numeric
             _csv_line(K[2], m, n, k, lat, "nan"),                      # 4 NaN
             _csv_line(K[3], m, n, k, lat, "inf"),                      # 5 infinite
             _csv_line(K[4], m, n, k, lat, -good),                      # 6 negative
             _csv_line(K[5], m, n, k, lat, 0),                          # 7 zero
             _csv_line(K[6], m, n, k, -lat, good),                      # 8 negative latency
             _csv_line(K[7], m, n, k, lat, 2 * good),                   # 9 inconsistent
             _csv_line(K[8], -16, n, k, lat, good),                     # 10 negative problem field
             _csv_line("gemm_universal_fp8_rcr_bogus", m, n, k, lat, good),  # 11 reject: name
             _csv_line(fp16_name, m, n, k, lat, good),                  # 12 reject: dtype
             _csv_line(rrr_name, m, n, k, lat, good),                   # 13 reject: layout
             _csv_line(K[9], "1x", n, k, lat, good),                    # 14 reject: bad problem field
             _csv_line(K[10], m, n, k, lat, good) + ",extra",           # 15 reject: field count
             ""]
    path = tmp_path / "bad.csv"
    path.write_text("\r\n".join(lines))  # CK's csv writer uses CRLF
    result = read(path)
    check_accounting(result)
    reasons = reasons_by_key(result)
    expect = {K[0]: "", K[1]: "non-numeric value: tflops='abc'", K[2]: "NaN value: tflops",
              K[3]: "infinite value: tflops=inf", K[4]: f"negative value: tflops={-good}",
              K[5]: "zero tflops", K[6]: f"negative value: latency_ms={-lat}",
              K[7]: "inconsistent tflops: tflops="}
    for kernel, reason in expect.items():
        got = reasons[(m, n, k, kernel)]
        assert got.startswith(reason) if reason else got == "", (kernel, got)
    assert reasons[(-16, n, k, K[8])] == "negative problem field: M=-16"
    assert result.summary.valid == 1 and sum(result.summary.invalid.values()) == 8
    rejects = dict(zip(result.rejects["source"].str.rsplit(":", n=1).str[1].astype(int), result.rejects["reason"]))
    assert rejects[11].startswith("unparseable kernel name: ")
    assert rejects[12] == "dtype mismatch: kernel name says dtype=fp16, config has dtype=fp8"
    assert rejects[13] == "layout mismatch: kernel name says layout=rrr, config has layout=rcr"
    assert rejects[14] == "bad problem field: M='1x' is not an integer"
    assert rejects[15] == "wrong field count: expected 8 comma-separated fields, got 9"
    raw = result.rejects.loc[result.rejects["source"].str.endswith(":11"), "raw"].iloc[0]
    assert raw == lines[10]
    # invalid rows keep a real latency (0 where the value was not a number >= 0)
    t = result.table.set_index("kernel_name")
    assert t.loc[K[6], "latency_ms"] == 0 and t.loc[K[7], "latency_ms"] == lat


def _log_json(kernel: str, m: int, n: int, k: int, tflops: Any = 12.5, latency: Any = 0.17,
              perf: bool = True) -> str:
    obj: dict[str, Any] = {"name": kernel, "problem": {"split_k": 1, "m": m, "n": n, "k": k}}
    if perf:
        obj["perf_result"] = {"latency(ms)": latency, "tflops(TFlops)": tflops, "bandwidth(GB/s)": 100.0}
    return json.dumps(obj)


def test_log_invalid_and_reject_reasons(tmp_path: Path) -> None:
    K = KERNELS
    m, n, k = 16, 1536, 7168
    lat = 0.02
    t = round(2.0 * m * n * k / (lat * 1e9), 2)
    rule = "=" * 40
    lines = [
        json.dumps({"name": K[0], "perf_result": {"latency(ms)": lat, "tflops(TFlops)": t}}),  # 1 reject: no problem
        rule, f"Shape 0: M={m} N={n} K={k} dtype=fp8 layout=rcr", rule,                       # 2-4
        _log_json(K[1], m, n, k, t, lat),                                                     # 5 valid
        _log_json(K[2], m, n, k, t, lat)[:-7],                                                # 6 malformed JSON
        _log_json(K[3], 32, n, k, 2 * t, lat),                                                # 7 shape mismatch
        "Running the next kernel...",                                                         # 8 unrecognised
        _log_json(K[4], m, n, k, perf=False),                                                 # 9 missing perf
        _log_json(K[5], m, n, k, "fast", lat),                                                # 10 non-numeric
        _log_json(K[6], m, n, k, t, lat).replace(f'"tflops(TFlops)": {t}', '"tflops(TFlops)": NaN'),  # 11 NaN
        "Shape 1: M=abc N=1 K=1 dtype=fp8 layout=rcr",                                        # 12 bad header
        _log_json(K[7], m, n, k, t, lat),                                                     # 13 valid again
        "Shape 2: M=16 N=1536 K=7168 dtype=fp16 layout=rcr",                                  # 14 fp16 header
        _log_json(K[8], m, n, k, t, lat),                                                     # 15 reject: dtype
        "Shape 3: M=16 N=1536 K=7168 dtype=fp8 layout=rcr",                                   # 16
        json.dumps({"name": K[9], "problem": {"m": m, "n": n, "k": k},
                    "perf_result": {"latency(ms)": lat}}),                                    # 17 no tflops
        _log_json(K[10], m, n, k, t, lat).replace('"bandwidth(GB/s)": 100.0', '"bandwidth(GB/s)": -3.0'),  # 18
        _log_json(K[11], m, n, k, t, lat).replace(f'"{K[11]}"', "null"),                      # 19 no name
        "  " + _log_json(K[12], m, n, k, t, lat),                                             # 20 indented, valid
    ]
    path = tmp_path / "bad.log"
    path.write_text("\n".join(lines) + "\n")
    result = read(path)
    check_accounting(result)
    reasons = reasons_by_key(result)
    assert reasons[(m, n, k, K[1])] == "" and reasons[(m, n, k, K[7])] == ""
    assert reasons[(32, n, k, K[3])] == ("shape mismatch: shape header (line 3) says m=16 n=1536 k=7168, "
                                         "the row's problem has m=32 n=1536 k=7168")
    assert reasons[(m, n, k, K[4])] == "missing value: no perf_result object"
    assert reasons[(m, n, k, K[5])] == "non-numeric value: tflops(TFlops)='fast'"
    assert reasons[(m, n, k, K[6])] == "NaN value: tflops"
    rejects = dict(zip(result.rejects["source"].str.rsplit(":", n=1).str[1].astype(int), result.rejects["reason"]))
    assert rejects[1].startswith("missing problem field: m")
    assert rejects[6].startswith("malformed JSON: ")
    assert rejects[8].startswith("unrecognised line")
    assert rejects[12] == "bad shape header: M='abc' is not an integer"
    assert rejects[15] == "dtype mismatch: shape header (line 14) says dtype=fp16, config has dtype=fp8"
    assert reasons[(m, n, k, K[9])] == "missing value: perf_result has no 'tflops(TFlops)'"
    assert reasons[(m, n, k, K[10])] == "negative value: bandwidth_gbs=-3.0"
    assert reasons[(m, n, k, K[12])] == ""
    assert rejects[19] == "missing kernel name: got None"
    assert set(rejects) == {1, 6, 8, 12, 15, 19}


def test_json_invalid_and_reject_reasons(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:4])
    doc = fg.benchmark_json(rows)
    results = doc["results"]
    results[1]["kernel_config"]["tile_m"] += 1                            # kernel_config mismatch
    results[2]["benchmarks"][0]["m"] = 999                                # shape not in problem_sizes
    results[0]["benchmarks"].append({"note": "stray"})                     # unrecognised object
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc, indent=2))
    result = read(path)
    check_accounting(result)
    t = result.table
    by_kernel = t.groupby("kernel_name")["invalid_reason"].apply(list).to_dict()
    assert all(r.startswith("kernel_config mismatch: ") and "tile_m=" in r for r in by_kernel[KERNELS[1]])
    assert by_kernel[KERNELS[0]] == ["", ""] and by_kernel[KERNELS[3]] == ["", ""]
    mismatch = t[(t["m"] == 999)].iloc[0]
    assert mismatch["invalid_reason"] == f"shape mismatch: problem m=999 n={rows[0].n} k={rows[0].k} is not in the " \
                                         "file's problem_sizes"
    assert result.rejects["reason"].tolist() == ["unrecognised JSON object: neither a benchmark, kernel_config, "
                                                 "metadata nor problem size"]
    assert json.loads(result.rejects["raw"].iloc[0]) == {"note": "stray"}

    # A damaged block (a comma dropped inside one benchmark) rejects that benchmark only.
    text = json.dumps(fg.benchmark_json(rows), indent=2)
    damaged = f'"kernel_name": "{KERNELS[3]}"'
    start = text.index(damaged, text.index(damaged) + 1)
    cut = text.index(",", start)
    path.write_text(text[:cut] + text[cut + 1:])
    result = read(path)
    check_accounting(result)
    assert len(result.table) == len(rows) - 1 and result.table["is_valid"].all()
    assert result.rejects["reason"].str.startswith("malformed JSON: Expecting ',' delimiter").tolist() == [True]
    assert damaged in result.rejects["raw"].iloc[0]
    lineno = int(result.rejects["source"].iloc[0].rsplit(":", 1)[1])
    assert text.splitlines()[lineno - 1].strip() == "{" and damaged in text.splitlines()[lineno]

    # a benchmark without its problem, another without its time, a block nested beyond the parser
    doc = fg.benchmark_json(rows)
    del doc["results"][0]["benchmarks"][0]["m"]
    del doc["results"][0]["benchmarks"][1]["avg_time_ms"]
    text = json.dumps(doc, indent=2)
    path.write_text(text[:-1] + ', "junk": {"deep": ' + "[" * 100_000 + "}}")
    result = read(path)
    check_accounting(result)
    reasons = sorted(result.rejects["reason"])
    assert reasons[0] == "malformed JSON: nested too deeply" and reasons[1] == "missing problem field: m"
    assert result.table["invalid_reason"].tolist().count("missing value: avg_time_ms") == 1
    assert result.summary.valid == len(rows) - 2

    # metadata of another dtype rejects every benchmark of the file
    doc = fg.benchmark_json(rows)
    doc["metadata"]["dtype"] = "bf8"
    path.write_text(json.dumps(doc))
    other = read(path)
    assert other.summary.rejected == {"dtype mismatch": len(rows)} and len(other.table) == 0


def test_parquet_rows_of_another_arch_are_rejected(tmp_path: Path) -> None:
    table = read(fg.write_csv(tmp_path / "a.csv", fg.measurements(fg.SHAPES[:1], KERNELS[:3]))).table
    table.loc[1, "arch"] = "gfx942"
    path = write_table(table, tmp_path / "t.parquet", OP)
    result = read(path)
    check_accounting(result)
    assert len(result.table) == 2
    assert result.rejects["reason"].tolist() == ["arch mismatch: table row says arch=gfx942, config has arch=gfx950"]
    assert result.rejects["source"].iloc[0].endswith("t.parquet:row 2")
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(InputFileError, match="other.parquet.*not a canonical ckpred table.*kernel_name"):
        read(tmp_path / "other.parquet")


# -- merging -----------------------------------------------------------------------------------
def test_median_merge_across_files(tmp_path: Path) -> None:
    base = fg.measurements(fg.SHAPES[:2], KERNELS[:3])
    scales = (1.0, 1.1, 0.95)
    files = []
    for i, s in enumerate(scales):
        rows = [fg.Measurement(r.m, r.n, r.k, r.kernel, r.tflops * s, r.latency_ms / s) for r in base]
        files.append(fg.write_csv(tmp_path / f"run{i}.csv", rows))
    result = read(files)
    check_accounting(result)
    t = result.table
    assert len(t) == len(base) and (t["repeats"] == 3).all()
    assert result.summary.merged == 2 * len(base)
    for r, row in zip(base, t.itertuples()):
        assert row.tflops == pytest.approx(r.tflops)  # the median of x0.95, x1.0, x1.1
        assert row.spread == pytest.approx((1.1 - 0.95) * r.tflops / r.tflops)
        line = 2 + base.index(r)
        assert [Path(s).name for s in row.source.split(";")] == [f"run{i}.csv:{line}" for i in range(3)]
        assert [Path(s).name for s in row.run_id.split(";")] == ["run0.csv", "run1.csv", "run2.csv"]


def test_merge_valid_supersedes_invalid_and_all_invalid_stays(tmp_path: Path) -> None:
    m = n = k = 1024
    lat = 0.01
    good = 2.0 * m * n * k / (lat * 1e9)
    header = "kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero"
    a = tmp_path / "a.csv"
    b = tmp_path / "b.csv"
    a.write_text("\n".join([header, _csv_line(KERNELS[0], m, n, k, lat, good),
                            _csv_line(KERNELS[1], m, n, k, lat, 0)]) + "\n")
    b.write_text("\n".join([header, _csv_line(KERNELS[0], m, n, k, lat, "nan"),
                            _csv_line(KERNELS[1], m, n, k, lat, -1)]) + "\n")
    result = read([a, b], run_id="sweep-7")
    check_accounting(result)
    t = result.table.set_index("kernel_name")
    assert bool(t.loc[KERNELS[0], "is_valid"]) and t.loc[KERNELS[0], "repeats"] == 1
    assert t.loc[KERNELS[0], "tflops"] == pytest.approx(good) and math.isnan(t.loc[KERNELS[0], "spread"])
    assert not t.loc[KERNELS[1], "is_valid"] and t.loc[KERNELS[1], "repeats"] == 2
    assert t.loc[KERNELS[1], "invalid_reason"].startswith("zero tflops")
    assert t.loc[KERNELS[1], "run_id"] == "sweep-7"
    assert result.summary.superseded == 1
    sup = result.rejects[result.rejects["reason"].str.startswith("superseded")]
    assert sup["source"].iloc[0].endswith("b.csv:2") and "NaN value: tflops" in sup["reason"].iloc[0]


def test_two_name_forms_of_one_kernel_merge(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:2])
    parity = [fg.Measurement(r.m, r.n, r.k, "gemm_" + r.kernel[len("gemm_universal_"):], r.tflops * 1.02,
                             r.latency_ms / 1.02) for r in rows]
    result = read([fg.write_csv(tmp_path / "a.csv", rows), fg.write_csv(tmp_path / "b.csv", parity)])
    assert len(result.table) == 2 and (result.table["repeats"] == 2).all()
    assert set(result.table["kernel_name"]) == set(KERNELS[:2])  # canonical tile-engine names


# -- real data ---------------------------------------------------------------------------------
def test_real_parity_sweeps_merge_by_median() -> None:
    a = data_file("ck_gemm_gfx950_results", "parity_sweep_results.csv")
    b = data_file("ck_gemm_gfx950_results", "parity_sweep_results_b.csv")
    kw = {"arch": "gfx942", "dtype": "fp16"}
    ra, rb = read(a, **kw), read(b, **kw)
    for r in (ra, rb):
        check_accounting(r)
        assert (r.summary.records, r.summary.valid, r.summary.rows) == (128, 128, 128)
        assert len(r.rejects) == 0 and r.table["m"].nunique() == 4
    both = read(str(a.parent / "parity_sweep_results*.csv"), **kw)
    check_accounting(both)
    t = both.table
    assert len(t) == 128 and (t["repeats"] == 2).all() and t["is_valid"].all()
    key = ["m", "n", "k", "kernel_name"]
    joined = ra.table.merge(rb.table, on=key, suffixes=("_a", "_b"))
    joined = joined.merge(t, on=key)
    assert len(joined) == 128
    np.testing.assert_allclose(joined["tflops"], (joined["tflops_a"] + joined["tflops_b"]) / 2)
    spread = (joined["tflops_a"] - joined["tflops_b"]).abs() / joined["tflops"]
    np.testing.assert_allclose(joined["spread"], spread)
    # README section 5: median |A-B| about 0.8 %, max about 7 %
    assert 0.005 < float(np.median(spread)) < 0.012 and 0.06 < float(spread.max()) < 0.08
    # parity names are normalised to the tile-engine form and round-trip through the grammar
    raw = pd.read_csv(a)["kernel"]
    assert raw.str.startswith("gemm_fp16_rcr_").all()
    assert t["kernel_name"].str.startswith("gemm_universal_fp16_rcr_").all()
    for name in t["kernel_name"]:
        assert OP.format_name(OP.parse_name(name), dtype="fp16", layout="rcr") == name
    # ingested as the config's default fp8 they are all rejected, never mixed
    wrong = read(a, arch="gfx942")
    assert wrong.summary.rejected == {"dtype mismatch": 128} and len(wrong.table) == 0


class _ConvLikeOp(OpDefinition):
    """A minimal second op, to prove the CSV reader needs no edits for another op's columns."""

    name = "conv_like"
    problem_fields = tuple(Field(f) for f in ("n", "c", "k", "g", "hi", "wi", "y", "x", "stride_h", "stride_w",
                                               "pad_h", "pad_w")) + (Field("dilation_h", default=1),)
    kernel_fields = (Field("tile_m"), Field("tile_n"), Field("tile_k"),
                     Field("pipeline", "category", ("compv3", "compv4", "compv5")))
    group_key = ("n", "c", "k")
    families = ("all",)

    def parse_name(self, name: str) -> dict[str, Any]:
        parts = name.split("_")
        if not name.startswith("grouped_conv_forward_") or len(parts) != 7:
            raise KernelNameError(name, "expected grouped_conv_forward_<dtype>_2d_<tile>_<pipeline>")
        tm, tn, tk = (int(v) for v in parts[5].split("x"))
        return {"dtype": parts[3], "tile_m": tm, "tile_n": tn, "tile_k": tk, "pipeline": parts[6]}

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str, layout: str = "") -> str:
        return f"grouped_conv_forward_{dtype}_2d_{kernel['tile_m']}x{kernel['tile_n']}x{kernel['tile_k']}_{kernel['pipeline']}"

    def catalogue(self, arch: Any, dtype: Any, layout: Any) -> pd.DataFrame:
        raise NotImplementedError

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, **kw: Any) -> Any:
        raise NotImplementedError

    def flops(self, p: pd.DataFrame) -> np.ndarray:
        ho = (p["hi"] + 2 * p["pad_h"] - p["y"]) // p["stride_h"] + 1
        wo = (p["wi"] + 2 * p["pad_w"] - p["x"]) // p["stride_w"] + 1
        return (2.0 * p["g"] * p["n"] * p["k"] * p["c"] * ho * wo * p["y"] * p["x"]).to_numpy()

    def family(self, problems: pd.DataFrame) -> np.ndarray:
        return np.full(len(problems), "all", dtype=object)


def test_csv_reader_is_op_generic_on_real_grouped_conv_data() -> None:
    path = data_file("ck_grouped_conv_fwd_bf16_gfx950", "training_data_forward_bf16_20.csv")
    op = _ConvLikeOp()
    result = read_files(path, op, arch="gfx950", dtype="bf16", layout="rcr")
    s = result.summary
    assert s.records == 3760 and s.rejected == {} and s.invalid == {}
    assert list(result.table.columns) == canonical_columns(op)
    assert (result.table["dilation_h"] == 1).all() and set(result.table["pipeline"]) == {"compv3", "compv4"}
    # 188 problem ids of 185 distinct problems: the 3 repeated problems merge by median
    assert s.rows == 3760 - 3 * 20 and (result.table["repeats"] > 1).sum() == 3 * 20
    assert result.table["source"].str.contains(r"training_data_forward_bf16_20\.csv:\d+").all()


def test_real_grouped_conv_table_through_its_op_config(capsys: pytest.CaptureFixture[str]) -> None:
    path = data_file("ck_grouped_conv_fwd_bf16_gfx950", "benchmark_forward_300_bf16_gfx950.csv")
    cfg = compose("ingest", [f"data.path={path}", "op=grouped_conv_fwd", "dtype=bf16"])
    table = load_table(cfg)
    # 231 problem ids x 30 kernels; two ids name the same convolution, merged by median
    assert len(table) == 230 * 30 and table["is_valid"].all()
    assert (table["repeats"] == 2).sum() == 30 and table["spread"].notna().sum() == 30
    assert set(table["op"]) == {"grouped_conv_fwd"} and table["kernel_name"].nunique() == 30
    assert "6930" in capsys.readouterr().out


# -- config entry points and the CLI -----------------------------------------------------------
def test_sample_fixture_of_the_readme() -> None:
    result = read(SAMPLE)
    check_accounting(result)
    assert (result.summary.records, result.summary.valid_rows) == (20, 20)
    catalogue = set(OP.catalogue("gfx950", "fp8", "rcr")["kernel_name"])
    assert set(result.table["kernel_name"]) <= catalogue


def test_load_table_reads_paths_through_ingest(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose("ingest", [f"data.path={SAMPLE}"])
    table = load_table(cfg)
    assert len(table) == 20 and table["is_valid"].all()
    assert "records read" in capsys.readouterr().out
    cfg = compose("ingest", [f"data.path={SAMPLE}", "dtype=fp16"])
    with pytest.raises(InputFileError, match="no valid measurement.*dtype mismatch"):
        load_table(cfg)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckpred", "ingest", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.slow
def test_cli_ingest_writes_table_rejects_and_summary(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:3])
    fg.write_csv(tmp_path / "a.csv", rows)
    (tmp_path / "b.log").write_text("\n".join(fg.log_lines(fg.measurements(fg.SHAPES[:2], KERNELS[:3],
                                                                              decimals=2))) + "\nnot a row\n")
    out = _cli("data.path=[a.csv,b.log]", "out=out/t.parquet", "run_id=r1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for text in ("(csv)", "(log)", "records read", "13", "rejected", "unrecognised line", "table rows (valid)"):
        assert text in out.stdout
    table = read_table(tmp_path / "out" / "t.parquet", OP)
    assert len(table) == 6 and (table["repeats"] == 2).all() and (table["run_id"] == "r1").all()
    rejects = pd.read_csv(tmp_path / "out" / "t.rejects.csv")
    assert rejects.to_dict("records") == [{"source": "b.log:13", "reason": "unrecognised line: not a shape header, "
                                           "rule or JSON object", "raw": "not a row"}]


@pytest.mark.slow
def test_cli_ingest_fails_only_when_nothing_is_usable(tmp_path: Path) -> None:
    fg.write_csv(tmp_path / "a.csv", fg.measurements(fg.SHAPES[:1], KERNELS[:2]))
    out = _cli("data.path=a.csv", "dtype=bf16", "out=t.parquet", "rejects=why.csv", cwd=tmp_path)
    assert out.returncode == 1
    assert "no valid measurement in" in out.stderr and "dtype mismatch (2)" in out.stderr
    assert not (tmp_path / "t.parquet").exists()
    assert len(pd.read_csv(tmp_path / "why.csv")) == 2
    out = _cli("data.path=runs/*.csv", "out=t.parquet", cwd=tmp_path)
    assert out.returncode != 0 and "runs/*.csv: no file matches this pattern" in out.stderr


# -- what ingestion must question (issue 17) ---------------------------------------------------
def test_is_valid_is_read_as_true_false_strings(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:4])
    doc = fg.benchmark_json(rows)
    benches = [b for r in doc["results"] for b in r["benchmarks"]]
    benches[0]["is_valid"], benches[1]["is_valid"], benches[2]["is_valid"] = "no", "Yes", "maybe"
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc, indent=2))
    result = read(path)
    check_accounting(result)
    reasons = dict(zip(result.table["kernel_name"], result.table["invalid_reason"]))
    assert reasons[KERNELS[0]] == "kernel failed: is_valid false, no error text"
    assert reasons[KERNELS[1]] == "" and reasons[KERNELS[3]] == ""
    assert reasons[KERNELS[2]] == ("bad validity value: is_valid='maybe' is none of true/1/yes (valid) or "
                                   "false/0/no (failed)")


def test_split_k_zero_is_invalid_by_the_ops_rules(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:3], decimals=2)
    lines = fg.log_lines(rows)
    zero = [line.replace('"split_k": 1', '"split_k": 0') if line.startswith("{") and f'"m": {rows[0].m},' in line
            else line for line in lines]
    path = tmp_path / "bench.log"
    path.write_text("\n".join(zero) + "\n")
    result = read(path)
    check_accounting(result)
    t = result.table
    bad = t[t["split_k"] == 0]
    assert len(bad) == 3 and not bad["is_valid"].any()
    assert bad["invalid_reason"].str.startswith("rule violation: degenerate problem").all()
    assert t.loc[t["split_k"] == 1, "is_valid"].all() and result.summary.invalid == {"rule violation": 3}


def test_a_problem_is_judged_by_all_its_kernels_not_its_first(tmp_path: Path, monkeypatch: Any) -> None:
    # Rules that refuse the first measured kernel everywhere and every kernel on one problem:
    # the other problem stays valid (a later kernel may run it), the ruled-out one is invalid
    # on every row, each with its own rule message.
    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:3], decimals=2)
    path = tmp_path / "bench.log"
    path.write_text("\n".join(fg.log_lines(rows)) + "\n")
    dead_m = rows[0].m
    first = OP.parse_name(KERNELS[0])

    def validity(problems: pd.DataFrame, kernels: pd.DataFrame, **_: Any) -> tuple[np.ndarray, np.ndarray]:
        is_first = np.ones(len(kernels), dtype=bool)
        for name in ("tile_m", "tile_n", "tile_k", "pipeline"):
            is_first &= kernels[name].astype(object).to_numpy() == first[name]
        dead = problems["m"].to_numpy() == dead_m
        why = np.where(dead, "no kernel for this m", np.where(is_first, "not the first kernel", ""))
        assert is_first.any()  # the first kernel is among those judged
        return ~(dead | is_first), why.astype(object)

    monkeypatch.setattr(OP, "validity", validity)
    result = read(path)
    check_accounting(result)
    t = result.table
    assert len(t) == 6
    assert not t.loc[t["m"] == dead_m, "is_valid"].any()
    assert (t.loc[t["m"] == dead_m, "invalid_reason"] == "rule violation: no kernel for this m").all()
    assert t.loc[t["m"] != dead_m, "is_valid"].all()
    assert result.summary.invalid == {"rule violation": 3}


def test_a_file_of_another_arch_is_refused(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:3])
    doc = fg.benchmark_json(rows)
    doc["metadata"]["arch"] = "gfx942"
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    result = read(path)
    assert result.summary.rejected == {"arch mismatch": 3} and len(result.table) == 0
    assert result.rejects["reason"].iloc[0] == "arch mismatch: file metadata says arch=gfx942, config has arch=gfx950"
    log = tmp_path / "bench.log"
    lines = [line.replace("layout=rcr", "layout=rcr arch=gfx942") for line in fg.log_lines(rows)]
    log.write_text("\n".join(lines) + "\n")
    result = read(log)
    assert result.summary.rejected == {"arch mismatch": 3}
    assert result.rejects["reason"].iloc[0] == ("arch mismatch: shape header (line 2) says arch=gfx942, "
                                                "config has arch=gfx950")


def test_duplicate_metric_columns_are_refused(tmp_path: Path) -> None:
    path = fg.write_csv(tmp_path / "sweep.csv", fg.measurements(fg.SHAPES[:1], KERNELS[:2]))
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0] + ",TFLOPS"] + [line + ",1.0" for line in lines[1:]]) + "\n")
    with pytest.raises(InputFileError, match=r"sweep\.csv: CSV header has column 'TFLOPS' twice \(columns 7 and 9"):
        read(path)


def test_a_byte_order_mark_before_the_first_log_line_is_tolerated(tmp_path: Path) -> None:
    rows = fg.measurements(fg.SHAPES[:1], KERNELS[:2], decimals=2)
    for lines in (fg.log_lines(rows), [fg.log_row(r) for r in rows]):  # BOM before a rule, and before a row
        path = tmp_path / "bom.log"
        path.write_bytes("\ufeff".encode() + ("\n".join(lines) + "\n").encode())
        result = read(path)
        assert detect_format(path) == "log" and result.summary.valid == 2 and len(result.rejects) == 0


def test_a_truncated_json_files_loss_is_reported_against_its_metadata(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from ckpred.data.ingest import print_summary

    rows = fg.measurements(fg.SHAPES[:2], KERNELS[:5])
    text = json.dumps(fg.benchmark_json(rows), indent=2)
    cut = text.index(f'"kernel_name": "{KERNELS[3]}"')
    path = tmp_path / "bench.json"
    path.write_text(text[:cut])
    result = read(path)
    check_accounting(result)
    found = result.summary.records
    assert found < 10 and result.summary.missing == {str(path): 10 - found}
    print_summary(result.summary)
    assert f"{10 - found} record(s) its metadata declares are absent" in " ".join(capsys.readouterr().out.split())
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert read(whole).summary.missing == {}


@pytest.mark.slow
def test_ingest_never_overwrites_its_input(tmp_path: Path) -> None:
    path = fg.write_csv(tmp_path / "a.csv", fg.measurements(fg.SHAPES[:1], KERNELS[:2]))
    before = path.read_bytes()
    for args, key in ((("out=a.csv",), "out"), (("out=t.parquet", "rejects=a.csv"), "rejects"),
                      (("out=t.parquet", "rejects=t.parquet"), "rejects")):
        out = _cli("data.path=a.csv", *args, cwd=tmp_path)
        assert out.returncode != 0 and f"'{key}'" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert path.read_bytes() == before and not (tmp_path / "t.parquet").exists()


def test_a_block_tile_that_is_not_whole_warp_tiles_is_invalid_by_the_ops_rule(tmp_path: Path) -> None:
    """conf/op/gemm_universal.yaml's declared rule: a 7x7x7 tile of 3x3x3 warp tiles is refused."""
    import re

    good = KERNELS[0]
    bad = re.sub(r"_\d+x\d+x\d+_(\d+x\d+x\d+)_\d+x\d+x\d+$", r"_7x7x7_1x1x1_3x3x3", good)
    assert bad != good and bad.endswith("_7x7x7_1x1x1_3x3x3")
    path = fg.write_csv(tmp_path / "sweep.csv", fg.measurements(fg.SHAPES[:2], [good, bad]))
    result = read(path)
    check_accounting(result)
    # a kernel-field-only rule: no row of that kernel, both records rejected with the message
    assert (result.table["kernel_name"] == good).all() and result.table["is_valid"].all()
    assert list(result.rejects["reason"]) == ["impossible kernel: the block tile is not a whole number of warp tiles"] * 2
    assert result.rejects["raw"].str.startswith(bad + ",").all()


@pytest.mark.parametrize("kernels", [3, 50, 4000])
def test_group_ids_of_small_ranges_number_like_pandas(kernels: int) -> None:
    """Keys shaped like a partition's (problems x kernels x a flag, few or many kernels, rows
    in random order) number the groups as pandas' ``ngroup`` does."""
    from ckpred.data.ingest import group_ids

    rng = np.random.default_rng(kernels)
    n = 6000
    frame = pd.DataFrame({"problem": rng.integers(0, 7, n), "kernel": rng.integers(0, kernels, n),
                          "flag": rng.integers(0, 2, n).astype(bool)})
    expected = frame.groupby(list(frame.columns), sort=False).ngroup().to_numpy()
    assert group_ids([frame[c].to_numpy() for c in frame.columns]).tolist() == expected.tolist()


@given(st.lists(st.tuples(st.integers(-3, 3), st.sampled_from(["a", "b", None, float("nan")]),
                          st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(2**63 - 4, 2**63 - 1),
                                    st.integers(-2**63, -2**63 + 3)),
                          st.booleans(), st.just(7)),
                max_size=40),
       st.lists(st.integers(1, 30), min_size=40, max_size=40))
# No deadline: an example's time measures the machine's load, not group_ids (it missed the 200 ms
# default on a shared 2-core machine).
@settings(deadline=None)
def test_group_ids_number_groups_like_pandas_and_first_rows_find_their_first_row(keys: list[tuple],
                                                                                 runs: list[int]) -> None:
    """The merge key's numbering is pandas' ``ngroup`` (order of first appearance), whatever the
    columns' types and ranges (small, text with missing values, the whole int64 range or a few
    values at its ends, flags, a constant), row by row or by runs of one key (each key repeated
    ``runs`` times); ``first_rows`` is each group's first position."""
    from unittest import mock

    from ckpred.data.ingest import first_rows, group_ids
    from ckpred.data.ingestion import rows

    names = ["small", "text", "wide", "flag", "constant"]
    frame = pd.DataFrame(keys, columns=names).astype({"small": "int64", "wide": "int64", "flag": bool,
                                                      "constant": "int64"})
    for frame in (frame, frame.loc[frame.index.repeat(runs[:len(frame)])].reset_index(drop=True)):
        columns = [frame[c].to_numpy(dtype=object if c == "text" else None) for c in names]
        expected = frame.groupby(names, sort=False, dropna=False).ngroup().to_numpy()
        with mock.patch.object(rows, "_RUN_MIN_ROWS", 1):  # runs looked for at any length
            assert group_ids(columns).tolist() == expected.tolist()
        gid = group_ids(columns)
        assert gid.tolist() == expected.tolist()
        assert first_rows(gid).tolist() == (np.unique(gid, return_index=True)[1].tolist() if len(gid) else [])
