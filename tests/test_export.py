"""Export: ONNX parity with sklearn (scorer and selector), precision, validity mask, manifest, atomicity."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pandas as pd
import pytest

from ckpred.errors import ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export.build import ExportOptions, export_pipeline, reference_selection
from ckpred.export.validity import mask_builder_for
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table

KINDS = [("regressor", "log1p"), ("regressor", "raw"), ("ranker", "rank")]


@pytest.fixture(scope="module")
def setup():
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    return op, cfg, table


@pytest.fixture(scope="module")
def exported(setup, tmp_path_factory):
    """One export per model kind, parity-checked on training + edge shapes."""
    op, cfg, table = setup
    probs = pd.DataFrame(EDGE_SHAPES + TRAIN_SHAPES, columns=["m", "n", "k"]).assign(split_k=1)
    out = {}
    for model, target in KINDS:
        pipe = fit_pipeline(op, cfg, table, model=model, target=target)
        d = tmp_path_factory.mktemp(f"export_{model}_{target}") / "gemm_universal_gfx950_fp8_rcr"
        man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                              training=mf.training_section(table, op),
                              options=ExportOptions(parity_problems=probs, metrics={"mean": 0.97}))
        out[(model, target)] = (pipe, d, man)
    return out


def _problems(shapes):
    return pd.DataFrame(shapes, columns=["m", "n", "k"]).assign(split_k=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=["log1p", "raw", "ranker"])
def test_parity_bar_recorded_and_met(exported, kind) -> None:
    par = exported[kind][2]["parity"]
    assert par["checked"] and par["shapes"] == len(EDGE_SHAPES) + len(TRAIN_SHAPES)
    assert par["top1_agreement"] == 1.0 and par["topk_agreement"] == 1.0
    assert par["max_abs_diff_scorer"] <= 1e-6 and par["max_abs_diff_selector"] <= 1e-6


@pytest.mark.parametrize("kind", KINDS, ids=["log1p", "raw", "ranker"])
def test_scorer_equals_sklearn_on_edge_shapes(setup, exported, kind) -> None:
    """Every (edge shape, kernel) row, valid or not, K up to 2^20 and M*N*K far beyond 2^24."""
    op, cfg, _ = setup
    pipe, d, _ = exported[kind]
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).sample(300, random_state=1)
    rows = _problems(EDGE_SHAPES).merge(cat, how="cross")
    X = op.encode_frame(rows).to_numpy()
    sess = xo.session(str(d / "scorer.onnx"))
    got = sess.run(["score"], {"problem": X[:, :4], "kernel": X[:, 4:]})[0]
    want = pipe.predict(op.encode_frame(rows))
    assert got.dtype == np.float64 and got.shape == (len(rows),)
    assert np.max(np.abs(got - want)) <= 1e-6


def test_selector_equals_sklearn_ranking_on_valid_shapes(setup, exported) -> None:
    """Shapes with valid kernels (incl. M=1 and K=2^20): same top-10 ids, same order, same scores."""
    op, cfg, _ = setup
    pipe, d, _ = exported[("regressor", "log1p")]
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    shapes = [(1, 1536, 7168), (1, 7168, 1 << 20), (4096, 4096, 1 << 20), (255, 192, 128), (3, 7168, 256)]
    sess = xo.session(str(d / "model.onnx"))
    for shape in shapes:
        full = _problems([shape]).merge(cat, how="cross")
        ref = pipe.predict(op.encode_frame(full))
        valid, _ = op.validity(full, full, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        assert valid.any(), shape
        r_ids, r_scores, r_n = reference_selection(ref, valid, 10)
        ids, scores, n = sess.run(None, {"problem": np.array([[*shape, 1]]), "top_k": np.array([10])})
        assert n[0] == r_n
        assert ids[0].tolist() == r_ids.tolist()
        assert np.max(np.abs(scores[0] - r_scores)) <= 1e-6


def test_selector_batch_rows_equal_single_rows(exported) -> None:
    _, d, _ = exported[("regressor", "log1p")]
    sess = xo.session(str(d / "model.onnx"))
    batch = np.array([[s[0], s[1], s[2], 1] for s in TRAIN_SHAPES[:5]], dtype=np.int64)
    ids_b, sc_b, n_b = sess.run(None, {"problem": batch, "top_k": np.array([7])})
    for j in range(len(batch)):
        ids, sc, n = sess.run(None, {"problem": batch[j:j + 1], "top_k": np.array([7])})
        assert ids[0].tolist() == ids_b[j].tolist() and np.array_equal(sc[0], sc_b[j]) and n[0] == n_b[j]


def test_selector_scores_only_valid_pairs_in_a_mixed_batch(setup, exported) -> None:
    """The trees see only the valid pairs of a batch (problems with no valid kernel among them):
    each invalid kernel scores -inf, each valid one its own score, as when run alone."""
    op, cfg, _ = setup
    _, d, man = exported[("regressor", "log1p")]
    sess = xo.session(str(d / "model.onnx"))
    shapes = [(1, 1, 7168), (128, 4096, 512), (64, 4096, 1), (1, 7168, 4096), (13, 17, 19)]
    batch = np.array([[*s, 1] for s in shapes], dtype=np.int64)
    every = np.array([man["catalogue"]["count"]])
    ids_b, sc_b, n_b = sess.run(None, {"problem": batch, "top_k": every})
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    for j, shape in enumerate(shapes):
        full = _problems([shape]).merge(cat, how="cross")
        valid, _ = op.validity(full, full, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        assert n_b[j] == valid.sum()
        assert np.isneginf(sc_b[j][~valid[ids_b[j]]]).all() and np.isfinite(sc_b[j][valid[ids_b[j]]]).all()
        ids, sc, _ = sess.run(None, {"problem": batch[j:j + 1], "top_k": every})
        assert ids[0].tolist() == ids_b[j].tolist() and np.array_equal(sc[0], sc_b[j])
    assert n_b[0] == n_b[2] == 0 and n_b[1] > 0


def test_selector_top_k_larger_than_catalogue_is_clamped(exported) -> None:
    _, d, man = exported[("regressor", "log1p")]
    sess = xo.session(str(d / "model.onnx"))
    ids, scores, n = sess.run(None, {"problem": np.array([[128, 1536, 7168, 1]]), "top_k": np.array([10 ** 6])})
    assert ids.shape == (1, man["catalogue"]["count"]) and n[0] == man["catalogue"]["count"]


def test_degenerate_problem_has_no_valid_kernel(exported) -> None:
    _, d, _ = exported[("regressor", "log1p")]
    sess = xo.session(str(d / "model.onnx"))
    for shape in ([64, 1, 4096, 1], [64, 4096, 1, 1], [0, 4096, 4096, 1]):
        _, scores, n = sess.run(None, {"problem": np.array([shape]), "top_k": np.array([3])})
        assert n[0] == 0 and np.all(np.isneginf(scores))


def test_double_trees_branch_where_float32_trees_do_not() -> None:
    """Thresholds between integers above 2^24: onnxmltools' float32 graph mis-branches, ours does not."""
    import lightgbm as lgb
    from onnxmltools.convert import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType

    from ckpred.export import lightgbm as xl

    base = float(2 ** 24)
    x = np.array([base + i for i in range(64)] * 8, dtype=np.float64).reshape(-1, 1)
    y = (x[:, 0] - base) % 2  # odd vs even: splits fall between adjacent integers
    model = lgb.LGBMRegressor(n_estimators=20, num_leaves=64, min_child_samples=1, min_data_in_bin=1,
                              max_bin=255, learning_rate=0.5, verbose=-1, n_jobs=1).fit(x, y)
    want = model.predict(x)
    xl.register()
    ours = convert_sklearn(model, initial_types=[("x", DoubleTensorType([None, 1]))],
                           target_opset={"": 21, "ai.onnx.ml": 3})
    for entry in ours.opset_import:
        if entry.domain == "ai.onnx.ml":
            entry.version = 5
    got = xo.session(ours).run(None, {"x": x})[0].ravel()
    assert np.max(np.abs(got - want)) <= 1e-9
    stock = convert_lightgbm(model, initial_types=[("x", FloatTensorType([None, 1]))], target_opset=15)
    stock_got = xo.session(stock).run(None, {"x": x.astype(np.float32)})[0].ravel()
    assert np.max(np.abs(stock_got - want)) > 0.1  # the float32 graph takes wrong branches


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["rcr", "rrr", "crr", "ccr"])
def test_validity_mask_equals_op_validity(layout) -> None:
    op = gemm()
    cfg = configs(layout=layout)
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    rng = np.random.default_rng(3)
    shapes = EDGE_SHAPES + TRAIN_SHAPES + [(int(a), int(b), int(c)) for a, b, c in
                                           rng.choice([1, 2, 63, 64, 128, 192, 256, 320, 4096, 7168, 12288], (20, 3))]
    shapes += [(-1, 64, 64)]
    model = xo.build_mask_model(op, cat, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout,
                                mask_builder=mask_builder_for(op))
    got = xo.session(model).run(None, {"problem": np.array([[*s, 1] for s in shapes], dtype=np.int64)})[0]
    for j, shape in enumerate(shapes):
        full = _problems([shape]).merge(cat, how="cross")
        want, _ = op.validity(full, full, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        assert got[j].tolist() == want.tolist(), (layout, shape)


def test_op_without_mask_builder_is_refused() -> None:
    class NoMask:
        name = "made_up_op"
        validity_onnx = None

    with pytest.raises(NotImplementedError, match="made_up_op.*validity_onnx"):
        mask_builder_for(NoMask())  # type: ignore[arg-type]


def test_unknown_target_transformer_is_refused(setup) -> None:
    import lightgbm as lgb
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    op, cfg, table = setup
    pipe = fit_pipeline(op, cfg, table, n_estimators=3)
    ttr = TransformedTargetRegressor(regressor=lgb.LGBMRegressor(n_estimators=3, verbose=-1), transformer=StandardScaler())
    X = op.encode_frame(table)
    bad = Pipeline([("features", pipe.named_steps["features"]), ("model", ttr)]).fit(X, table["tflops"])
    with pytest.raises(TypeError, match="StandardScaler"):
        xo.convert_pipeline(bad, op)


def test_manifest_content(setup, exported) -> None:
    op, cfg, table = setup
    pipe, d, man = exported[("regressor", "log1p")]
    on_disk = json.loads((d / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(man))
    assert (man["format"], man["op"], man["arch"], man["dtype"], man["layout"]) == \
        ("ckpred.export/1", "gemm_universal", "gfx950", "fp8", "rcr")
    assert man["select"] == "full" and man["opset"] == {"": 21, "ai.onnx.ml": 5}
    sel = man["graphs"]["selector"]
    assert [i["name"] for i in sel["inputs"]] == ["problem", "top_k"]
    assert [o["name"] for o in sel["outputs"]] == ["kernel_ids", "scores", "num_valid"]
    assert sel["inputs"][0]["columns"] == ["m", "n", "k", "split_k"]
    assert [i["name"] for i in man["graphs"]["scorer"]["inputs"]] == ["problem", "kernel"]
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    assert man["catalogue"]["count"] == 4608 and man["catalogue"]["hash"] == op.catalogue_hash(cat)
    assert man["catalogue"]["rows"][17][1] == cat["kernel_name"][17]
    assert man["features"] == list(pipe.named_steps["features"].get_feature_names_out())
    assert man["model"]["target"] == "log1p" and man["model"]["target_transformer"] == "Log1pTarget"
    assert man["model"]["estimator"] == "LGBMRegressor" and man["model"]["n_trees"] == 40
    tr = man["training"]
    assert tr["problem_ranges"]["m"] == [1, 16384] and tr["problem_ranges"]["k"] == [512, 7168]
    assert tr["rows"] == len(table) and len(tr["data_hash"]) == 64
    assert man["metrics"] == {"mean": 0.97}
    assert {"onnx", "onnxruntime", "lightgbm", "scikit-learn", "skl2onnx", "onnxmltools"} <= set(man["versions"])
    for name in ("model.onnx", "scorer.onnx"):
        assert man["files"][name]["sha256"] == mf.sha256_file(d / name)
        meta = {p.key: p.value for p in onnx.load(str(d / name)).metadata_props}
        assert meta["ckpred.arch"] == "gfx950" and meta["ckpred.catalogue_hash"] == man["catalogue"]["hash"]
        assert json.loads(meta["ckpred.manifest"]) == {k: v for k, v in on_disk.items() if k != "files"}
    assert man["model"]["target"] == "log1p"
    assert exported[("ranker", "rank")][2]["model"]["target"] == "rank"


def test_training_ranges_and_hash_follow_the_data(setup) -> None:
    op, cfg, table = setup
    a = mf.training_section(table, op)
    b = mf.training_section(table.assign(tflops=table["tflops"] * 1.01), op)
    assert a["data_hash"] != b["data_hash"] and a["problem_ranges"] == b["problem_ranges"]
    assert a["shapes"] == len(TRAIN_SHAPES)


@pytest.mark.slow
def test_interrupted_export_keeps_previous_export(setup, exported, tmp_path, monkeypatch) -> None:
    op, cfg, table = setup
    pipe, _, _ = exported[("regressor", "raw")]
    d = tmp_path / "gemm_universal_gfx950_fp8_rcr"
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                    training=mf.training_section(table, op))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # after the first .onnx, before the manifest
            raise OSError(28, "No space left on device (simulated)")
        real_fsync(fd)

    monkeypatch.setattr(mf.os, "fsync", failing_fsync)
    pipe2 = fit_pipeline(op, cfg, table, n_estimators=5)
    with pytest.raises(OSError, match="simulated"):
        export_pipeline(pipe2, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                        training=mf.training_section(table, op))
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]  # no temporary directory left
    monkeypatch.setattr(mf.os, "fsync", real_fsync)
    man = export_pipeline(pipe2, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op))
    assert man["model"]["n_trees"] == 5 and json.loads((d / "manifest.json").read_text())["model"]["n_trees"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]


