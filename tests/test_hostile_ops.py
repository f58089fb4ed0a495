"""Hostile op configs, input tables and run files: a named one-line error, never a traceback, a
hang or a silent wrong table.

The op cases edit the user op of ``tests/fixtures/user_op`` (op ``tmm``: int problem fields, a
categorical ``precision``, a kernel-id template, a column map) one key at a time and run
``ckpred ingest`` in-process, as :mod:`tests.test_hostile` runs every command; the ids are those
of the hostile-input report (``../shared/hostile-inputs-74e02af.md``: F02, F11-F13, F19, F22-F24,
F28). An op that cannot be evaluated is refused when the config is composed, naming the key; a
table whose rows the op cannot read gets those rows rejected with their reason.
"""

from __future__ import annotations

import copy
import gzip
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
import yaml

import ckpred.cli
from tests.conftest import REPO
from tests.test_hostile import TRACEBACK, assert_named, run

USER_OP = REPO / "tests" / "fixtures" / "user_op"
BASE = yaml.safe_load((USER_OP / "op" / "tmm.yaml").read_text())
KERNELS = [(bm, bn, w, s) for bm in (32, 64) for bn in (32, 64) for w in (4, 8) for s in (2, 3)]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hydra._internal.utils.is_under_debugger", lambda: False)


