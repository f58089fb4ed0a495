"""grouped_conv_fwd: name grammar, catalogue, validity, FLOPs against AMD's measurements."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import KernelNameError
from ckpred.kernels.base import load_op
from tests.conftest import data_file

CONV_DIR = "ck_grouped_conv_fwd_bf16_gfx950"
OP = load_op("grouped_conv_fwd")


def _problem(**kw: int) -> pd.DataFrame:
    base = dict(n=1, c=64, k=128, g=1, hi=56, wi=56, y=3, x=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1,
                dilation_h=1, dilation_w=1)
    base.update(kw)
    return pd.DataFrame([base])


def _read_amd(name: str) -> pd.DataFrame:
    frame = pd.read_csv(data_file(CONV_DIR, name))
    frame.columns = [c.lower() for c in frame.columns]
    return frame


# -- names ---------------------------------------------------------------------------------------
def test_parse_name_reads_every_field() -> None:
    fields = OP.parse_name("grouped_conv_forward_bf16_2d_128x64x128_compv4")
    assert fields == {"dtype": "bf16", "spatial_dims": 2, "tile_m": 128, "tile_n": 64, "tile_k": 128,
                      "pipeline": "compv4"}


def test_parse_name_3d_kernel() -> None:
    assert OP.parse_name("grouped_conv_forward_fp16_3d_16x64x64_compv5")["spatial_dims"] == 3


@pytest.mark.parametrize(("name", "fragment"), [
    ("grouped_conv_backward_bf16_2d_64x64x64_compv3", "expected the text 'grouped_conv_forward_'"),
    ("grouped_conv_forward_bf16_2d_64x64_compv3", "expected the text 'x' at '_compv3'"),
    ("grouped_conv_forward_bf16_2d_64x64x64_compv9", "at 'compv9'"),
    ("grouped_conv_forward_bf16_2d", "expected the text 'd_' at 'd'"),
    ("grouped_conv_forward_bf16_2d_64x64x64_compv3_x", "unexpected text '_x'"),
])
def test_parse_name_errors_say_which_part(name: str, fragment: str) -> None:
    with pytest.raises(KernelNameError) as err:
        OP.parse_name(name)
    assert name in str(err.value) and fragment in str(err.value)


def test_a_4d_name_parses_and_its_kernel_is_invalid() -> None:
    """The template reads any integer dimension count; the op's rule refuses non-2-D kernels."""
    kernel = OP.parse_name("grouped_conv_forward_bf16_4d_64x64x64_compv3")
    assert kernel["spatial_dims"] == 4
    valid, reason = OP.validity(_problem(), pd.DataFrame([kernel]))
    assert not valid[0] and "not a 2-D" in reason[0]


def test_catalogue_round_trips_through_the_grammar() -> None:
    cat = OP.catalogue("gfx950", "bf16", "rcr")
    for row in cat.to_dict("records"):
        parsed = OP.parse_name(row["kernel_name"])
        assert {k: row[k] for k in OP.kernel_names} == {k: parsed[k] for k in OP.kernel_names}
        assert OP.format_name(parsed, dtype="bf16") == row["kernel_name"]


# -- catalogue -----------------------------------------------------------------------------------
def test_catalogue_is_ten_tiles_times_three_pipelines() -> None:
    cat = OP.catalogue("gfx950", "bf16", "rcr")
    assert len(cat) == 30 and list(cat.kernel_id) == list(range(30))
    assert cat.kernel_name.is_unique
    assert cat.groupby("pipeline").size().to_dict() == {"compv3": 10, "compv4": 10, "compv5": 10}
    assert len(cat[["tile_m", "tile_n", "tile_k"]].drop_duplicates()) == 10
    assert not ((cat.tile_n == 128) & (cat.tile_k == 128)).any()


def test_catalogue_unknown_dtype_names_supported() -> None:
    with pytest.raises(ValueError, match="fp8.*bf16"):
        OP.catalogue("gfx950", "fp8", "rcr")