def test_an_fsync_failure_naming_no_file_is_a_one_line_error(tmp_path, monkeypatch) -> None:
    """An I/O error from fsync carries no file name and an errno no writer expects: it still
    names the export directory (no bare OSError) and leaves nothing behind."""
    import errno

    from ckpred.errors import OutputPathError

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mf.os, "fsync", failing_fsync)
    d = tmp_path / "export"
    with pytest.raises(OutputPathError, match=f"cannot write {d}: Input/output error"):
        mf.write_export_dir(d, {"model.onnx": b"x", "manifest.json": b"{}"})
    assert list(tmp_path.iterdir()) == []


def test_failed_parity_writes_nothing(setup, exported, tmp_path, monkeypatch) -> None:
    op, cfg, table = setup
    pipe, _, _ = exported[("regressor", "log1p")]
    import ckpred.export.build as cmd

    real = cmd.parity_check

    def off_by_a_bit(*args, **kwargs):
        out = real(*args, **kwargs)
        return {**out, "max_abs_diff_scorer": 1e-3}

    monkeypatch.setattr(cmd, "parity_check", off_by_a_bit)
    with pytest.raises(ModelMismatchError, match="parity"):
        export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=tmp_path / "x",
                        training=mf.training_section(table, op),
                        options=ExportOptions(parity_problems=_problems(TRAIN_SHAPES[:2])))
    assert list(tmp_path.iterdir()) == []


def test_unknown_select_strategy_is_refused(setup, exported, tmp_path) -> None:
    op, cfg, table = setup
    pipe, _, _ = exported[("regressor", "log1p")]
    with pytest.raises(ValueError, match="export.select='cascade'.*full"):
        export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=tmp_path / "x",
                        training={}, options=ExportOptions(select="cascade"))
