"""Declared ops: an op is a YAML file in a user's config dir, checked when the config is composed.

The ops here use field names ckpred has never seen (``rows``/``cols``/``depth``, ``block_m``,
a 6-tuple scaled-mm family) so nothing can lean on the CK ops' names.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred.config import compose
from ckpred.errors import ConfigValueError, KernelNameError
from ckpred.kernels.base import load_op
from ckpred.schema import arch_config

#: A matmul autotuning op with unfamiliar names; dtype is a problem field, so one table mixes them.
MATMUL = """\
defaults:
  - base_op
  - _self_
name: tmm
problem_fields:
  rows: {kind: int}
  cols: {kind: int}
  depth: {kind: int}
  precision: {kind: categorical, values: [fp16, bf16, fp32]}
kernel_fields:
  block_m: {kind: int}
  block_n: {kind: int}
  num_warps: {kind: int}
  num_stages: {kind: int}
kernel_id:
  template: "bm{block_m}_bn{block_n}_w{num_warps}_s{num_stages}"
metric: {column: time, better: lower, unit: ms}
failure: {metric_values: [inf, nan, missing]}
flops: "2 * rows * cols * depth"
bytes: "(rows * depth + depth * cols + rows * cols) * dtype_bytes(precision)"
rules:
  - expr: "(block_m + block_n) * 64 * dtype_bytes(precision) * num_stages <= hw.lds_bytes"
    message: "the staged A and B tiles exceed LDS"
keys:
  query: [rows, cols, depth, precision]
  cv_group: [rows, cols, depth]
  breakdowns: [precision]
"""

#: The fp8 scaled-mm family on gfx1151 (RDNA 3.5, 16x16x16 WMMA): configs are 6-tuples
#: (warps_m, warps_n, repeat_n, k_pack, repeat_m, stages). The C-shuffle epilogue reuses the
#: LDS of the staged A tiles (kShASize = block_m * block_k * stages bytes of fp8, block_m =
#: warps_m * repeat_m * 16, block_k = k_pack * 16) for one pass of fp32 C rows
#: (kCShuffleSize = warps_m * 16 rows * block_n * 4 bytes, block_n = warps_n * repeat_n * 16);
#: the kernel's static_assert(kShASize >= kCShuffleSize) reduces to
#: repeat_m * k_pack * stages >= 4 * warps_n * repeat_n, so with warps_n = 4 a small repeat_m
#: fails: (2,4,2,2,2,4) does, (2,4,2,2,4,4) does not.
SCALED_MM = """\
defaults:
  - base_op
  - _self_
name: scaled_mm_fp8
problem_fields:
  m: {kind: int}
  n: {kind: int}
  k: {kind: int}
kernel_fields:
  warps_m: {kind: int}
  warps_n: {kind: int}
  repeat_n: {kind: int}
  k_pack: {kind: int}
  repeat_m: {kind: int}
  stages: {kind: int}
kernel_id:
  fields: [warps_m, warps_n, repeat_n, k_pack, repeat_m, stages]
metric: {column: time_us, better: lower, unit: us}
flops: "2 * m * n * k"
rules:
  - expr: "(warps_m * repeat_m * 16) * (k_pack * 16) * stages >= (warps_m * 16) * (warps_n * repeat_n * 16) * 4"
    message: "kShASize >= kCShuffleSize static assert: C-shuffle LDS reuse needs enough repeat_m for warps_n"
  - expr: "(warps_m * repeat_m + warps_n * repeat_n) * 16 * (k_pack * 16) * stages <= hw.lds_bytes"
    message: "the staged A and B tiles exceed LDS"
  - expr: "k % (k_pack * 16) == 0"
    message: "K not a multiple of block_k"
keys:
  query: [m, n, k]