def test_catalogue_matches_amd_benchmark_kernels() -> None:
    bench = _read_amd("benchmark_forward_300_bf16_gfx950.csv")
    train = _read_amd("training_data_forward_bf16_20.csv")
    names = set(OP.catalogue("gfx950", "bf16", "rcr").kernel_name)
    assert set(bench.kernel) == names
    assert set(train.kernel) < names and not any(n.endswith("compv5") for n in train.kernel)


# -- validity, geometry, flops -------------------------------------------------------------------
def test_output_size_with_padding_stride_dilation() -> None:
    ho, wo = OP.output_hw(_problem(hi=7, wi=8, y=3, x=3, stride_h=2, stride_w=1, pad_h=1, pad_w=0,
                                   dilation_h=1, dilation_w=2))
    # ho = (7 + 2 - 2 - 1)//2 + 1 = 4 ; wo = (8 + 0 - 4 - 1)//1 + 1 = 4
    assert (ho[0], wo[0]) == (4, 4)


def test_validity_rejects_empty_output_and_3d_kernels() -> None:
    problems = pd.concat([_problem(), _problem(hi=2, y=5, pad_h=0), _problem(c=0), _problem()],
                         ignore_index=True)
    kernels = pd.DataFrame({"tile_m": [64] * 4, "tile_n": [64] * 4, "tile_k": [64] * 4,
                            "pipeline": ["compv3"] * 4, "spatial_dims": [2, 2, 2, 3]})
    valid, reason = OP.validity(problems, kernels)
    assert valid.tolist() == [True, False, False, False]
    assert "empty output" in reason[1] and "degenerate" in reason[2] and "2-D" in reason[3]


def test_flops_and_gemm_view_by_hand() -> None:
    p = _problem(n=2, c=8, k=16, g=4, hi=10, wi=12, y=3, x=1, pad_h=0, pad_w=0)
    m, n, k = OP.gemm_view(p)
    assert (m[0], n[0], k[0]) == (2 * 8 * 12, 16, 8 * 3)
    assert OP.flops(p)[0] == 2 * 4 * (2 * 8 * 12) * 16 * (8 * 3)


def test_family_uses_implicit_gemm_m() -> None:
    sizes = [dict(n=1, hi=1, wi=1, y=1, x=1, pad_h=0, pad_w=0), dict(n=2, hi=8, wi=8, y=1, x=1, pad_h=0, pad_w=0),
             dict(n=1, hi=16, wi=16, y=1, x=1, pad_h=0, pad_w=0), dict(n=4, hi=16, wi=16, y=1, x=1, pad_h=0, pad_w=0)]
    problems = pd.concat([_problem(**s) for s in sizes], ignore_index=True)
    assert OP.family(problems).tolist() == ["tiny", "medium", "medium", "large"]


@pytest.mark.parametrize("name", ["benchmark_forward_300_bf16_gfx950.csv", "training_data_forward_bf16_20.csv"])
def test_flops_identity_on_amd_measurements(name: str) -> None:
    table = _read_amd(name)
    measured = table.latency_ms.to_numpy() * table.tflops.to_numpy() * 1e9
    np.testing.assert_allclose(measured, OP.flops(table), rtol=1e-12)
    valid, _ = OP.validity(table, pd.DataFrame([OP.parse_name(k) for k in table.kernel]))
    assert valid.all()


def test_group_key_merges_repeated_problem_ids() -> None:
    bench = _read_amd("benchmark_forward_300_bf16_gfx950.csv")
    bench["dilation_h"] = bench["dilation_w"] = 1
    keys = OP.shape_keys(bench)
    assert bench.problem_idx.nunique() == 231 and keys.nunique() == 230
    assert keys[bench.problem_idx == 143].iloc[0] == keys[bench.problem_idx == 212].iloc[0]


# -- features ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def conv_cfg():
    from ckpred.config import compose

    return compose("ingest", ["data.path=x", "arch=gfx950", "dtype=bf16", "op=grouped_conv_fwd"])


def _raw(problems: pd.DataFrame, tile: tuple[int, int, int] = (64, 64, 64), pipeline: str = "compv3") -> pd.DataFrame:
    frame = problems.assign(tile_m=tile[0], tile_n=tile[1], tile_k=tile[2], pipeline=pipeline, spatial_dims=2)
    return OP.encode_frame(frame)


