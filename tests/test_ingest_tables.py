"""Table readers and the input mapping: any CSV (gzipped too), Parquet or JSON-lines table, the
MIOpen find-db and Kernel Tuner caches, read into canonical rows through an op's ``input``."""

from __future__ import annotations

import bz2
import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pytest

from ckpred.data.ingest import IngestResult, read_files
from ckpred.data.mapping import InputMapping
from ckpred.data.readers import detect_table_format, kernel_tuner, miopen_fdb
from ckpred.data.readers.common import ReadContext
from ckpred.data.table import canonical_columns
from ckpred.errors import ConfigValueError, InputFileError, KernelNameError
from ckpred.kernels.base import Field, OpDefinition
from tests.conftest import REPO, shared_file

FIXTURES = REPO / "tests" / "fixtures"
OPS_DIR = REPO / "tests" / "ops"


class _TableOp(OpDefinition):
    """A small op of the kind a table reader serves: a dtype problem field, template names."""

    name = "tmm"
    kernel_fields = (Field("block_m"), Field("block_n"), Field("num_warps"))
    families = ("all",)

    def __init__(self, *, with_dtype: bool = True, flops: bool = True) -> None:
        fields = [Field("m"), Field("n"), Field("k")]
        if with_dtype:
            fields.append(Field("dtype", "category", ("fp16", "bf16", "fp32")))
        self.problem_fields = tuple(fields)
        self.group_key = tuple(f.name for f in fields)
        self._with_flops = flops

    def parse_name(self, name: str) -> dict[str, Any]:
        try:
            bm, bn, w = name.split("_")
            return {"block_m": int(bm[2:]), "block_n": int(bn[2:]), "num_warps": int(w[1:])}
        except ValueError:
            raise KernelNameError(name, "expected bm<int>_bn<int>_w<int>") from None

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str = "", layout: str = "") -> str:
        return f"bm{int(kernel['block_m'])}_bn{int(kernel['block_n'])}_w{int(kernel['num_warps'])}"

    def catalogue(self, arch: Any, dtype: Any, layout: Any) -> pd.DataFrame:
        raise ValueError("no catalogue")

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, **kw: Any) -> Any:
        return np.ones(len(problems), dtype=bool), np.full(len(problems), "", dtype=object)

    def flops(self, p: pd.DataFrame) -> np.ndarray:
        if not self._with_flops:
            return np.full(len(p), np.nan)
        return 2.0 * p["m"].to_numpy(np.float64) * p["n"].to_numpy(np.float64) * p["k"].to_numpy(np.float64)

    def family(self, problems: pd.DataFrame) -> np.ndarray:
        return np.full(len(problems), "all", dtype=object)


def _mapping(columns: Mapping[str, Any] | None = None, **kw: Any) -> InputMapping:
    cfg = {"input": {"format": kw.pop("format", "auto"), "columns": dict(columns or {})},
           "metric": {"column": kw.pop("metric", "time"), "better": kw.pop("better", "lower"),
                      "unit": kw.pop("unit", "ms")},
           "failure": {"metric_values": kw.pop("failures", ["inf", "nan", "missing"]),
                       "valid_column": kw.pop("valid_column", None)}}
    assert not kw
    return InputMapping.from_config(cfg)


def _read(paths: Any, op: OpDefinition, mapping: InputMapping) -> IngestResult:
    return read_files(paths, op, arch="gfx950", dtype="fp16", layout="rcr", mapping=mapping)


def _accounting(result: IngestResult, op: OpDefinition) -> None:
    s = result.summary
    assert s.records == s.valid + sum(s.invalid.values()) + sum(s.rejected.values())
    assert len(result.rejects) == sum(s.rejected.values()) + s.superseded
    assert list(result.table.columns) == canonical_columns(op)
    assert s.rows == len(result.table) and s.valid_rows == int(result.table["is_valid"].sum())


# -- a gzipped CSV with unfamiliar names, ms times, inf failures, mixed dtypes ----------------------
UNFAMILIAR = ["M", "N", "K", "DTYPE", "BLOCK_M", "BLOCK_N", "WARPS", "ms"]
TMM_YAML = """
defaults:
  - base_op
  - _self_
name: tmm
problem_fields:
  m: {kind: int}
  n: {kind: int}
  k: {kind: int}
  dtype: {kind: categorical, values: [fp16, bf16, fp32]}
kernel_fields:
  block_m: {kind: int}
  block_n: {kind: int}
  num_warps: {kind: int}
kernel_id: {template: "bm{block_m}_bn{block_n}_w{num_warps}"}
metric: {column: time, better: lower, unit: ms}
failure: {metric_values: [inf, nan, missing]}
flops: "2 * m * n * k"
keys: {query: [m, n, k, dtype], cv_group: [m, n, k], breakdowns: [dtype]}
input:
  columns: {m: M, n: N, k: K, dtype: DTYPE, block_m: BLOCK_M, block_n: BLOCK_N, num_warps: WARPS, time: ms}
"""
SHAPES = ((128, 256, 512), (1024, 1024, 64))
KERNELS = ((64, 64, 4), (128, 64, 4), (64, 128, 8), (128, 128, 8))