"""


def _user_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "my_conf"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _compose_op(tmp_path: Path, text: str, name: str = "user_op", *extra: str):
    root = _user_dir(tmp_path, {f"op/{name}.yaml": text})
    return compose("train", [f"hydra.searchpath=[file://{root}]", f"op={name}", "features=minimal",
                             "features@baselines.reference.features=minimal", *extra])


# -- composing a user's op -------------------------------------------------------------------------
def test_an_op_with_unfamiliar_fields_composes_from_a_user_config_dir(tmp_path: Path) -> None:
    cfg = _compose_op(tmp_path, MATMUL, "tmm")
    op = load_op(cfg.op)
    assert op.name == "tmm" and op.problem_names == ("rows", "cols", "depth", "precision")
    assert op.group_key == ("rows", "cols", "depth", "precision")
    assert op.cv_group_key == ("rows", "cols", "depth")
    assert op.families == ("fp16", "bf16", "fp32")
    table = pd.DataFrame({"rows": [64, 64, 4096], "cols": [64, 64, 8], "depth": [32, 32, 1024],
                          "precision": ["fp16", "fp32", "fp32"], "block_m": [64, 64, 128],
                          "block_n": [32, 32, 128], "num_warps": [4, 4, 8], "num_stages": [2, 2, 4]})
    # The query key keeps dtypes apart; the CV group holds a shape's dtypes together.
    assert op.shape_keys(table).tolist() == ["64x64x32xfp16", "64x64x32xfp32", "4096x8x1024xfp32"]
    assert op.cv_group_keys(table).nunique() == 2
    np.testing.assert_array_equal(op.flops(table), [2 * 64 * 64 * 32, 2 * 64 * 64 * 32, 2 * 4096 * 8 * 1024])
    assert op.bytes(table)[1] == (64 * 32 + 32 * 64 + 64 * 64) * 4
    assert op.family(table).tolist() == ["fp16", "fp32", "fp32"]
    # (128 + 128) * 64 * 4 bytes * 4 stages = 256 KiB > gfx950's 160 KiB of LDS
    valid, reason = op.validity(table, table, arch=cfg.arch)
    assert valid.tolist() == [True, True, False] and reason[2] == "the staged A and B tiles exceed LDS"
    name = op.format_name(table.iloc[2])
    assert name == "bm128_bn128_w8_s4" and op.parse_name(name) == {"block_m": 128, "block_n": 128,
                                                                    "num_warps": 8, "num_stages": 4}


def test_the_cli_reads_an_op_from_config_dir(tmp_path: Path) -> None:
    """Hydra's own --config-dir flag, through ``python -m ckpred``: the composed op is the user's."""
    root = _user_dir(tmp_path, {"op/tmm.yaml": MATMUL})
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "--config-dir", str(root), "op=tmm",
                          "features=minimal", "features@baselines.reference.features=minimal", "--cfg", "job"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert "name: tmm" in job.stdout and "cv_group:" in job.stdout


def test_a_bad_op_fails_on_the_command_line_with_one_line_naming_the_key(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, {"op/tmm.yaml": MATMUL.replace("2 * rows * cols * depth", "2 * rows * colz")})
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "--config-dir", str(root), "op=tmm",
                          "features=minimal", "features@baselines.reference.features=minimal",
                          f"out_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True)
    assert job.returncode == 1
    assert "config key 'op.flops' has invalid value 'colz'" in job.stderr and "Traceback" not in job.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new", "key", "value"), [
    # an unknown field in an expression
    ("(block_m + block_n) * 64", "(block_m + blok_n) * 64", "op.rules[0].expr", "blok_n"),
    ("2 * rows * cols * depth", "2 * rows * cols * block_m", "op.flops", "block_m"),
    ("<= hw.lds_bytes", "<= hw.lds_megabytes", "op.rules[0].expr", "hw.lds_megabytes"),
    ("dtype_bytes(precision) * num_stages", "dtype_bytes(precision) * num_stages * __import__('os')",
     "op.rules[0].expr", None),
    # wrong kinds
    ("rows: {kind: int}", "rows: {kind: integer}", "op.problem_fields.rows.kind", "integer"),
    ("precision: {kind: categorical, values: [fp16, bf16, fp32]}", "precision: {kind: categorical}",
     "op.problem_fields.precision.values", []),
    ("block_m: {kind: int}", "block_m: {kind: int, default: wide}", "op.kernel_fields.block_m.default", "wide"),
    ("better: lower, unit: ms", "better: lower, unit: tflops", "op.metric.unit", "tflops"),
    # a template that does not round-trip: two integers side by side
    ('"bm{block_m}_bn{block_n}_w{num_warps}_s{num_stages}"', '"bm{block_m}{block_n}_w{num_warps}_s{num_stages}"',
     "op.kernel_id.template", "bm{block_m}{block_n}_w{num_warps}_s{num_stages}"),
    ('"bm{block_m}_bn{block_n}_w{num_warps}_s{num_stages}"', '"bm{block_m}_bn{block_n}_w{num_warps}"',
     "op.kernel_id.template", "bm{block_m}_bn{block_n}_w{num_warps}"),
    ('"bm{block_m}_bn{block_n}_w{num_warps}_s{num_stages}"', '"bm{block_m}_bn{block_n}_w{num_warps}_s{stages}"',
     "op.kernel_id.template", "stages"),
    # keys
    ("cv_group: [rows, cols, depth]", "cv_group: [rows, cols, batch]", "op.keys.cv_group[2]", "batch"),
    ("breakdowns: [precision]", "breakdowns: [rows]", "op.keys.breakdowns[0]", "rows"),
    ("name: tmm\n", "name: tmm\nplugin: no_such_module:Op\n", "op.plugin", "no_such_module:Op"),
])
def test_a_bad_op_fails_at_compose_naming_key_and_value(tmp_path: Path, old: str, new: str, key: str,
                                                         value: object) -> None:
    assert old in MATMUL
    with pytest.raises(ConfigValueError) as err:
        _compose_op(tmp_path, MATMUL.replace(old, new, 1), "tmm")
    assert err.value.key == key, str(err.value)
    if value is not None:
        assert err.value.value == value, str(err.value)


def test_categorical_values_in_rules_are_checked(tmp_path: Path) -> None:
    bad = MATMUL.replace("message: \"the staged", "message: \"the staged").replace(
        "keys:", "  - expr: \"precision != 'fp64'\"\n    message: no fp64\nkeys:")
    with pytest.raises(ConfigValueError, match="fp64") as err:
        _compose_op(tmp_path, bad, "tmm")
    assert err.value.key == "op.rules[1].expr"


# -- the data catalogue ---------------------------------------------------------------------------
def test_catalogue_from_table_is_the_distinct_kernels_in_a_reproducible_order(tmp_path: Path) -> None:
    op = load_op(_compose_op(tmp_path, MATMUL, "tmm").op)
    rng = np.random.default_rng(0)
    kernels = pd.DataFrame({"block_m": [64, 128, 64, 32], "block_n": [64, 64, 32, 32], "num_warps": [4, 4, 4, 2],
                            "num_stages": [2, 3, 2, 2]})
    table = pd.concat([kernels.assign(rows=r, cols=8, depth=64, precision=p)
                       for r in (16, 32) for p in ("fp16", "fp32")], ignore_index=True)
    cat = op.catalogue_from_table(table)
    assert len(cat) == 4 and cat.kernel_id.tolist() == [0, 1, 2, 3]
    assert cat.kernel_name.tolist() == ["bm32_bn32_w2_s2", "bm64_bn32_w4_s2", "bm64_bn64_w4_s2", "bm128_bn64_w4_s3"]
    shuffled = op.catalogue_from_table(table.iloc[rng.permutation(len(table))])
    assert op.catalogue_hash(shuffled) == op.catalogue_hash(cat)
    assert op.catalogue_hash(op.catalogue_from_table(table[table.block_m != 128])) != op.catalogue_hash(cat)


# -- the fp8 scaled-mm 6-tuple family on gfx1151 ----------------------------------------------------
def _scaled_mm_fixture() -> pd.DataFrame:
    """A small synthetic table: 3 problems x 5 configs, microsecond times, inf where the build failed."""
    configs = [(2, 4, 2, 2, 4, 4), (2, 4, 2, 2, 2, 4), (2, 2, 2, 2, 2, 4), (1, 4, 2, 2, 4, 2), (4, 4, 2, 4, 4, 4)]
    rows = []
    for m, n, k in ((1, 4096, 4096), (128, 4096, 4096), (4096, 4096, 1024)):
        for i, c in enumerate(configs):
            rows.append(dict(zip(("warps_m", "warps_n", "repeat_n", "k_pack", "repeat_m", "stages"), c), m=m, n=n,
                             k=k, time_us=float("inf") if c == (2, 4, 2, 2, 2, 4) else 10.0 + i + m / 100))
    return pd.DataFrame(rows)


def test_scaled_mm_rule_refuses_the_config_that_fails_the_static_assert(tmp_path: Path) -> None:
    cfg = _compose_op(tmp_path, SCALED_MM, "scaled_mm_fp8", "arch=gfx1151")
    op = load_op(cfg.op)
    table = _scaled_mm_fixture()
    names = [op.format_name(r) for r in table.to_dict("records")]
    assert names[:2] == ["(2,4,2,2,4,4)", "(2,4,2,2,2,4)"]
    assert op.parse_name("(2,4,2,2,2,4)") == {"warps_m": 2, "warps_n": 4, "repeat_n": 2, "k_pack": 2,
                                              "repeat_m": 2, "stages": 4}
    with pytest.raises(KernelNameError, match="expected 6 values"):
        op.parse_name("(2,4,2,2,4)")
    valid, reason = op.validity(table, table, arch=cfg.arch)
    by_name = dict(zip(names, zip(valid, reason)))
    assert by_name["(2,4,2,2,4,4)"] == (True, "")
    assert not by_name["(2,4,2,2,2,4)"][0] and "kShASize >= kCShuffleSize" in by_name["(2,4,2,2,2,4)"][1]
    # with warps_n = 2 the same repeat_m is enough
    assert by_name["(2,2,2,2,2,4)"] == (True, "")
    # every failure in the fixture is one the rules foresee
    assert set(np.flatnonzero(np.isinf(table.time_us))) <= set(np.flatnonzero(~valid))
    # (4*4 + 4*2) * 16 * 64 * 4 = 96 KiB of staged tiles: more than gfx1151's 64 KiB of LDS
    assert by_name["(4,4,2,4,4,4)"] == (False, "the staged A and B tiles exceed LDS")


def test_scaled_mm_onnx_mask_equals_the_rules(tmp_path: Path) -> None:
    from ckpred.export.onnx import build_mask_model, session
    from ckpred.export.validity import mask_builder_for

    cfg = _compose_op(tmp_path, SCALED_MM, "scaled_mm_fp8", "arch=gfx1151")
    op = load_op(cfg.op)
    table = _scaled_mm_fixture()
    cat = op.catalogue_from_table(table)
    arch = arch_config("gfx1151")
    shapes = np.array([[1, 4096, 4096], [128, 4096, 4096], [64, 64, 48], [4096, 4096, 1024]], dtype=np.int64)
    model = build_mask_model(op, cat, arch=arch, dtype="fp8", layout="rcr", mask_builder=mask_builder_for(op))
    got = session(model).run(None, {"problem": shapes})[0]
    for j, shape in enumerate(shapes):
        problems = pd.DataFrame([shape] * len(cat), columns=["m", "n", "k"])
        want, _ = op.validity(problems, cat, arch=arch)
        assert got[j].tolist() == want.tolist(), shape
    assert not got[2].any() and got[0].any()  # K = 48 is no multiple of any block_k here


def test_hardware_constants_come_from_the_arch_given(tmp_path: Path) -> None:
    """The same rule on a 160 KiB-LDS arch accepts the config a 64 KiB one refuses."""
    op = load_op(_compose_op(tmp_path, SCALED_MM, "scaled_mm_fp8").op)
    table = _scaled_mm_fixture().iloc[[4]]
    assert not op.validity(table, table, arch=arch_config("gfx1151"))[0][0]
    assert op.validity(table, table, arch=arch_config("gfx950"))[0][0]


# -- the three keys in the engine ------------------------------------------------------------------
def _tmm_table(op) -> pd.DataFrame:
    """4 shapes x 2 dtypes = 8 queries (4 CV groups), 3 kernels each."""
    rng = np.random.default_rng(1)
    rows = []
    for r in (16, 32, 64, 128):
        for p in ("fp16", "fp32"):
            for bm in (32, 64, 128):
                kernel = {"block_m": bm, "block_n": 32, "num_warps": 4, "num_stages": 2}
                rows.append({"rows": r, "cols": 64, "depth": 64, "precision": p, **kernel,
                             "kernel_name": op.format_name(kernel), "tflops": float(rng.uniform(1, 10)),
                             "is_valid": True})
    return pd.DataFrame(rows)


def test_folds_hold_out_cv_groups_while_queries_stay_apart(tmp_path: Path) -> None:
    from ckpred.cv import make_folds
    from ckpred.fitting import prepare

    cfg = _compose_op(tmp_path, MATMUL, "tmm", "cv.n_splits=2")
    op = load_op(cfg.op)
    data = prepare(_tmm_table(op), op, cfg)
    assert data.groups.n_shapes == 8 and len(np.unique(data.cv_groups)) == 4
    folds = make_folds(cfg.cv, data, seed=0)
    assert len(folds) == 2
    for fold in folds:
        assert not set(data.cv_groups[fold.train_shapes]) & set(data.cv_groups[fold.test_shapes])
        # a held-out shape is tested in both dtypes
        held = data.shapes.precision[fold.test_shapes].tolist()
        assert held.count("fp16") == held.count("fp32") == len(held) // 2
    tested = np.concatenate([f.test_shapes for f in folds])
    assert sorted(tested.tolist()) == list(range(8))
    with pytest.raises(ValueError, match="the data has 4 CV groups"):
        make_folds(_compose_op(tmp_path, MATMUL, "tmm", "cv.n_splits=5").cv, data, seed=0)


def test_external_test_table_uses_its_own_arch(tmp_path: Path) -> None:
    from ckpred.cv import External

    cfg = _compose_op(tmp_path, MATMUL, "tmm", "arch=gfx950", "cv=external")
    same = pd.DataFrame({"arch": ["gfx950"] * 3})
    other = pd.DataFrame({"arch": ["gfx1100"] * 3})
    assert External(cfg.cv).test_arch(cfg.arch, same) is cfg.arch
    assert External(cfg.cv).test_arch(cfg.arch, other).compute_units == 70
    cfg.cv.arch = arch_config("gfx1032")
    assert External(cfg.cv).test_arch(cfg.arch, other).name == "gfx1032"
    # on the command line: +arch@cv.arch=<name>
    given = _compose_op(tmp_path, MATMUL, "tmm", "cv=external", "cv.data.source=path", "cv.data.path=t.csv",
                        "+arch@cv.arch=gfx1100")
    assert External(given.cv).test_arch(given.arch, same).compute_units == 70


@pytest.mark.slow
def test_ck_gemm_folds_are_the_folds_of_its_query_key() -> None:
    """gemm_universal's CV group is its query key, so the folds are those of a per-shape split."""
    from dataclasses import replace

    from ckpred.cv import make_folds
    from ckpred.fitting import prepare

    cfg = compose("train", [])
    op = load_op(cfg.op)
    kernels = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).head(2)
    shapes = [(m, n, 4096) for m in (1, 16, 128, 1024) for n in (512, 4096, 7168)]
    table = pd.concat([kernels.assign(m=m, n=n, k=k, split_k=1, tflops=float(i + 1), is_valid=True)
                       for i, (m, n, k) in enumerate(shapes)], ignore_index=True)
    data = prepare(table, op, cfg)
    assert data.cv_groups.tolist() == list(range(len(shapes)))
    per_shape = replace(data, cv_groups=np.zeros(0, dtype=np.int64))  # groups = shape indices
    for cv in ("group_kfold", "holdout"):
        cv_cfg = compose("train", [f"cv={cv}"]).cv
        ours, theirs = make_folds(cv_cfg, data, seed=3), make_folds(cv_cfg, per_shape, seed=3)
        assert [(f.train_shapes.tolist(), f.test_shapes.tolist()) for f in ours] == \
            [(f.train_shapes.tolist(), f.test_shapes.tolist()) for f in theirs]


def test_a_template_parses_each_kind_and_formats_the_canonical_name() -> None:
    """Each placeholder kind's text -> value (written forms the pattern allows that are not the
    canonical ones included) and value -> text: what makes two forms of a name one kernel."""
    from ckpred.kernels.template import KernelTemplate

    kinds = {"tile": ("int", ()), "scale": ("float", ()), "pad": ("bool", ()), "pipe": ("categorical", ("mem", "memv2"))}
    template = KernelTemplate("k_{pipe}_{tile}x_{scale}_{pad}", kinds, key="op.kernel_id.template")
    got = template.parse("k_memv2_064x_1.50_true")
    assert got == {"pipe": "memv2", "tile": 64, "scale": 1.5, "pad": True}
    assert [type(v) for v in got.values()] == [str, int, float, bool]
    assert template.format(got) == "k_memv2_64x_1.5_True"
    assert template.parse("k_mem_-3x_2e3_False") == {"pipe": "mem", "tile": -3, "scale": 2000.0, "pad": False}
    assert template.format({"pipe": "mem", "tile": 7.0, "scale": 2, "pad": 0}) == "k_mem_7x_2.0_False"
    with pytest.raises(KernelNameError, match="tile"):
        template.parse("k_mem_x_1.0_True")