def _conv_features(cfg, name: str, X: pd.DataFrame) -> dict[str, np.ndarray]:
    from ckpred.features import build_features
    from ckpred.config import feature_set

    union = build_features(feature_set(name), OP, cfg.arch, cfg.dtype, cfg.layout).fit(X)
    return dict(zip(union.get_feature_names_out(), union.transform(X).T))


def test_conv_features_by_hand(conv_cfg) -> None:
    # 2 x (8 ch/group, 4 groups) 10x12 input, 3x1 filter, no pad: ho = 8, wo = 12.
    X = _raw(_problem(n=2, c=8, k=16, g=4, hi=10, wi=12, y=3, x=1, pad_h=0, pad_w=0), tile=(64, 64, 128))
    f = _conv_features(conv_cfg, "conv_full", X)
    m, n, k = 2 * 8 * 12, 16, 8 * 3
    assert (f["conv_problem__ho"][0], f["conv_problem__wo"][0]) == (8, 12)
    assert (f["conv_problem__gemm_m"][0], f["conv_problem__gemm_n"][0], f["conv_problem__gemm_k"][0]) == (m, n, k)
    flops = 2 * 4 * m * n * k
    # log2 features are rounded to float32 (NumpyOps.log2), hence rel=2**-24 on them.
    assert f["conv_problem__log2_flops"][0] == pytest.approx(np.log2(flops), rel=2.0**-24)
    tensor_bytes = (2 * 10 * 12 * 8 * 4 + 4 * 16 * 8 * 3) * 2 + 4 * m * n * 2
    assert f["conv_problem__arithmetic_intensity"][0] == pytest.approx(flops / tensor_bytes, rel=1e-15)
    compute_us, memory_us = flops / 2517e6, tensor_bytes / 8000e3
    assert f["conv_problem__log2_roofline_us"][0] == pytest.approx(np.log2(max(compute_us, memory_us)), rel=2.0**-24)
    assert (f["conv_problem__is_1x1"][0], f["conv_problem__is_grouped"][0], f["conv_problem__is_depthwise"][0]) == (0, 1, 0)
    # tiles: ceil(192/64) = 3, ceil(16/64) = 1, ceil(24/128) = 1; grid 4*3*1 = 12 < 256 CUs
    assert (f["conv_tile__tiles_m"][0], f["conv_tile__tiles_n"][0], f["conv_tile__tiles_k"][0]) == (3, 1, 1)
    assert f["conv_tile__output_tiles"][0] == 12 and f["conv_tile__waves"][0] == 1
    assert f["conv_tile__wave_efficiency"][0] == pytest.approx(12 / 256)
    assert f["conv_tile__mn_efficiency"][0] == pytest.approx(m * n / (192 * 64))
    assert f["conv_tile__k_efficiency"][0] == pytest.approx(24 / 128)
    assert f["conv_tile__fill_k"][0] == pytest.approx(24 / 128)
    # A re-read per column of tiles (1), B per row of tiles (3), C written once; 1 wave, 1 iteration.
    traffic = 4 * (m * k * 1 + k * n * 3) * 2 + 4 * m * n * 2
    est = max(64 * 64 * 128 * 2 / (2517e6 / 256), traffic / 8000e3) + 0.3 + 0.05
    assert f["conv_tile__log2_est_us"][0] == pytest.approx(np.log2(est), rel=2.0**-24)
    assert f["conv_tile__est_vs_best"][0] >= 0 and f["conv_kernel__lds_buffers"][0] == 1