def _sweep_rows() -> list[list[Any]]:
    """2 shapes x 3 dtypes x 4 kernels, kernel 3 failing (inf) on the fp32 rows."""
    rows = []
    for (m, n, k), dtype in ((s, d) for s in SHAPES for d in ("fp16", "bf16", "fp32")):
        for j, (bm, bn, w) in enumerate(KERNELS):
            scale = 1 + ("fp16", "bf16", "fp32").index(dtype)
            ms = "inf" if (dtype == "fp32" and j == 3) else f"{0.01 * (j + 1) * scale:.6f}"
            rows.append([m, n, k, dtype, bm, bn, w, ms])
    return rows


def _write_csv_gz(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    with gzip.open(path, "wt") as fh:
        fh.write(",".join(header) + "\n")
        for r in rows:
            fh.write(",".join(str(v) for v in r) + "\n")
    return path


def _extra_rows() -> list[list[Any]]:
    repeat = [128, 256, 512, "fp16", 64, 64, 4, "0.012000"]  # a repeat of the first row: merged by median
    other_dtype = [128, 256, 512, "fp64", 64, 64, 4, "0.01"]  # not one of the op's dtypes: rejected
    return [repeat, other_dtype]


def test_gzipped_csv_with_unfamiliar_names_through_a_config_dir_op(tmp_path: Path) -> None:
    pytest.importorskip("ckpred.kernels.declared")
    from ckpred.config import compose
    from ckpred.data import load_table

    root = tmp_path / "conf"
    (root / "op").mkdir(parents=True)
    (root / "op" / "tmm.yaml").write_text(TMM_YAML)
    path = _write_csv_gz(tmp_path / "sweep.csv.gz", UNFAMILIAR, _sweep_rows() + _extra_rows())
    cfg = compose("ingest", [f"hydra.searchpath=[file://{root}]", "op=tmm", f"data.path={path}"])
    from ckpred.data.ingest import read_config_inputs

    op, result = read_config_inputs(cfg)
    _accounting(result, op)
    s = result.summary
    assert s.formats == ["csv"]
    assert (s.records, s.valid, s.invalid, s.rejected, s.merged) == (26, 23, {"kernel failed": 2},
                                                                      {"bad problem field": 1}, 1)
    t = result.table
    assert (s.rows, s.valid_rows) == (24, 22) == (len(t), int(t["is_valid"].sum()))
    assert sorted(t["dtype"].unique()) == ["bf16", "fp16", "fp32"] and list(t.columns[:2]) == ["op", "arch"]
    # repeats merge only within one dtype: each (shape, dtype, kernel) is one row
    assert not t.duplicated(["m", "n", "k", "dtype", "kernel_name"]).any()
    first = t[(t["m"] == 128) & (t["dtype"] == "fp16") & (t["kernel_name"] == "bm64_bn64_w4")].iloc[0]
    assert first["repeats"] == 2 and first["latency_ms"] == pytest.approx(0.011)
    flops = 2 * 128 * 256 * 512
    assert first["tflops"] == pytest.approx(np.median([flops / (0.01 * 1e9), flops / (0.012 * 1e9)]))
    failed = t[~t["is_valid"]]
    assert set(failed["dtype"]) == {"fp32"} and set(failed["kernel_name"]) == {"bm128_bn128_w8"}
    assert failed["invalid_reason"].str.startswith("kernel failed: time='inf'").all()
    assert result.rejects["reason"].tolist() == [
        "bad problem field: dtype='fp64' is not one of ['fp16', 'bf16', 'fp32']"]
    assert len(load_table(cfg)) == 24


# -- the column map ---------------------------------------------------------------------------------
def _frame() -> pd.DataFrame:
    rows = _sweep_rows()
    return pd.DataFrame(rows, columns=UNFAMILIAR)


RENAMES = {"m": "M", "n": "N", "k": "K", "dtype": "DTYPE", "block_m": "BLOCK_M", "block_n": "BLOCK_N"}


def test_csv_parquet_and_jsonl_read_alike_with_rename_constant_and_derived(tmp_path: Path) -> None:
    frame = _frame().drop(columns=["WARPS"])
    frame["us"] = pd.to_numeric(frame["ms"]) * 1000
    frame = frame.drop(columns=["ms"])
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    with open(tmp_path / "t.jsonl", "w") as fh:
        fh.write("\ufeff")  # a byte-order mark before the first line is tolerated
        for rec in frame.to_dict("records"):
            fh.write(json.dumps(rec) + "\n")
        fh.write("{not json\n")
    # time derived from microseconds; num_warps a constant; block_m twice the source (to see the order)
    mapping = _mapping({**RENAMES, "num_warps": {"value": 4}, "time": {"expr": "us / 1000"},
                        "block_m": {"expr": "half_m * 2"}, "half_m": {"expr": "BLOCK_M / 2"}})
    op = _TableOp()
    tables = {}
    for name in ("t.csv", "t.parquet", "t.jsonl"):
        result = _read(tmp_path / name, op, mapping)
        _accounting(result, op)
        tables[name] = result.table.drop(columns=["source", "run_id"])
        assert detect_table_format(tmp_path / name) == {"csv": "csv", "parquet": "parquet", "jsonl": "jsonl"}[
            name.split(".")[1]]
    pd.testing.assert_frame_equal(tables["t.csv"], tables["t.parquet"])
    pd.testing.assert_frame_equal(tables["t.csv"], tables["t.jsonl"])
    t = tables["t.csv"]
    assert (t["num_warps"] == 4).all() and len(t) == 24
    assert set(t["block_m"]) == {64, 128}
    jsonl = _read(tmp_path / "t.jsonl", op, mapping)
    assert jsonl.rejects["reason"].str.startswith("malformed JSON").tolist() == [True]
    assert jsonl.rejects["source"].iloc[0].endswith("t.jsonl:25")


def test_a_cycle_of_derived_columns_is_refused_naming_it(tmp_path: Path) -> None:
    _frame().to_csv(tmp_path / "t.csv", index=False)
    mapping = _mapping({**RENAMES, "num_warps": "WARPS", "time": {"expr": "a / 1000"}, "a": {"expr": "b + 1"},
                        "b": {"expr": "a * 2"}})
    with pytest.raises(ConfigValueError, match=r"op\.input\.columns\.(a|b).*(a -> b -> a|b -> a -> b)"):
        _read(tmp_path / "t.csv", _TableOp(), mapping)


def test_input_columns_are_checked_without_a_file() -> None:
    from ckpred.data.mapping import check_input_columns

    order = check_input_columns({"m": "M", "time": {"expr": "us / scale"}, "scale": {"expr": "1000"},
                                 "us": {"expr": "us * 1"}, "n": {"value": 4}})
    assert order.index("scale") < order.index("time")  # a self-reference reads the source column
    with pytest.raises(ConfigValueError, match=r"op\.input\.columns\.a.*a -> b -> a"):
        check_input_columns({"a": {"expr": "b + 1"}, "b": {"expr": "a * 2"}})
    with pytest.raises(ConfigValueError, match=r"op\.input\.columns\.t\b"):
        check_input_columns({"t": {"column": "x"}})


def test_missing_duplicated_and_unknown_columns_are_named(tmp_path: Path) -> None:
    op = _TableOp()
    _frame().to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(InputFileError, match=r"t\.csv.*needs the kernel field column\(s\) \['num_warps'\].*'WARPS'"):
        _read(tmp_path / "t.csv", op, _mapping({**RENAMES, "time": "ms"}))
    with pytest.raises(InputFileError, match=r"reads column 'WARPZ' \(op\.input\.columns\.num_warps\)"):
        _read(tmp_path / "t.csv", op, _mapping({**RENAMES, "time": "ms", "num_warps": "WARPZ"}))
    with pytest.raises(InputFileError, match=r"expression of op\.input\.columns reads 'msec'"):
        _read(tmp_path / "t.csv", op, _mapping({**RENAMES, "num_warps": "WARPS", "time": {"expr": "msec * 1"}}))
    # two metric columns of one name: which one is meant cannot be known
    text = (tmp_path / "t.csv").read_text().splitlines()
    dup = [text[0] + ",ms"] + [line + ",9.9" for line in text[1:]]
    (tmp_path / "dup.csv").write_text("\n".join(dup) + "\n")
    with pytest.raises(InputFileError, match=r"column 'ms' appears 2 times.*op\.input\.columns\.time"):
        _read(tmp_path / "dup.csv", op, _mapping({**RENAMES, "time": "ms", "num_warps": "WARPS"}))


def test_a_text_column_the_op_does_not_read_cannot_merge_different_problems(tmp_path: Path) -> None:
    """Without a dtype field, the mixed-dtype table would fold three dtypes into one median."""
    _frame().to_csv(tmp_path / "t.csv", index=False)
    columns = {k: v for k, v in RENAMES.items() if k != "dtype"} | {"num_warps": "WARPS", "time": "ms"}
    with pytest.raises(InputFileError, match=r"column 'DTYPE' is not read by op 'tmm' but differs between records.*"
                                             r"\['bf16', 'fp16', 'fp32'\]"):
        _read(tmp_path / "t.csv", _TableOp(with_dtype=False), _mapping(columns))
    # with dtype as a problem field every dtype is its own row
    result = _read(tmp_path / "t.csv", _TableOp(), _mapping({**RENAMES, "num_warps": "WARPS", "time": "ms"}))
    assert result.summary.merged == 0 and len(result.table) == 24
    assert result.summary.merge_key == ("m", "n", "k", "dtype")


@pytest.mark.parametrize("where", ["chunks", "files", "streamed"])
def test_a_hidden_field_is_found_across_chunks_and_files(where: str, tmp_path: Path) -> None:
    """The repeats a text column tells apart may lie in different chunks of a file or in
    different files (sorted by dtype): they are compared where they are merged."""
    frame = _frame().sort_values("DTYPE", kind="stable")
    columns = {k: v for k, v in RENAMES.items() if k != "dtype"} | {"num_warps": "WARPS", "time": "ms"}
    if where == "files":
        paths = []
        for dtype, part in frame.groupby("DTYPE"):
            part.to_csv(tmp_path / f"{dtype}.csv", index=False)
            paths.append(tmp_path / f"{dtype}.csv")
    else:
        frame.to_csv(tmp_path / "t.csv", index=False)
        paths = [tmp_path / "t.csv"]
    # one dtype per chunk: no chunk alone shows two values
    chunk = 64 if where != "files" else 1 << 20
    op, mapping = _TableOp(with_dtype=False), _mapping(columns)
    with pytest.raises(InputFileError, match=r"column 'DTYPE' is not read by op 'tmm' but differs"):
        if where == "streamed":
            from ckpred.data.ingest import ingest_to_parquet

            ingest_to_parquet(paths, op, tmp_path / "o.parquet", tmp_path / "o.rejects.csv", arch="gfx950",
                              dtype="fp16", layout="rcr", mapping=mapping, chunk_bytes=chunk)
        else:
            read_files(paths, op, arch="gfx950", dtype="fp16", layout="rcr", mapping=mapping, chunk_bytes=chunk)
    # a column of free text (more values in the file than a field has) is not judged, though
    # each chunk holds few of them
    runs = pd.concat([frame.assign(DTYPE="fp16")] * 3, ignore_index=True)
    runs["note"] = [f"run {i}" for i in range(len(runs))]
    runs.to_csv(tmp_path / "n.csv", index=False)
    result = read_files(tmp_path / "n.csv", op, arch="gfx950", dtype="fp16", layout="rcr", mapping=mapping,
                        chunk_bytes=64)
    assert result.summary.merged >= 2 * len(frame)  # merged, not refused


def test_failure_encodings_and_validity_strings(tmp_path: Path) -> None:
    lines = ["m,n,k,dtype,block_m,block_n,num_warps,time,ok",
             "64,64,64,fp16,64,64,4,0.01,true",     # 2 valid
             "64,64,64,fp16,64,64,8,0.02,No",       # 3 failed by the validity column
             "64,64,64,fp16,128,64,4,0.02,maybe",   # 4 neither true nor false
             "64,64,64,fp16,128,64,8,inf,yes",      # 5 inf: a declared failure
             "64,64,64,fp16,64,128,4,nan,1",        # 6 nan: not declared -> NaN value
             "64,64,64,fp16,64,128,8,,1",           # 7 missing: declared
             "64,64,64,fp16,128,128,4,0,1",         # 8 zero time
             "64,64,64,fp16,128,128,8,fast,1",      # 9 non-numeric
             "64,64,64,fp16,256,64,4,-1,1",         # 10 negative
             "64,64,x64,fp16,256,64,8,0.01,1",      # 11 reject: k not an integer
             "64,64,64,fp16,256,128,4.5,0.01,1"]    # 12 reject: num_warps not an integer
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    result = _read(tmp_path / "f.csv", _TableOp(), _mapping(failures=["inf", "missing"], valid_column="ok"))
    _accounting(result, _TableOp())
    reasons = dict(zip(result.table["kernel_name"], result.table["invalid_reason"]))
    assert reasons["bm64_bn64_w4"] == ""
    assert reasons["bm64_bn64_w8"] == "kernel failed: ok='No'"
    assert reasons["bm128_bn64_w4"].startswith("bad validity value: ok='maybe' is none of ['true', '1', 'yes']")
    assert reasons["bm128_bn64_w8"].startswith("kernel failed: time='inf' (a failure encoding of the op: inf)")
    assert reasons["bm64_bn128_w4"] == "NaN value: time"
    assert reasons["bm64_bn128_w8"].startswith("kernel failed: time=''")
    assert reasons["bm128_bn128_w4"] == "zero time: time=0, a kernel that ran cannot take no time"
    assert reasons["bm128_bn128_w8"] == "non-numeric value: time='fast'"
    assert reasons["bm256_bn64_w4"] == "negative value: time=-1"
    assert sorted(result.rejects["reason"]) == ["bad kernel field: num_warps='4.5' is not an integer",
                                                "bad problem field: k='x64' is not an integer"]
    assert result.summary.valid == 1 and result.summary.invalid["kernel failed"] == 3


def test_a_throughput_metric_without_flops_leaves_latency_unknown(tmp_path: Path) -> None:
    lines = ["m,n,k,dtype,block_m,block_n,num_warps,gflops", "64,64,64,fp16,64,64,4,1500", "64,64,64,fp16,64,64,8,0"]
    (tmp_path / "g.csv").write_text("\n".join(lines) + "\n")
    result = _read(tmp_path / "g.csv", _TableOp(flops=False),
                   _mapping(metric="gflops", better="higher", unit="gflops", failures=["zero"]))
    t = result.table.set_index("kernel_name")
    assert t.loc["bm64_bn64_w4", "tflops"] == pytest.approx(1.5) and math.isnan(t.loc["bm64_bn64_w4", "latency_ms"])
    assert bool(t.loc["bm64_bn64_w4", "is_valid"]) and not t.loc["bm64_bn64_w8", "is_valid"]
    with pytest.raises(ConfigValueError, match="op.metric.unit"):
        _read(tmp_path / "g.csv", _TableOp(), _mapping(metric="gflops", better="lower", unit="gflops"))


def test_a_time_metric_without_flops_ranks_by_latency(tmp_path: Path) -> None:
    _frame().to_csv(tmp_path / "t.csv", index=False)
    result = _read(tmp_path / "t.csv", _TableOp(flops=False), _mapping({**RENAMES, "num_warps": "WARPS", "time": "ms"}))
    t = result.table[result.table["is_valid"]]
    np.testing.assert_allclose(t["tflops"], 1.0 / t["latency_ms"])  # perf ratios are latency ratios


def test_a_per_row_arch_keeps_two_gpus_apart(tmp_path: Path) -> None:
    frame = _frame()
    both = pd.concat([frame.assign(gpu_arch="gfx90a"), frame.assign(gpu_arch="gfx942")], ignore_index=True)
    both.loc[0, "gpu_arch"] = ""
    both.to_csv(tmp_path / "t.csv", index=False)
    mapping = _mapping({**RENAMES, "num_warps": "WARPS", "time": "ms", "arch": "gpu_arch"})
    result = _read(tmp_path / "t.csv", _TableOp(), mapping)
    _accounting(result, _TableOp())
    t = result.table
    assert result.summary.merged == 0 and len(t) == 47 and t.groupby("arch").size().to_dict() == {"gfx90a": 23,
                                                                                                  "gfx942": 24}
    assert result.summary.merge_key == ("m", "n", "k", "dtype", "arch")
    assert result.rejects["reason"].iloc[0].startswith("bad arch: arch='' is not a config name")


# -- MIOpen find-db --------------------------------------------------------------------------------
def _ctx(label: str = "f") -> ReadContext:
    return ReadContext(op=None, resolver=None, dtype="", layout="", arch="", label=label)  # type: ignore[arg-type]


def test_miopen_key_is_read_as_the_forward_convolution() -> None:
    f = miopen_fdb.parse_key("512-28-28-1x1-1024-14-14-16-0x0-2x2-1x1-0-NCHW-FP32-F")
    b = miopen_fdb.parse_key("1024-14-14-1x1-512-28-28-16-0x0-2x2-1x1-0-NCHW-FP32-B")
    geometry = ["c", "hi", "wi", "k", "ho", "wo", "n", "y", "x", "pad_h", "pad_w", "stride_h", "stride_w"]
    assert [f[g] for g in geometry] == [b[g] for g in geometry] == [512, 28, 28, 1024, 14, 14, 16, 1, 1, 0, 0, 2, 2]
    assert (f["direction"], b["direction"], f["groups"], f["spatial_dims"]) == ("F", "B", 1, 2)
    g = miopen_fdb.parse_key("64-56-56-3x3-64-56-56-8-1x1-1x1-1x1-0-NHWC-NHWC-NHWC-FP16-W_g32")
    assert (g["layout"], g["groups"], g["dtype"]) == ("NHWC-NHWC-NHWC", 32, "FP16")
    d3 = miopen_fdb.parse_key("1-1-1-1-1x4x4-512-1-4-4-256-0x0x0-1x1x1-1x1x1-0-NCDHW-FP32-B")
    assert (d3["spatial_dims"], d3["c"], d3["di"], d3["k"], d3["z"]) == (3, 512, 1, 1, 1)
    for bad, why in (("512-28-28-1x1-1024-14-14-16-0x0-2x2-1x1-0-NCHW-FP32-Q", "direction 'Q'"),
                     ("512-28-28-1x1x1-1024-14-14-16-0x0-2x2-1x1-0-NCHW-FP32-F", "filter '1x1x1'"),
                     ("512-28-28-1x1-1024-14-14-16-0x0-2x2-1x1-0-NCHW-FP32-F_zz", "suffix 'zz'")):
        with pytest.raises(miopen_fdb.FindDbKeyError, match=why):
            miopen_fdb.parse_key(bad)


def test_miopen_reader_on_the_fixture(tmp_path: Path) -> None:
    path = tmp_path / "small.fdb.txt.bz2"
    path.write_bytes(bz2.compress((FIXTURES / "miopen_small.fdb.txt").read_bytes()))
    assert detect_table_format(path) == "miopen_fdb"
    raw = miopen_fdb.read(path, _ctx("small"))
    assert len(raw.frame) == 16 and raw.frame["key"].nunique() == 8
    assert [(r.source, r.reason.split(":")[0]) for r in raw.rejects] == [
        ("small:9", "unrecognised line"), ("small:10", "bad find-db key"), ("small:11", "bad solver entry")]
    fwd = raw.frame[raw.frame["key"].str.endswith("FP32-F")]
    assert fwd["solver"].tolist()[0] == "ConvAsmImplicitGemmGTCDynamicFwdXdlopsNHWC"
    assert fwd["time_ms"].tolist()[0] == "0.088804" and raw.source_texts()[0] == "small:1"


def _compose_op(name: str, path: Path, *extra: str) -> Any:
    pytest.importorskip("ckpred.kernels.declared")
    from ckpred.config import compose

    return compose("ingest", [f"hydra.searchpath=[file://{OPS_DIR}]", f"op={name}", f"data.path={path}", *extra])


def test_miopen_conv_op_reads_the_fixture_with_no_python(tmp_path: Path) -> None:
    path = tmp_path / "small.fdb.txt"
    shutil.copy(FIXTURES / "miopen_small.fdb.txt", path)
    from ckpred.data.ingest import read_config_inputs

    op, result = read_config_inputs(_compose_op("miopen_conv", path))
    _accounting(result, op)
    s = result.summary
    assert (s.records, s.valid, sum(s.invalid.values()), sum(s.rejected.values())) == (19, 13, 1, 5)
    assert s.rejected == {"bad problem field": 2, "unrecognised line": 1, "bad find-db key": 1, "bad solver entry": 1}
    t = result.table
    zero = t[~t["is_valid"]].iloc[0]
    assert (zero["solver"], zero["groups"]) == ("GemmFwd1x1_0_1", 2)
    assert zero["invalid_reason"].startswith("kernel failed: time_ms='0'")
    assert op.shape_keys(t).nunique() == 6
    # one convolution: its F, B, W problems and the FP16 variant share one CV group
    conv = t[(t["c"] == 512) & (t["k"] == 1024)]
    assert sorted(set(zip(conv["direction"], conv["dtype"]))) == [("B", "FP32"), ("F", "FP16"), ("F", "FP32"),
                                                                ("W", "FP32")]
    assert op.cv_group_keys(conv).nunique() == 1


# -- Kernel Tuner caches -----------------------------------------------------------------------------
def test_kernel_tuner_reader_on_the_fixture(tmp_path: Path) -> None:
    text = (FIXTURES / "kernel_tuner_small.json").read_text()
    path = tmp_path / "conv_W7800.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert detect_table_format(path) == "kernel_tuner"
    raw = kernel_tuner.read(path, _ctx())
    f = raw.frame
    assert len(f) == 6 and raw.rejects == [] and (f["gpu"] == "W7800").all() and (f["arch"] == "gfx1100").all()
    assert f["status"].tolist() == ["ok"] * 5 + ["CompilationFailedConfig"] and f["time"].iloc[5] == ""
    assert f["config"].iloc[0] == "16,1,1,1,0,0,0,1,15,15" and "times" not in f
    # a cache with an empty device name is named by its file (caches are stored as <GPU>.json.gz)
    doc = json.loads(text)
    doc["device_name"] = ""
    (tmp_path / "convolution_milo_MI250X.json").write_text(json.dumps(doc))
    named = kernel_tuner.read(tmp_path / "convolution_milo_MI250X.json", _ctx()).frame
    assert set(named["gpu"]) == {"MI250X"} and set(named["arch"]) == {"gfx90a"}
    # an entry whose parameters disagree with its key is rejected
    doc["cache"]["16,1,1,1,0,0,0,1,15,15"]["block_size_x"] = 32
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    bad = kernel_tuner.read(tmp_path / "bad.json", _ctx())
    assert len(bad.frame) == 5
    assert bad.rejects[0].reason.startswith("config mismatch: cache key '16,1,1,1,0,0,0,1,15,15'")


@pytest.mark.parametrize(("device", "gpu", "arch"), [
    ("AMD Radeon PRO W6600", "W6600", "gfx1032"), ("AMD Instinct MI250X", "MI250X", "gfx90a"),
    ("NVIDIA A100-PCIE-40GB", "A100", "sm80_a100"), ("NVIDIA RTX A4000", "A4000", "sm86_a4000"),
    ("NVIDIA RTX A6000", "A6000", "sm86_a6000"), ("NVIDIA H100 80GB HBM3", "H100", "sm90_h100"),
    ("NVIDIA GeForce RTX 4090", "4090", ""),  # a GPU without a packaged arch config: no arch
])
def test_a_cache_s_device_names_its_gpu_and_arch(device: str, gpu: str, arch: str) -> None:
    """The model word of the device name, memory and board words dropped, names the arch config."""
    from ckpred.data.readers.common import arch_for_device

    assert kernel_tuner.gpu_name(device, Path("x_OTHER.json.gz")) == gpu
    assert arch_for_device(gpu) == arch


def test_a_truncated_kernel_tuner_cache_keeps_what_precedes_the_cut(tmp_path: Path) -> None:
    data = gzip.compress((FIXTURES / "kernel_tuner_small.json").read_bytes())
    path = tmp_path / "W7800.json.gz"
    path.write_bytes(data[: int(len(data) * 0.8)])
    raw = kernel_tuner.read(path, _ctx())
    assert 0 < len(raw.frame) < 6 and len(raw.rejects) == 1
    assert raw.rejects[0].reason.startswith("malformed JSON: ") and f"after {len(raw.frame)} cache entries" in \
        raw.rejects[0].reason


def test_kernel_tuner_conv_op_reads_the_fixture_with_no_python(tmp_path: Path) -> None:
    path = tmp_path / "W7800.json"
    shutil.copy(FIXTURES / "kernel_tuner_small.json", path)
    from ckpred.data.ingest import read_config_inputs

    op, result = read_config_inputs(_compose_op("kernel_tuner_conv", path))
    _accounting(result, op)
    t = result.table
    assert (result.summary.valid, result.summary.invalid) == (5, {"kernel failed": 1})
    assert t.loc[~t["is_valid"], "invalid_reason"].tolist() == ["kernel failed: status='CompilationFailedConfig'"]
    assert t["kernel_name"].iloc[0] == "(16,1,1,1,0,0,0,1,15,15)" and set(t["gpu"]) == {"W7800"}
    assert set(t["arch"]) == {"gfx1100"}  # the row's own arch, not the run's (gfx950)
    assert t.loc[t["is_valid"], "latency_ms"].min() == pytest.approx(0.9)


# -- the real files ----------------------------------------------------------------------------------
def test_real_miopen_find_db_gfx942() -> None:
    path = shared_file("miopen_find_db", "gfx942130.HIP.fdb.txt.bz2")
    raw = miopen_fdb.read(path, _ctx())
    assert (len(raw.frame), raw.frame["key"].nunique(), len(raw.rejects)) == (37792, 9600, 0)
    per_problem = raw.frame.groupby("key").size()
    assert (per_problem.min(), per_problem.max()) == (2, 6)
    keys = raw.frame.drop_duplicates("key")
    assert keys["direction"].value_counts().to_dict() == {"F": 3391, "W": 3137, "B": 3072}
    assert keys["dtype"].value_counts().to_dict() == {"FP32": 4924, "FP16": 4676}
    assert (keys["groups"] > 1).sum() == 1572 and (keys["layout"] != "NCHW").sum() == 45
    # in every stride-2 backward problem the forward input (hi) is at least the output (ho)
    bwd = keys[(keys["direction"] != "F") & (keys["stride_h"] == 2)]
    assert len(bwd) == 661 and (bwd["hi"] > bwd["ho"]).all()


def test_real_kernel_tuner_caches() -> None:
    counts = {}
    for gpu in ("MI250X", "W6600", "W7800"):
        raw = kernel_tuner.read(shared_file("kernel_tuner_amd", f"convolution_milo_{gpu}.json.gz"), _ctx())
        f = raw.frame
        assert raw.rejects == [] and set(f["gpu"]) == {gpu}
        ok = f["status"] == "ok"
        counts[gpu] = (len(f), int((~ok).sum()), round(float(pd.to_numeric(f.loc[ok, "time"]).min()), 4))
    assert counts == {"MI250X": (4362, 0, 0.6588), "W6600": (4362, 0, 1.7276), "W7800": (4362, 116, 0.8161)}


def test_real_nvidia_kernel_tuner_caches() -> None:
    counts = {}
    for gpu in ("A100", "A4000", "A6000"):
        raw = kernel_tuner.read(shared_file("kernel_tuner_nvidia", f"convolution_milo_{gpu}.json.gz"), _ctx())
        f = raw.frame
        assert raw.rejects == [] and set(f["gpu"]) == {gpu}
        ok = f["status"] == "ok"
        counts[gpu] = (len(f), int((~ok).sum()), round(float(pd.to_numeric(f.loc[ok, "time"]).min()), 3),
                       f["arch"].iloc[0])
    assert counts == {"A100": (4362, 161, 0.554, "sm80_a100"), "A4000": (4362, 161, 1.021, "sm86_a4000"),
                      "A6000": (4362, 473, 0.603, "sm86_a6000")}


@pytest.mark.slow
def test_real_find_db_and_caches_through_their_ops() -> None:
    from ckpred.data.ingest import read_config_inputs

    path = shared_file("miopen_find_db", "gfx942130.HIP.fdb.txt.bz2")
    op, result = read_config_inputs(_compose_op("miopen_conv", path))
    _accounting(result, op)
    s = result.summary
    # the 45 problems in NHWC (126 solver entries) are outside the 2-D NCHW op, by name
    assert (s.records, s.valid, s.invalid, s.rejected, s.merged) == (37792, 37666, {}, {"bad problem field": 126}, 0)
    t = result.table
    assert op.shape_keys(t).nunique() == 9555 and op.cv_group_keys(t).nunique() == 1940
    assert result.rejects["reason"].str.startswith("bad problem field: layout='NHWC-NHWC-NHWC'").all()

    caches = shared_file("kernel_tuner_amd", "convolution_milo_MI250X.json.gz").parent / "convolution_milo_*.json.gz"
    op, result = read_config_inputs(_compose_op("kernel_tuner_conv", caches))
    _accounting(result, op)
    s = result.summary
    assert (s.records, s.valid, s.invalid, s.rejected) == (13086, 12970, {"kernel failed": 116}, {})
    t = result.table
    assert t.groupby("gpu")["arch"].first().to_dict() == {"MI250X": "gfx90a", "W6600": "gfx1032", "W7800": "gfx1100"}
    assert t.groupby("gpu")["kernel_name"].nunique().to_dict() == {"MI250X": 4362, "W6600": 4362, "W7800": 4362}

    # the six GPUs of both vendors in one table, each row with its own arch
    nvidia = shared_file("kernel_tuner_nvidia", "convolution_milo_A100.json.gz").parent / "convolution_milo_*.json.gz"
    op, result = read_config_inputs(_compose_op("kernel_tuner_conv", f"[{caches},{nvidia}]"))
    _accounting(result, op)
    s = result.summary
    assert (s.records, s.valid, s.invalid, s.rejected) == (26172, 25261, {"kernel failed": 911}, {})
    assert result.table.groupby("gpu")["arch"].first().to_dict() == {
        "A100": "sm80_a100", "A4000": "sm86_a4000", "A6000": "sm86_a6000", "MI250X": "gfx90a", "W6600": "gfx1032",
        "W7800": "gfx1100"}


@pytest.mark.slow
def test_an_ingested_table_reads_back_through_its_op(tmp_path: Path) -> None:
    """The canonical parquet of an op with text problem fields and per-row arch round-trips."""
    from ckpred.data.ingest import read_config_inputs
    from ckpred.data.table import write_table

    path = tmp_path / "W7800.json"
    shutil.copy(FIXTURES / "kernel_tuner_small.json", path)
    op, first = read_config_inputs(_compose_op("kernel_tuner_conv", path))
    out = write_table(first.table, tmp_path / "t.parquet", op)
    op, again = read_config_inputs(_compose_op("kernel_tuner_conv", out))
    _accounting(again, op)
    pd.testing.assert_frame_equal(again.table, first.table)
    assert again.summary.formats == ["parquet"] and set(again.table["arch"]) == {"gfx1100"}


TILED_YAML = """
defaults:
  - base_op
  - _self_
name: tiled
problem_fields:
  m: {kind: int}
  n: {kind: int}
  k: {kind: int}
kernel_fields:
  tile_m: {kind: int}
  tile_n: {kind: int}
  tile_k: {kind: int}
  warp_m: {kind: int}
  warp_n: {kind: int}
  warp_k: {kind: int}
  warp_tile_m: {kind: int}
  warp_tile_n: {kind: int}
  warp_tile_k: {kind: int}
kernel_id:
  template: "gemm_{tile_m}x{tile_n}x{tile_k}_{warp_m}x{warp_n}x{warp_k}_{warp_tile_m}x{warp_tile_n}x{warp_tile_k}"
metric: {column: tflops, better: higher, unit: tflops}
flops: "2 * m * n * k"
rules:
  - expr: "tile_m % (warp_m * warp_tile_m) == 0 and tile_n % (warp_n * warp_tile_n) == 0"
    message: "the block tile is not a whole number of warp tiles"
  - expr: "k % tile_k == 0"
    message: "K not a multiple of tile_k"
"""


def test_a_kernel_no_configuration_of_the_op_can_produce_is_rejected(tmp_path: Path) -> None:
    pytest.importorskip("ckpred.kernels.declared")
    from ckpred.config import compose
    from ckpred.data.ingest import read_config_inputs

    root = tmp_path / "conf"
    (root / "op").mkdir(parents=True)
    (root / "op" / "tiled.yaml").write_text(TILED_YAML)
    flops = 2 * 256 * 256 * 256
    lines = ["m,n,k,kernel_name,tflops", f"256,256,256,gemm_64x64x32_2x2x1_32x32x16,{flops / 1e7:.6f}",
             f"256,256,256,gemm_7x7x7_1x1x1_3x3x3,{flops / 1e7:.6f}",       # no warp tiling makes 7x7
             f"256,256,256,gemm_64x64x48_2x2x1_32x32x16,{flops / 1e7:.6f}"]  # K % 48: this problem only
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    cfg = compose("ingest", [f"hydra.searchpath=[file://{root}]", "op=tiled", f"data.path={tmp_path / 't.csv'}"])
    op, result = read_config_inputs(cfg)
    _accounting(result, op)
    assert result.rejects["reason"].tolist() == [
        "impossible kernel: the block tile is not a whole number of warp tiles"]
    assert result.rejects["source"].iloc[0].endswith("t.csv:3")
    # a rule that reads the problem does not make a kernel impossible: it stays a table row
    assert set(result.table["kernel_name"]) == {"gemm_64x64x32_2x2x1_32x32x16", "gemm_64x64x48_2x2x1_32x32x16"}


def test_each_rows_own_arch_judges_the_ops_rules(tmp_path: Path) -> None:
    """A problem no kernel can run on its row's GPU (an hw rule) is a rule violation there only."""
    pytest.importorskip("ckpred.kernels.declared")
    from ckpred.config import compose
    from ckpred.data.ingest import read_config_inputs

    root = tmp_path / "conf"
    (root / "op").mkdir(parents=True)
    text = TILED_YAML.replace('''  - expr: "k % tile_k == 0"''', '''  - expr: "m <= 100 * hw.cus"
    message: "M above 100 rows per CU"
  - expr: "k % tile_k == 0"''') + "input:\n  columns: {arch: gpu_arch}\n"
    (root / "op" / "tiled.yaml").write_text(text)
    rows = ["m,n,k,kernel_name,tflops,gpu_arch"]
    for gpu in ("gfx1032", "gfx942"):  # 28 and 304 CUs
        for m in (2048, 4096):
            rows.append(f"{m},256,256,gemm_64x64x32_2x2x1_32x32x16,{2 * m * 256 * 256 / 1e7:.6f},{gpu}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    cfg = compose("ingest", [f"hydra.searchpath=[file://{root}]", "op=tiled", f"data.path={tmp_path / 't.csv'}"])
    op, result = read_config_inputs(cfg)
    _accounting(result, op)
    t = result.table.set_index(["arch", "m"])
    assert t["is_valid"].to_dict() == {("gfx1032", 2048): True, ("gfx1032", 4096): False, ("gfx942", 2048): True,
                                       ("gfx942", 4096): True}
    assert t.loc[("gfx1032", 4096), "invalid_reason"] == "rule violation: M above 100 rows per CU"
