"""Failed picks: the failed-pick rate, the learned validity mask (CV and exported selector), the fallback."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from ckpred import evaluate as ev
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export.build import ExportOptions, export_pipeline
from ckpred.config import compose
from ckpred.fitting import fit_method, model_method, predict, prepare, rows_of
from ckpred.models import failure_model, fit_failure_model, predicted_ok
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table

VALIDITY = OmegaConf.create({"learned": True, "threshold": 0.5, "n_estimators": 30, "num_leaves": 7,
                             "min_child_samples": 5, "n_jobs": 1})


# -- the metric on hand-made tables -------------------------------------------------------------
def test_failed_pick_rate_and_fallback_hand_computed() -> None:
    # shape 0: the top-scored kernel failed (perf 0), the next ran at 6 of best 8
    # shape 1: the pick ran (the best); shape 2: the pick is rule-masked, the next one failed
    perf = np.array([0.0, 6.0, 8.0, 5.0, 4.0, 9.0, 0.0, 3.0])
    scores = np.array([3.0, 2.0, 1.0, 1.0, 0.0, 5.0, 4.0, 1.0])
    sel = np.array([True, True, True, True, True, False, True, True])
    groups = ev.ShapeGroups.from_keys([0, 0, 0, 1, 1, 2, 2, 2])
    m = ev.shape_metrics(perf, scores, groups, sel)
    assert list(m["failed_pick"]) == [1.0, 0.0, 1.0]
    assert list(m["efficiency"]) == pytest.approx([0.0, 1.0, 0.0])
    # the dispatcher launches the next-ranked kernel when one fails
    assert list(m["fallback_efficiency"]) == pytest.approx([6 / 8, 1.0, 3 / 9])
    s = ev.summarize(m)
    assert s["failed_pick"] == pytest.approx(2 / 3) and s["failed_picks"] == 2
    assert s["fallback_efficiency"] == pytest.approx((0.75 + 1 + 1 / 3) / 3)
    # random: the share of failed candidates; its fallback is the mean over kernels that ran
    r = ev.random_shape_metrics(perf, groups)
    assert list(r["failed_pick"]) == pytest.approx([1 / 3, 0.0, 1 / 3])
    assert r.loc[0, "fallback_efficiency"] == pytest.approx((6 / 8 + 1) / 2)


def test_learned_mask_narrows_the_rules_and_falls_back_when_nothing_is_left() -> None:
    groups = ev.ShapeGroups.from_keys([0, 0, 0, 1, 1])
    rules = np.array([True, True, False, True, True])
    runs = np.array([False, True, True, False, False])
    mask = ev.learned_selection_mask(rules, runs, groups)
    # shape 0: the rule-valid kernel predicted to run; shape 1: none predicted to run -> rules alone
    assert list(mask) == [False, True, False, True, True]


# -- a fixture whose failures the features predict -----------------------------------------------
@pytest.fixture(scope="module")
def failing():
    """Synthetic gemm table where every rule-valid compv4 kernel (the fastest pipeline) fails."""
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES + [(256, 2048, 1024), (8, 4096, 4096)])
    fails = table["is_valid"].to_numpy() & (table["pipeline"] == "compv4").to_numpy()
    table = table.assign(is_valid=table["is_valid"] & ~fails, tflops=np.where(fails, 0.0, table["tflops"]))
    return op, cfg, table, fails


TRAIN_SMALL = ["features=minimal", "model.n_estimators=20", "model.num_leaves=7", "model.n_jobs=1",
               "model.relevance_exponent=1", "rows.max_per_shape=0", "validity.n_estimators=30",
               "validity.num_leaves=7", "validity.min_child_samples=5"]


def test_cv_never_picks_a_kernel_the_training_data_saw_fail(failing) -> None:
    op, _, table, fails = failing
    cfg = compose("train", TRAIN_SMALL)
    data = prepare(table, op, cfg)
    method = model_method(cfg)
    n = data.groups.n_shapes
    train, test = np.arange(0, n, 2), np.arange(1, n, 2)  # every other shape held out
    pipe, info = fit_method(method, data, train, op, cfg, 0)
    assert info["failure_model"] and info["failed_rows"] > 0 and failure_model(pipe) is not None
    rows = rows_of(data.groups, test)
    runs = predicted_ok(pipe, data.X.iloc[rows])
    known = fails[rows] & data.selectable[rows]
    assert known.any() and not runs[known].any()  # every failing kernel of the unseen shapes is masked
    groups = ev.ShapeGroups.from_keys(data.groups.codes[rows])
    # an adversarial score that prefers exactly the failing kernels: the rules alone pick failures...
    scores = predict(pipe, data.X.iloc[rows]) + 1e3 * fails[rows]
    rules = data.selectable[rows]
    assert ev.summarize(ev.shape_metrics(data.perf[rows], scores, groups, rules))["failed_pick"] > 0.5
    # ...the learned mask never does
    mask = ev.learned_selection_mask(rules, runs, groups)
    m = ev.summarize(ev.shape_metrics(data.perf[rows], scores, groups, mask))
    assert m["failed_pick"] == 0.0 and m["mean"] > 0.5


def test_no_failure_model_when_failures_are_random(failing) -> None:
    op, cfg, table, _ = failing
    pipe = fit_pipeline(op, cfg, table, model="ranker", n_estimators=5, features="minimal")
    X = op.encode_frame(table)
    rng = np.random.default_rng(0)
    random_fail = rng.random(len(table)) < 0.005
    assert fit_failure_model(pipe, X, random_fail, VALIDITY) is None
    assert failure_model(pipe) is None and predicted_ok(pipe, X).all()


@pytest.mark.slow
def test_exported_selector_masks_learned_failures_like_python(failing, tmp_path) -> None:
    op, cfg, table, fails = failing
    # trees fitted where compv4 ran (and is the fastest pipeline), failures learned where it fails
    ran = synthetic_table(op, cfg, TRAIN_SHAPES + [(256, 2048, 1024), (8, 4096, 4096)])
    pipe = fit_pipeline(op, cfg, ran, model="ranker", n_estimators=20, features="minimal")
    X = op.encode_frame(table)
    rule_valid, _ = op.validity(table, table, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    rule_valid = np.asarray(rule_valid, bool)
    assert fit_failure_model(pipe, X[rule_valid], fails[rule_valid], VALIDITY) is not None
    probs = pd.DataFrame(EDGE_SHAPES + TRAIN_SHAPES, columns=["m", "n", "k"]).assign(split_k=1)
    d = tmp_path / "gemm_universal_gfx950_fp8_rcr"
    # parity (raises unless the selector agrees with sklearn + the Python learned mask on every problem)
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op), options=ExportOptions(parity_problems=probs))
    assert man["parity"]["top1_agreement"] == 1.0 and man["parity"]["topk_agreement"] == 1.0
    assert man["failure_model"]["threshold"] == 0.5
    sel = xo.session((d / mf.SELECTOR_FILE).read_bytes())
    catalogue = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    compv4 = set(catalogue.loc[catalogue["pipeline"] == "compv4", "kernel_id"])
    ids, _, nvalid = sel.run(["kernel_ids", "scores", "num_valid"],
                             {"problem": probs.to_numpy(np.int64), "top_k": np.array([5], dtype=np.int64)})
    picked = [int(i) for j in range(len(probs)) for i in ids[j, :min(5, int(nvalid[j]))]]
    assert picked and not compv4 & set(picked)
    # without the failure model the same trees pick compv4 kernels on some problem
    pipe.ckpred_failure_model_ = None
    d2 = tmp_path / "plain" / "gemm_universal_gfx950_fp8_rcr"
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d2,
                    training=mf.training_section(table, op), options=ExportOptions(parity_problems=probs))
    ids2, _, nvalid2 = xo.session((d2 / mf.SELECTOR_FILE).read_bytes()).run(
        ["kernel_ids", "scores", "num_valid"], {"problem": probs.to_numpy(np.int64), "top_k": np.array([5], dtype=np.int64)})
    assert compv4 & {int(i) for j in range(len(probs)) for i in ids2[j, :min(5, int(nvalid2[j]))]}