def test_conv_depthwise_1x1_flags_and_pipeline_traits(conv_cfg) -> None:
    X = pd.concat([_raw(_problem(c=1, k=1, g=32, y=1, x=1, pad_h=0, pad_w=0), pipeline=p)
                   for p in ("compv3", "compv4", "compv5")], ignore_index=True)
    f = _conv_features(conv_cfg, "conv_full", X)
    assert f["conv_problem__is_depthwise"].tolist() == [1, 1, 1] and f["conv_problem__is_1x1"].tolist() == [1, 1, 1]
    assert f["conv_kernel__lds_buffers"].tolist() == [1, 2, 1]
    assert f["conv_kernel__prefetch_stages"].tolist() == [2, 2, 1]
    assert f["conv_kernel__lds_bytes_est"].tolist() == [(64 + 64) * 64 * 2 * b for b in (1, 2, 1)]
    assert "conv_kernel__pipeline" not in f  # codes are left out: unseen pipelines go by traits


def test_est_vs_best_is_zero_for_the_analytically_best_tile(conv_cfg) -> None:
    from ckpred.kernels.grouped_conv_fwd import TILES_2BYTE

    problem = _problem(n=4, c=256, k=512, hi=28, wi=28)
    X = pd.concat([_raw(problem, tile=t) for t in TILES_2BYTE], ignore_index=True)
    f = _conv_features(conv_cfg, "conv_full", X)
    assert f["conv_tile__est_vs_best"].min() == 0.0 and (f["conv_tile__est_vs_best"] >= 0).all()
    assert f["conv_tile__iterations_vs_best"].min() == 0.0


def test_conv_latency_features_by_hand(conv_cfg) -> None:
    # The by-hand problem of test_conv_features_by_hand: one wave, one K iteration, 12 tiles.
    X = _raw(_problem(n=2, c=8, k=16, g=4, hi=10, wi=12, y=3, x=1, pad_h=0, pad_w=0), tile=(64, 64, 128))
    f = _conv_features(conv_cfg, "conv_latency", X)
    m, n, k = 2 * 8 * 12, 16, 8 * 3
    traffic = 4 * (m * k * 1 + k * n * 3) * 2 + 4 * m * n * 2
    est = max(64 * 64 * 128 * 2 / (2517e6 / 256), traffic / 8000e3) + 0.3 + 0.05
    cu_load = 1 * (64 + 64) * 128 * 2 / (8000e3 / 256)  # one iteration at 1/256 of the bandwidth
    total = 3.5 + max(est, cu_load)
    assert f["conv_latency__log2_total_us"][0] == pytest.approx(np.log2(total), rel=2.0**-24)
    assert f["conv_latency__launch_share"][0] == pytest.approx(3.5 / total, rel=1e-15)
    assert f["conv_latency__tiles_per_cu"][0] == pytest.approx(12 / 256, rel=1e-15)
    assert f["conv_latency__log2_cu_load_us"][0] == pytest.approx(np.log2(cu_load), rel=2.0**-24)


def test_launch_cost_marks_the_launch_bound_regime(conv_cfg) -> None:
    """On a few-microsecond conv the fixed launch cost dominates every tile's total and the
    predicted loss of the worst tile shrinks; on a large conv the launch cost is negligible."""
    from ckpred.kernels.grouped_conv_fwd import TILES_2BYTE

    def features(problem: pd.DataFrame) -> dict[str, np.ndarray]:
        X = pd.concat([_raw(problem, tile=t) for t in TILES_2BYTE], ignore_index=True)
        f = _conv_features(conv_cfg, "conv_latency", X)
        assert f["conv_latency__total_vs_best"].min() == 0.0 and (f["conv_latency__total_vs_best"] >= 0).all()
        return f

    # AMD's worst problem: N=4, C=5, K=20, 28x28, 1x1 (best kernel 3.7 us, < 0.2 TFLOPS).
    tiny = features(_problem(n=4, c=5, k=20, hi=28, wi=28, y=1, x=1, pad_h=0, pad_w=0))
    big = features(_problem(n=8, c=512, k=512, hi=56, wi=56))
    assert tiny["conv_latency__launch_share"].min() > 0.6 > 0.02 > big["conv_latency__launch_share"].max()
    assert tiny["conv_latency__total_vs_best"].max() < 0.5  # every tile within 1.41x of the best
    assert big["conv_latency__total_vs_best"].max() > 2.0  # the worst tile > 4x slower