def write_csv(path: Path, shapes: int = 3, extra: dict[str, list[str]] | None = None) -> Path:
    """A small table of the user op's source columns (``M,N,K,dtype,BLOCK_M,...,ms``)."""
    lines = ["M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms"]
    for i in range(shapes):
        for dtype in ("fp16", "bf16"):
            for bm, bn, w, s in KERNELS:
                lines.append(f"{64 << i},128,256,{dtype},{bm},{bn},{w},{s},{0.001 * (1 + i) + 1e-5 * (bm + bn + w + s):.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def op_dir(tmp: Path, edit: Callable[[dict[str, Any]], None], name: str = "conf") -> Path:
    """A copy of the user op's config dir with ``edit`` applied to op/tmm.yaml."""
    conf = tmp / name
    shutil.copytree(USER_OP, conf)
    cfg = copy.deepcopy(BASE)
    edit(cfg)
    (conf / "op" / "tmm.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return conf


def ingest(conf: Path, data: Path, out: Path, capsys: pytest.CaptureFixture[str],
           *extra: str) -> tuple[int, str, str]:
    return run(["ingest", "--config-dir", str(conf), "op=tmm", f"data.path={data}", f"out={out}", *extra], capsys)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda cfg: cfg.__setitem__(key, value)


def _rule(expr: str) -> Callable[[dict[str, Any]], None]:
    return lambda cfg: cfg["rules"][0].__setitem__("expr", expr)


def _column(name: str, spec: Any) -> Callable[[dict[str, Any]], None]:
    return lambda cfg: cfg["input"]["columns"].__setitem__(name, spec)


def _kernel_field(name: str, values: list[str], template: str) -> Callable[[dict[str, Any]], None]:
    def edit(cfg: dict[str, Any]) -> None:
        cfg["kernel_fields"][name] = {"kind": "categorical", "values": values, "default": values[0]}
        cfg["kernel_id"]["template"] = template
    return edit


TEMPLATE = "bm{block_m}_bn{block_n}_w{num_warps}_s{num_stages}"

#: (id, edit of the op, words the one-line error must hold); each refused when composed.
COMPOSE_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], list[str]]] = [
    # F12: deep or long expressions, huge literals (op, rules, input columns)
    ("op07", _set("flops", "rows+" * 2000 + "rows"), ["'op.flops'", "at most 2,000 characters"]),
    ("op08", _set("flops", "rows+" * 100_000 + "rows"), ["'op.flops'", "500,004 characters"]),
    ("op09", _set("flops", "-" * 10_000 + "rows"), ["'op.flops'", "at most 2,000 characters"]),
    ("op33", _rule("not " * 10_000 + "block_m"), ["'op.rules[0].expr'", "at most 2,000 characters"]),
    ("op33-depth", _rule("not " * 150 + "block_m"), ["'op.rules[0].expr'", "nested at most 100 deep"]),
    ("op07-depth", _set("flops", "rows+" * 150 + "rows"), ["'op.flops'", "nested at most 100 deep"]),
    ("in18", _column("time", {"expr": "ms+" * 2000 + "ms"}), ["'op.input.columns.time.expr'", "2,000 characters"]),
    ("in26", _column("time", {"expr": "-" * 10_000 + "ms"}), ["'op.input.columns.time.expr'", "2,000 characters"]),
    ("op11", _set("flops", "1" * 400 + " * rows"), ["'op.flops'", "float64's range"]),
    # F22: FLOPs that can only be infinite or undefined
    ("op05", _set("flops", "10**10**10"), ["'op.flops'", "'10**10**10' is inf"]),
    ("op10", _set("flops", "rows * 1e999"), ["'op.flops'", "float64's range", "inf"]),
    ("op30", _set("flops", "2**1000000 * rows"), ["'op.flops'", "'2**1000000' is inf"]),
    ("op32", _set("flops", "rows // 0"), ["'op.flops'", "division by zero"]),
    ("op40", _set("flops", "sqrt(-1) * rows"), ["'op.flops'", "'sqrt(-1)' is nan"]),
    ("op40-bytes", _set("bytes", "log2(0) * rows"), ["'op.bytes'", "'log2(0)' is -inf"]),
    # F23: rules no table can evaluate
    ("op27", _rule("precision > 'fp16'"), ["'op.rules[0].expr'", "'>'", "== or !="]),
    ("op28", _rule("dtype_bytes(rows)"), ["'op.rules[0].expr'", "'rows'", "dtype_bytes()"]),
    ("op28-str", _set("flops", "rows + 'fp16'"), ["'op.flops'", "'fp16'", "a number here"]),
    # F24: silent acceptances
    ("in07", _column("blok_m", "BLOCK_M"), ["'op.input.columns.blok_m'", "a column the op reads"]),
    ("in22", _column("kernel_name", "dtype"), ["'op.input.columns.kernel_name'", "not both"]),
    ("op37", _set("family", {"expr": "rows", "bounds": [float("nan")], "labels": ["a", "b"]}),
     ["'op.family.bounds'", "finite"]),
    ("tp16", _kernel_field("variant", [" x", "y"], TEMPLATE + "_{variant}"),
     ["'op.kernel_fields.variant.values[0]'", "' x'", "leading or trailing spaces"]),
    # F13: constants and derived columns of the wrong kind
    ("in09", _column("rows", {"value": "abc"}), ["'op.input.columns.rows.value'", "'abc'", "(int)"]),
    ("in09-cat", _column("precision", {"value": "fp64"}), ["'op.input.columns.precision.value'", "'fp64'"]),
    ("in15", _column("precision", {"expr": "dtype * 2"}), ["'op.input.columns.precision.expr'", "categorical"]),
    # F02: two kernels named alike
    ("tp01", lambda cfg: (_kernel_field("variant", ["x", "xy"], TEMPLATE + "_{variant}{tail}")(cfg),
                          cfg["kernel_fields"].__setitem__("tail", {"kind": "categorical", "values": ["yz", "z"],
                                                                    "default": "z"})),
     ["'op.kernel_id.template'", "variant=x, tail=yz and variant=xy, tail=z", "'bm1_bn1_w1_s1_xyz'"]),
    ("tp01-sep", lambda cfg: (_kernel_field("a", ["x_y", "x"], TEMPLATE + "_{a}_{b}")(cfg),
                              cfg["kernel_fields"].__setitem__("b", {"kind": "categorical", "values": ["z", "y_z"],
                                                                     "default": "z"})),
     ["'op.kernel_id.template'", "both print", "x_y_z"]),
    ("tp02", lambda cfg: (_kernel_field("a", ["x", "x,y"], TEMPLATE)(cfg),
                          cfg.__setitem__("kernel_id", {"fields": ["block_m", "block_n", "num_warps", "num_stages",
                                                                   "a"]})),
     ["'op.kernel_fields.a.values[1]'", "'x,y'", "tuple id"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("edit", "names"), [c[1:] for c in COMPOSE_REFUSALS], ids=[c[0] for c in COMPOSE_REFUSALS])
def test_op_refused_when_composed(edit: Callable[[dict[str, Any]], None], names: list[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    started: list[Any] = []
    monkeypatch.setattr(ckpred.cli, "_load_task", lambda spec: lambda cfg: started.append(cfg))
    rc, _, err = ingest(op_dir(tmp_path, edit), write_csv(tmp_path / "t.csv"), tmp_path / "o.parquet", capsys)
    assert_named(rc, err, "ingest", *names)
    assert started == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["op11", "op05"], ids=["op11t", "op05t-literal"])
def test_train_refuses_the_op_ingest_refuses(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A 400-digit literal or an infinite FLOPs constant: refused when train composes the op,
    not an OverflowError in the fit (op11t) nor TFLOPS of 1 / latency (op05t)."""
    edit, names = next(c[1:] for c in COMPOSE_REFUSALS if c[0] == case)
    started: list[Any] = []
    monkeypatch.setattr(ckpred.cli, "_load_task", lambda spec: lambda cfg: started.append(cfg))
    rc, _, err = run(["train", "--config-dir", str(op_dir(tmp_path, edit)), "op=tmm", *TRAIN,
                      f"data.path={write_csv(tmp_path / 't.csv')}", f"out_dir={tmp_path / 'run'}"], capsys)
    assert_named(rc, err, "train", *names)
    assert started == []


@pytest.mark.slow
def test_the_user_op_and_its_siblings_still_compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """What the checks above must not refuse: separators no value contains, numeric categorical
    values derived by an expression, an intermediate derived column, kernels read by name."""
    started: list[Any] = []
    monkeypatch.setattr(ckpred.cli, "_load_task", lambda spec: lambda cfg: started.append(cfg))
    fine = [
        lambda cfg: None,
        lambda cfg: (_kernel_field("variant", ["x", "xy"], TEMPLATE + "_{variant}_{tail}")(cfg),
                     cfg["kernel_fields"].__setitem__("tail", {"kind": "categorical", "values": ["yz", "z"],
                                                               "default": "z"})),
        _set("flops", "2 * rows * cols * depth + 0 * log2(rows)"),
        _rule("precision == 'fp16' or num_stages * 2 <= hw.lds_bytes"),
        lambda cfg: (_column("m2", {"expr": "M * 2"})(cfg), _column("rows", {"expr": "m2 / 2"})(cfg)),
        lambda cfg: (cfg["input"]["columns"].pop("block_m"), _column("kernel_name", "name")(cfg),
                     [cfg["input"]["columns"].pop(k) for k in ("block_n", "num_warps", "num_stages")]),
    ]
    for i, edit in enumerate(fine):
        rc, _, err = ingest(op_dir(tmp_path, edit, f"conf{i}"), tmp_path / "t.csv", tmp_path / "o.parquet", capsys)
        assert rc == 0, (i, err)
    assert len(started) == len(fine)


# -- refused or rejected once the table is read ---------------------------------------------------
def _rejects(out: Path) -> pd.DataFrame:
    return pd.read_csv(out.with_name(f"{out.stem}.rejects.csv"))


def test_in19_a_derived_int_that_is_no_integer_rejects_the_rows(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    conf = op_dir(tmp_path, _column("rows", {"expr": "M / 3"}))
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(conf, write_csv(tmp_path / "t.csv"), out, capsys)
    assert_named(rc, err, "ingest", "no valid measurement", "bad problem field", "nothing written")
    assert not out.exists()
    reasons = _rejects(out)["reason"]
    assert reasons.str.startswith("bad problem field: rows=21.3").any(), reasons.head()


def test_in15_text_read_as_a_number_rejects_the_rows_naming_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    conf = op_dir(tmp_path, _column("depth", {"expr": "K + dtype"}))
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(conf, write_csv(tmp_path / "t.csv"), out, capsys)
    assert_named(rc, err, "ingest", "non-numeric value")
    assert set(_rejects(out)["reason"]) == {"non-numeric value: dtype='fp16' is read as a number by "
                                            "op.input.columns.depth.expr",
                                            "non-numeric value: dtype='bf16' is read as a number by "
                                            "op.input.columns.depth.expr"}


def test_in23_a_per_row_arch_that_names_no_arch_config_is_rejected(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    conf = op_dir(tmp_path, _column("arch", "dtype"))
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(conf, write_csv(tmp_path / "t.csv"), out, capsys)
    assert_named(rc, err, "ingest", "bad arch")
    assert _rejects(out)["reason"].str.startswith("bad arch: arch='fp16' names no arch config").any()


def test_op05t_flops_that_are_no_positive_number_reject_their_rows(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A FLOPs formula that is fine for most problems but zero or infinite for some: those rows
    are rejected, never given ``tflops = 1 / latency`` beside the others' TFLOPS."""
    conf = op_dir(tmp_path, _set("flops", "2 * (rows - 64) * cols * depth / (rows - 128)"))
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(conf, write_csv(tmp_path / "t.csv"), out, capsys)
    assert rc == 0, err
    table = pd.read_parquet(out)
    assert set(table["rows"]) == {256}  # rows=64 gives 0 FLOPs, rows=128 a division by zero
    valid = table[table["is_valid"]]
    flops = 2 * (valid["rows"] - 64) * valid["cols"] * valid["depth"] / (valid["rows"] - 128)
    assert (valid["tflops"] - flops / (valid["latency_ms"] * 1e9)).abs().max() < 1e-9
    reasons = _rejects(out)["reason"]
    assert len(reasons) == 2 * 2 * len(KERNELS)
    assert set(reasons.str.extract(r"gives (\S+) for")[0]) == {"-0", "inf"}  # 0 / -64 and 128 / 0


def test_f02_two_kernels_named_alike_never_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tp01's table: with an unambiguous template (``_{variant}_{tail}``) every kernel keeps its row."""
    edit = lambda cfg: (_kernel_field("variant", ["x", "xy"], TEMPLATE + "_{variant}_{tail}")(cfg),  # noqa: E731
                        cfg["kernel_fields"].__setitem__("tail", {"kind": "categorical", "values": ["yz", "z"],
                                                                  "default": "z"}),
                        _column("variant", "variant")(cfg), _column("tail", "tail")(cfg))
    lines = ["M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,variant,tail,ms"]
    for variant, tail, ms in (("x", "yz", 0.000493), ("xy", "z", 0.001521), ("x", "z", 0.0008)):
        lines.append(f"64,128,256,fp16,32,64,4,2,{variant},{tail},{ms}")
    (tmp_path / "collide.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(op_dir(tmp_path, edit), tmp_path / "collide.csv", out, capsys)
    assert rc == 0, err
    table = pd.read_parquet(out)
    assert len(table) == 3 and set(table["repeats"]) == {1}
    assert sorted(table["kernel_name"]) == ["bm32_bn64_w4_s2_x_yz", "bm32_bn64_w4_s2_x_z", "bm32_bn64_w4_s2_xy_z"]


# -- files that are no regular files (F11 ig21, F19 ig20) -------------------------------------------
def test_ig20_a_fifo_as_data_path_is_refused_without_blocking(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "in.csv"
    os.mkfifo(fifo)
    rc, _, err = ingest(USER_OP, fifo, tmp_path / "o.parquet", capsys)  # would block forever when opened
    assert_named(rc, err, "ingest", str(fifo), "a named pipe (FIFO)", "regular files")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_ig21_a_device_as_data_path_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["ingest", "data.path=/dev/zero", "data.format=csv", f"out={tmp_path / 'o.parquet'}"], capsys)
    assert_named(rc, err, "ingest", "/dev/zero", "a character device")


# -- ingest -> Parquet -> train, whatever the paths ------------------------------------------------
TRAIN = ["features=tmm_feats", "data=path", "model.n_estimators=3", "model.n_jobs=1", "cv.n_splits=2",
         "plots=false", "progress=false", "save_pipeline=false", "baselines.reference.enabled=false"]


@pytest.mark.slow
@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_an_ingested_table_trains_from_relative_and_absolute_paths(absolute: bool, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The table's ``source`` holds the paths as given (absolute ones outside the working
    directory); reading it back must not depend on them."""
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "t.csv", shapes=4)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    src = data / "t.csv" if absolute else Path("../data/t.csv")
    table = data / "t.parquet" if absolute else Path("../data/t.parquet")
    rc, _, err = run(["ingest", "--config-dir", str(USER_OP), "op=tmm", f"data.path={src}", f"out={table}"], capsys)
    assert rc == 0, err
    sources = pd.read_parquet(data / "t.parquet")["source"]
    assert sources.str.startswith(f"{data}/t.csv:" if absolute else "../data/t.csv:").all()
    rc, _, err = run(["train", "--config-dir", str(USER_OP), "op=tmm", *TRAIN, f"data.path={table}",
                      f"out_dir={work / 'run'}"], capsys)
    assert rc == 0 and not TRACEBACK.search(err), err
    # every row of the table rejected on reading back (another arch): a named error, no traceback
    rc, _, err = run(["train", "--config-dir", str(USER_OP), "op=tmm", *TRAIN, f"data.path={table}", "arch=gfx942",
                      f"out_dir={work / 'run2'}"], capsys)
    assert_named(rc, err, "train", "no valid measurement", "arch mismatch")


@pytest.mark.slow
@pytest.mark.parametrize(("expr", "names"), [
    ("-" * 150 + "rows", ["nested at most 100 deep"]),                        # ft04
    ("rows+" * 2000 + "rows", ["at most 2,000 characters"]),                  # ft07
    ("1" + "0" * 400, ["float64's range"]),                                   # ft08
], ids=["ft04", "ft07", "ft08"])
def test_feature_expressions_deep_long_or_huge_are_named(expr: str, names: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    conf = op_dir(tmp_path, lambda cfg: None)
    path = conf / "features" / "tmm_feats.yaml"
    feats = yaml.safe_load(path.read_text())
    feats["groups"][0]["params"]["features"]["hostile"] = expr
    path.write_text(yaml.safe_dump(feats, sort_keys=False))
    rc, _, err = run(["train", "--config-dir", str(conf), "op=tmm", *TRAIN,
                      f"data.path={write_csv(tmp_path / 't.csv', shapes=4)}", f"out_dir={tmp_path / 'run'}"], capsys)
    assert_named(rc, err, "train", "'features.groups[0].params.features.hostile'", *names)


# -- replay and canonical tables (F28) --------------------------------------------------------------
@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("replay")
    table = write_csv(tmp / "t.csv", shapes=4)
    rc = ckpred.cli.main(["train", "--config-dir", str(USER_OP), "op=tmm", *TRAIN, f"data.path={table}",
                          f"out_dir={tmp / 'run'}", f"hydra.run.dir={tmp / 'hydra'}"])
    assert rc == 0
    return tmp / "run"


def _damaged_run(run_dir: Path, tmp: Path, damage: Callable[[Path], None]) -> Path:
    copy_dir = tmp / "run"
    shutil.copytree(run_dir, copy_dir)
    damage(copy_dir)
    return copy_dir


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _rewrite_oof(edit: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    return lambda d: edit(pd.read_parquet(d / "oof_predictions.parquet")).to_parquet(d / "oof_predictions.parquet")


@pytest.mark.slow
@pytest.mark.parametrize(("damage", "names"), [
    (lambda d: _truncate(d / "oof_predictions.parquet"), ["oof_predictions.parquet", "not a readable Parquet file"]),
    (_rewrite_oof(lambda t: t.iloc[:0]), ["oof_predictions.parquet", "holds no prediction (0 rows)"]),
    (_rewrite_oof(lambda t: t.assign(score_model=float("nan"))), ["'score_model' holds no score"]),
    (_rewrite_oof(lambda t: t.drop(columns=["perf"])), ["lacks column(s) ['perf']"]),
    (lambda d: (d / "run.json").write_text("{not json"), ["run.json", "not a JSON run record", "JSONDecodeError"]),
    (lambda d: (d / "run.json").write_text("[" * 100_000 + "]" * 100_000), ["run.json", "RecursionError"]),
    (lambda d: (d / "run.json").write_text("[1, 2]"), ["run.json", "a JSON object, not a list"]),
], ids=["rp06-truncated-oof", "rp13-empty-oof", "rp10-nan-scores", "no-perf", "rp07-run-json-not-json",
      "rp12-run-json-deep", "run-json-list"])
def test_replay_of_a_damaged_run_is_named(damage: Callable[[Path], None], names: list[str], train_run: Path,
                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _damaged_run(train_run, tmp_path, damage)
    rc, _, err = run(["replay", str(run_dir), "seeds=1"], capsys)
    assert_named(rc, err, "replay", *names)


@pytest.mark.slow
def test_replay_of_the_undamaged_run_works(train_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _damaged_run(train_run, tmp_path, lambda d: None)
    rc, out, err = run(["replay", str(run_dir), "seeds=1"], capsys)
    assert rc == 0, err
    assert "fixed(k=1)" in out


@pytest.mark.slow
def test_ig34_a_canonical_table_of_another_op_is_rejected_row_by_row(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "t.parquet"
    rc, _, err = ingest(USER_OP, write_csv(tmp_path / "t.csv"), table, capsys)
    assert rc == 0, err
    pd.read_parquet(table).assign(op="gemm_universal").to_parquet(tmp_path / "other.parquet")
    import pyarrow.parquet as pq  # keep the canonical marker: the file is read as a ckpred table

    meta = pq.read_schema(table).metadata
    other = pq.read_table(tmp_path / "other.parquet")
    pq.write_table(other.replace_schema_metadata({**(other.schema.metadata or {}), **meta}), tmp_path / "other.parquet")
    rc, _, err = ingest(USER_OP, tmp_path / "other.parquet", tmp_path / "o2.parquet", capsys)
    assert_named(rc, err, "ingest", "no valid measurement", "op mismatch")


# -- an unreachable Dask scheduler (F16) -------------------------------------------------------------
@pytest.fixture()
def silent_socket() -> Any:
    """A local socket that accepts connections and never answers."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["refused", "silent"], ids=["dk03", "dk04"])
def test_an_unreachable_dask_scheduler_is_named_within_the_timeout(where: str, silent_socket: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import time

    pytest.importorskip("distributed")
    address = "tcp://127.0.0.1:1" if where == "refused" else silent_socket
    start = time.monotonic()
    rc, _, err = run(["train", "--config-dir", str(USER_OP), "op=tmm", *TRAIN, "model.backend=dask",
                      f"model.dask.address={address}", "model.dask.timeout_s=1",
                      f"data.path={write_csv(tmp_path / 't.csv', shapes=4)}", f"out_dir={tmp_path / 'run'}"], capsys)
    assert_named(rc, err, "train", "'model.dask.address'", address, "model.dask.timeout_s=1")
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_dk05_a_dask_timeout_that_is_no_duration_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ckpred.cli, "_load_task", lambda spec: lambda cfg: None)
    for bad in ("0", "-1", "nan", "1e9"):
        rc, _, err = run(["train", "model.backend=dask", f"model.dask.timeout_s={bad}"], capsys)
        assert_named(rc, err, "train", "'model.dask.timeout_s'")
    rc, _, err = run(["train", "model.backend=dask", "model.dask.address='not a url'"], capsys)
    assert_named(rc, err, "train", "'model.dask.address'")


def test_a_running_scheduler_is_reached() -> None:
    distributed = pytest.importorskip("distributed")
    from ckpred.scale import reach_scheduler

    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        reach_scheduler(cluster.scheduler_address, 10.0)  # the handshake completes: no error


# -- memory follows the chunk for tables of declared ops too (F11) ----------------------------------
def _big_csv(path: Path, rows: int) -> Path:
    """``rows`` records of the user op's columns, every (problem, kernel) distinct."""
    import numpy as np

    i = np.arange(rows)
    frame = pd.DataFrame({"M": 64 + i // 72, "N": 128, "K": 256, "dtype": np.array(["fp16", "bf16", "fp32"])[i % 3],
                          "BLOCK_M": 32 << (i // 3 % 2), "BLOCK_N": 32 << (i // 6 % 2), "warps": 4 << (i // 12 % 2),
                          "stages": 2 + i // 24 % 3, "ms": np.round(0.001 + (i % 997) * 1e-5, 6)})
    frame.to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_ig03_a_compressed_table_is_read_in_chunks_and_partitioned_by_its_text(tmp_path: Path) -> None:
    """A gzip file of many times its size: more partitions than its size plans (each fits a
    chunk of text), and the same table as the plain file."""
    import pyarrow.parquet as pq

    plain = _big_csv(tmp_path / "t.csv", 60_000)
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    outs = {}
    for src in (plain, packed):
        out = tmp_path / f"{src.name}.dir"
        rc = ckpred.cli.main(["ingest", "--config-dir", str(USER_OP), "op=tmm", f"data.path={src}", f"out={out}",
                              "data.chunk_mb=1", f"hydra.run.dir={tmp_path / 'h'}"])
        assert rc == 0
        outs[src.suffix] = out
    parts = {k: len(list(v.glob("part-*.parquet"))) for k, v in outs.items()}
    assert parts[".csv"] == -(-plain.stat().st_size // (1 << 20))  # planned from the size: 3 parts
    assert parts[".gz"] >= parts[".csv"] > -(-packed.stat().st_size // (1 << 20))
    keys = ["rows", "cols", "depth", "precision", "kernel_name"]
    tables = [pq.read_table(v).to_pandas().drop(columns=["source", "run_id"]).sort_values(keys).reset_index(drop=True)
              for v in outs.values()]
    assert tables[0].equals(tables[1])


@pytest.mark.slow
def test_ig03_a_gzip_bomb_of_one_repeated_line_is_one_counted_row(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """300,000 copies of one line in 31 KB of gzip (10 MB of text) read in chunks of 1 MB: one
    row, every copy counted as a repeat (before: the whole text in memory, then a traceback)."""
    bomb = tmp_path / "bomb.csv.gz"
    with gzip.open(bomb, "wb") as fh:
        fh.write(b"M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms\n")
        for _ in range(30):
            fh.write(b"64,128,256,fp16,32,64,4,2,0.002117\n" * 10_000)
    assert bomb.stat().st_size < 100_000
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(USER_OP, bomb, out, capsys, "data.chunk_mb=1")
    assert rc == 0, err
    table = pd.read_parquet(out)
    assert len(table) == 1 and table["repeats"].iloc[0] == 300_000
    assert table["latency_ms"].iloc[0] == 0.002117


def test_a_merge_out_of_memory_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The one step memory cannot bound (every repeat of a query is merged at once): running
    out there is one line naming the files, not a MemoryError traceback. (The real case, 10
    million copies of a line under ``ulimit -v``, is measured in docs/results.md.)"""
    from ckpred.data.ingestion import merge

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError()

    monkeypatch.setattr(merge, "merge", exhausted)
    out = tmp_path / "o.parquet"
    rc, _, err = ingest(USER_OP, write_csv(tmp_path / "t.csv"), out, capsys)
    assert_named(rc, err, "ingest", "t.csv", "out of memory merging", "measurements")
    assert not out.exists()


def test_ig04_a_compressed_table_with_a_wrong_header_is_refused_at_its_first_chunk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused after one chunk: the damaged end of the stream is never reached."""
    lines = ["kernel,problem_idx,M,N,K,latency_ms,tflops"] + ["k,0,64,64,64,0.1,1.0"] * 200_000
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    (tmp_path / "t.csv.gz").write_bytes(data + b"\x1f\x8b not gzip at all")
    rc, _, err = ingest(USER_OP, tmp_path / "t.csv.gz", tmp_path / "o.parquet", capsys, "data.chunk_mb=1")
    assert_named(rc, err, "ingest", "t.csv.gz", "reads column 'dtype'", "its columns are ['kernel'")


@pytest.mark.slow
def test_ig01_peak_memory_of_a_mapped_table_follows_the_chunk(tmp_path: Path) -> None:
    """A 22 MB table of the user op with data.chunk_mb=1: peak RSS within 250 MB of the command's
    own (read whole before: about 1 GB)."""
    import subprocess
    import sys

    table = _big_csv(tmp_path / "t.csv", 600_000)
    assert table.stat().st_size > 20e6
    peaks = {}
    for name, path in (("small", write_csv(tmp_path / "s.csv")), ("big", table)):
        probe = ("import resource, sys, ckpred.cli; rc = ckpred.cli.main(sys.argv[1:]); "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
        run_ = subprocess.run([sys.executable, "-c", probe, "ingest", "--config-dir", str(USER_OP), "op=tmm",
                               f"data.path={path}", f"out={tmp_path / (name + '.parquet')}", "data.chunk_mb=1",
                               f"hydra.run.dir={tmp_path / 'h'}"], capture_output=True, text=True, cwd=tmp_path)
        assert run_.returncode == 0, run_.stderr
        peaks[name] = int(run_.stdout.split()[-1]) / 1024  # MiB
    assert peaks["big"] - peaks["small"] < 250, peaks


@pytest.mark.slow
def test_ig02_peak_memory_of_a_ck_sweep_table_follows_the_chunk(tmp_path: Path) -> None:
    """ig02: the CK sweep reader (the default op) with data.chunk_mb=1 on a 21 MB CSV peaks
    within 150 MB of the same command on the 19 KB table it repeats (measured: about 30 MB
    more); it must stay so when the declared-op reader changes."""
    import subprocess
    import sys

    from tests.conftest import data_file

    lines = data_file("ck_gemm_gfx950_results", "parity_sweep_results.csv").read_bytes().splitlines(keepends=True)
    (tmp_path / "s.csv").write_bytes(b"".join(lines))
    (tmp_path / "t.csv").write_bytes(lines[0] + b"".join(lines[1:]) * 1100)
    assert (tmp_path / "t.csv").stat().st_size > 20e6
    peaks = {}
    for name in ("s", "t"):
        probe = ("import resource, sys, ckpred.cli; rc = ckpred.cli.main(sys.argv[1:]); "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
        run_ = subprocess.run([sys.executable, "-c", probe, "ingest", "dtype=fp16", "data.source=path",
                               f"data.path={tmp_path / (name + '.csv')}", f"out={tmp_path / (name + '.parquet')}",
                               "data.chunk_mb=1", f"hydra.run.dir={tmp_path / 'h'}"],
                              capture_output=True, text=True, cwd=tmp_path)
        assert run_.returncode == 0, run_.stderr
        peaks[name] = int(run_.stdout.split()[-1]) / 1024  # MiB
    repeats = {name: pd.read_parquet(tmp_path / f"{name}.parquet")["repeats"].sum() for name in ("s", "t")}
    assert repeats["t"] == 1100 * repeats["s"]  # every record read (the repeats of each kernel merged)
    assert peaks["t"] - peaks["s"] < 150, peaks