@pytest.mark.parametrize("name", ["conv_full", "conv_minimal", "conv_latency"])
def test_conv_feature_sets_export_to_onnx_with_parity(conv_cfg, name: str) -> None:
    import onnxruntime as ort
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import Int64TensorType

    import ckpred.export.converters  # noqa: F401 - registers the converters
    from ckpred.features import build_features
    from ckpred.config import feature_set

    cat = OP.catalogue("gfx950", "bf16", "rcr")
    problems = pd.concat([_problem(), _problem(n=8, c=3, k=5, hi=1025, wi=7, y=7, x=7, stride_h=4, stride_w=16,
                                               pad_h=3, pad_w=0), _problem(hi=1, wi=1, y=1, x=1, pad_h=0, pad_w=0)],
                         ignore_index=True)
    rows = problems.merge(cat.drop(columns=["kernel_id", "kernel_name"]), how="cross")
    X = OP.encode_frame(rows)
    union = build_features(feature_set(name), OP, conv_cfg.arch, conv_cfg.dtype, conv_cfg.layout).fit(X)
    expected = union.transform(X)
    assert len(set(union.get_feature_names_out())) == expected.shape[1]
    onx = to_onnx(union, initial_types=[("X", Int64TensorType([None, X.shape[1]]))],
                  target_opset={"": 17, "ai.onnx.ml": 3})
    got = ort.InferenceSession(onx.SerializeToString()).run(None, {"X": X.to_numpy()})[0]
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)


# -- reduced Protocol B on AMD's measurements -----------------------------------------------------
@pytest.mark.slow
def test_reduced_protocol_b_beats_baselines_on_amd_data(tmp_path) -> None:
    """5-fold GroupKFold by problem over the 30-kernel table with a small ranker (CI-sized).

    The full-size run and Protocol A are ``scripts/bench/conv_proof.py``; this checks the wiring
    (ingest -> conv features -> ranker -> per-problem metrics) and that learning beats the
    baselines by a margin no baseline reaches by chance.
    """
    import json

    from ckpred.config import compose
    from ckpred.commands.train import train

    bench = data_file(CONV_DIR, "benchmark_forward_300_bf16_gfx950.csv")
    cfg = compose("train", ["experiment=ck_conv_gfx950", f"data.path={bench}", f"out_dir={tmp_path}",
                            "model.n_estimators=40", "model.n_jobs=1", "baselines.reference.enabled=false",
                            "plots=false", "progress=false", "save_pipeline=false"])
    mean = train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # 230 distinct convolutions: problem_idx 143 and 212 are one problem, merged by the group key.
    assert metrics["model"]["n_shapes"] == 230
    assert mean == pytest.approx(metrics["model"]["mean"])
    assert mean > 0.95 and metrics["model"]["p10"] > 0.88
    assert mean > metrics["best_static"]["mean"] + 0.1 > metrics["random"]["mean"] + 0.1
    # The analytical baseline runs on the op's implicit-GEMM view (OpDefinition.gemm_view).
    assert 0.5 < metrics["analytical"]["mean"] < mean
    folds = json.loads((tmp_path / "folds.json").read_text())
    tested = [key for fold in folds["folds"] for key in fold["test_shapes"]]
    assert len(folds["folds"]) == 5 and len(tested) == len(set(tested)) == 230  # each shape tested once


@pytest.mark.slow
def test_experiment_exports_like_it_trains(tmp_path) -> None:
    """``export experiment=ck_conv_gfx950`` composes (the experiment holds recipe keys only) and
    fits, compiles and parity-checks the conv selector on AMD's table."""
    import json

    from ckpred.config import compose
    from ckpred.commands.export import export_command

    bench = data_file(CONV_DIR, "benchmark_forward_300_bf16_gfx950.csv")
    recipe = ["experiment=ck_conv_gfx950", f"data.path={bench}", "model.n_estimators=20"]
    train_cfg = compose("train", recipe)
    cfg = compose("export", [*recipe, f"out_dir={tmp_path}", "parity.shapes=8", "reranker.n_estimators=10",
                             "reranker.num_leaves=7"])
    # the same recipe in both commands
    for key in ("op", "arch", "dtype", "features", "model", "target", "data"):
        assert getattr(cfg, key) == getattr(train_cfg, key), key
    from pathlib import Path

    manifest = json.loads((Path(export_command(cfg)) / "manifest.json").read_text())
    assert manifest["op"] == "grouped_conv_fwd" and manifest["dtype"] == "bf16" and manifest["arch"] == "gfx950"
    assert manifest["catalogue"]["count"] == 30 and manifest["training"]["shapes"] == 230
    assert manifest["parity"]["checked"] and manifest["parity"]["top1_agreement"] == 1.0
    # `select experiment=...` finds the same export: the experiment names op, arch, dtype, layout
    from ckpred.commands.select import select_command

    problem = ["problem.n=1", "problem.c=256", "problem.k=768", "problem.hi=64", "problem.wi=64", "problem.y=1",
               "problem.x=1"]
    answer = select_command(compose("select", ["experiment=ck_conv_gfx950", f"exports_dir={tmp_path}", "json=true",
                                               "top_k=3", *problem]))
    assert answer["ok"] and len(answer["kernels"]) == 3
    assert all(k["name"].startswith("grouped_conv_forward_bf16_2d_") for k in answer["kernels"])


def test_onnx_validity_mask_equals_python_rules() -> None:
    from ckpred.export.onnx import build_mask_model, session
    from ckpred.export.validity import mask_builder_for

    cat = OP.catalogue("gfx950", "bf16", "rcr")
    cat = pd.concat([cat, cat.head(1).assign(spatial_dims=3, kernel_id=30)], ignore_index=True)
    problems = pd.concat([
        _problem(), _problem(hi=2, y=5, pad_h=0), _problem(hi=2, y=5, pad_h=2), _problem(wi=3, x=2, dilation_w=3),
        _problem(wi=4, x=2, dilation_w=3, pad_w=0), _problem(c=0), _problem(stride_w=0), _problem(pad_h=-1),
        _problem(hi=1, wi=1, y=1, x=1, pad_h=0, pad_w=0), _problem(hi=1, wi=1, y=3, x=3, stride_h=7, stride_w=7),
    ], ignore_index=True)
    model = build_mask_model(OP, cat, arch="gfx950", dtype="bf16", layout="rcr", mask_builder=mask_builder_for(OP))
    got = session(model).run(None, {"problem": OP.encode(problems, OP.problem_names)})[0]
    rows = problems.merge(cat, how="cross")
    expected, _ = OP.validity(rows[list(OP.problem_names)], rows[list(OP.kernel_names)])
    np.testing.assert_array_equal(got, expected.reshape(len(problems), len(cat)))
    assert got[0].sum() == 30 and not got[1].any() and got[2, :30].all() and not got[:, 30].any()


# -- scripts/bench/conv_proof.py and the protocols of ckpred.data.ck_conv ------------------------------
def _script(path: str):
    """Import the script ``scripts/<path>.py`` as a module (registered in ``sys.modules`` so its
    dataclasses resolve their annotations)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "script_" + path.replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{path}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _conv_proof():
    return _script("bench/conv_proof")


@pytest.mark.slow
def test_selection_protocol_never_sees_the_benchmark(tmp_path) -> None:
    """Protocol T (where the recipe is chosen) trains and tests on the training table only;
    A tests on the benchmark, B trains and tests on it."""
    import dataclasses
    from pathlib import Path

    from ckpred.config import compose
    from ckpred.data import ck_conv as proof

    data_dir = Path("/data/conv")
    cfgs = {p: compose("train", proof.protocol_overrides(p, data_dir, tmp_path)) for p in ("T", "A", "B")}
    assert cfgs["T"].data.path == str(data_dir / proof.TRAIN) and cfgs["T"].cv.name == "group_kfold"
    assert proof.BENCH not in str(dataclasses.asdict(cfgs["T"]))
    assert cfgs["A"].data.path == str(data_dir / proof.TRAIN) and cfgs["A"].cv.data.path == str(data_dir / proof.BENCH)
    assert cfgs["B"].data.path == str(data_dir / proof.BENCH) and cfgs["B"].cv.name == "group_kfold"
    assert cfgs["T"].model.relevance_exponent == 0.5  # the recipe chosen on T (experiment config)
    with pytest.raises(ValueError, match="allowed: A, B, T"):
        proof.protocol_overrides("C", data_dir, tmp_path)


def test_noise_regimes_of_the_proof_table() -> None:
    """conv_proof's per-regime table: best time, compv3/compv5 twin spread, twin-blind and
    re-measured oracles; the repeated-problem check."""
    proof = _conv_proof()

    def problem(idx: int, c: int, times: dict[str, float]) -> list[dict]:
        fields = dict(problem_idx=idx, N=1, C=c, K=64, G=1, Hi=8, Wi=8, Y=1, X=1, stride_h=1, stride_w=1, pad_h=0,
                      pad_w=0, tflops=1.0, non_zero=0)
        return [{**fields, "kernel": f"grouped_conv_forward_bf16_2d_{name}", "latency_ms": us / 1e3}
                for name, us in times.items()]

    small = {"16x64x64_compv3": 4.0, "16x64x64_compv5": 5.0, "16x64x64_compv4": 8.0,
             "64x64x64_compv3": 10.0, "64x64x64_compv5": 10.0, "64x64x64_compv4": 6.0}
    large = {"16x64x64_compv3": 40.0, "16x64x64_compv5": 40.0, "16x64x64_compv4": 50.0,
             "64x64x64_compv3": 30.0, "64x64x64_compv5": 33.0, "64x64x64_compv4": 60.0}
    crossed = {"16x64x64_compv3": 20.0, "16x64x64_compv5": 22.0, "16x64x64_compv4": 50.0,
               "64x64x64_compv3": 21.0, "64x64x64_compv5": 21.0, "64x64x64_compv4": 60.0}
    bench = pd.DataFrame(problem(0, 8, small) + problem(1, 16, large) + problem(3, 32, crossed)
                         + problem(2, 16, {k: 2 * v for k, v in large.items()}))  # a repeat of problem 1: dropped
    noise = proof.problem_noise(bench).set_index("C")
    assert list(noise.index) == [8, 16, 32]
    assert noise.loc[8, "best_us"] == pytest.approx(4.0) and noise.loc[16, "best_us"] == pytest.approx(30.0)
    # twin spread: median over tiles of |log(t_compv5 / t_compv3)|
    assert noise.loc[8, "twin_spread"] == pytest.approx(np.median([np.log(5 / 4), 0.0]))
    # oracle: the class with the fastest member; a twin class scores the mean of its twins
    assert noise.loc[8, "oracle"] == pytest.approx((4 / 4 + 4 / 5) / 2)
    assert noise.loc[16, "oracle"] == pytest.approx((30 / 30 + 30 / 33) / 2)
    # re-measured: the tile fastest in the compv3 run scored by the compv5 run, and the reverse
    assert noise.loc[8, "remeasured"] == pytest.approx(1.0) and noise.loc[16, "remeasured"] == pytest.approx(1.0)
    assert noise.loc[32, "remeasured"] == pytest.approx((21 / 22 + 20 / 21) / 2)
    (repeat,) = proof.repeated_problems(bench)
    # problem 2 times every kernel of problem 1 twice as long: the same kernel wins in both runs
    assert repeat.startswith("problem_idx 1 / 2 (") and "best 30.0 us" in repeat
    assert "fastest in 1 scores 100.0% in 2; fastest in 2 scores 100.0% in 1" in repeat
    assert "median per-kernel difference 69.31%" in repeat
    per_shape = pd.DataFrame({"n": [1, 1], "c": [8, 16], "k": [64, 64], "g": 1, "hi": 8, "wi": 8, "y": 1, "x": 1,
                              "stride_h": 1, "stride_w": 1, "pad_h": 0, "pad_w": 0, "model_efficiency": [0.95, 1.0]})
    table = proof.regime_table(noise.reset_index(), {"B": per_shape}).splitlines()
    assert table[0].startswith("| best kernel time | problems |")
    assert table[0].endswith("| twin-blind oracle | re-measured oracle | B ckpred |")
    assert table[2].startswith("| 0-5 us | 1 |") and table[2].endswith("| 95.0 / 1 |")
    # the crossed problem has no model row: the model's cell counts only problem 1
    assert table[3].startswith("| >= 20 us | 2 |") and table[3].endswith("| 97.7 / 1 | 100.0 / 0 |")
    assert table[-1].startswith("| all | 3 |") and table[-1].endswith("| 97.5 / 1 |")


# -- scripts/research/conv_variants.py -------------------------------------------------------------
def _conv_variants():
    return _script("research/conv_variants")


def test_conv_variants_refuses_bad_arguments(capsys) -> None:
    variants = _conv_variants()
    assert variants.main(["--list"]) == 0 and "plus_training_table" in capsys.readouterr().out
    for argv, message in ((["--variants", "base,bogus"], "unknown variant(s) ['bogus']"),
                          (["--protocols", "T,C"], "allowed T, A, B"),
                          (["--seeds", "0,x"], "allowed comma-separated integers"),
                          (["--variants", "plus_training_table", "--protocols", "T,B"], "only with --protocols B")):
        with pytest.raises(SystemExit) as err:
            variants.main(argv)
        assert err.value.code == 2 and message in capsys.readouterr().err


def test_conv_variants_scores_every_problem_once_out_of_fold() -> None:
    """The fold loop covers each test row once: a fold-independent score (the analytical
    estimate) gives exactly the summary of scoring the whole table at once."""
    from ckpred import evaluate as ev

    variants = _conv_variants()
    data_file(CONV_DIR, "training_data_forward_bf16_20.csv")
    ctx = variants.load_context("T", 0, variants.DATA_DIR)
    est = ctx.names.index("log2_est_us")
    got = variants.evaluate(ctx, lambda fit: -fit.X_test[:, est])
    whole = ev.summarize(ev.shape_metrics(ctx.test.perf, -ctx.test_features[:, est], ctx.test.groups,
                                          ctx.test.selectable))
    assert got == whole and got["n_shapes"] == 185 and 0.5 < got["mean"] < 0.99


def test_proof_states_each_goal_met_or_missed() -> None:
    proof = _conv_proof()
    results = {"A": {"model_selector": {"mean": 0.978, "p10": 0.934, "min": 0.404}},
               "T": {"model_selector": {"mean": 0.99, "p10": 0.97, "min": 0.8}}}
    assert proof.goal_lines(results) == [
        "A: mean 97.8 (goal >= 97: met), p10 93.4 (goal >= 92: met), min 40.4 (goal >= 80: missed)"]


def test_conv_variants_tile_context_agrees_with_conv_tile() -> None:
    """tile_context's per-tile estimates are conv_tile's: on each row, the column of the row's
    own tile equals its est_vs_best, and the best catalogue tile's column is 0."""
    from ckpred.kernels.grouped_conv_fwd import TILES_2BYTE

    variants = _conv_variants()
    data_file(CONV_DIR, "training_data_forward_bf16_20.csv")
    ctx = variants.load_context("T", 0, variants.DATA_DIR)
    X, at = ctx.features[:2000], ctx.index
    columns = variants.tile_context_columns(X, ctx.data.groups.codes[:2000], ctx)
    assert columns.shape == (2000, 3 * len(TILES_2BYTE))
    estimates = columns[:, :len(TILES_2BYTE)]
    own = [TILES_2BYTE.index((int(m), int(n), int(k)))
           for m, n, k in X[:, [at["tile_m"], at["tile_n"], at["tile_k"]]]]
    np.testing.assert_allclose(estimates[np.arange(2000), own], X[:, at["est_vs_best"]], atol=1e-9)
    np.testing.assert_array_equal(estimates.min(axis=1), 0.0)
    z = variants._per_problem_z(np.array([1.0, 2.0, 3.0, 10.0, 30.0]), np.array([0, 0, 0, 1, 1]))
    np.testing.assert_allclose(z, [-1.0, 0.0, 1.0, -np.sqrt(0.5), np.sqrt(0.5)])
