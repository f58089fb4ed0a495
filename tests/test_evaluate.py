"""Every selection metric against hand-computed cases, including ties and failed kernels."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from ckpred.evaluate import (ShapeGroups, analytical_scores, best_static_scores, best_threshold, measured_perf,
                             narrowed_mask, random_shape_metrics, shape_metrics, summarize, summarize_by,
                             threshold_curve)

L3, L5 = math.log2(3), math.log2(5)


def _one_shape(n: int) -> ShapeGroups:
    return ShapeGroups.from_keys(["s"] * n)


def test_shape_groups_keep_table_order() -> None:
    g = ShapeGroups.from_keys(["b", "a", "b", "a", "c"])
    assert list(g.keys) == ["b", "a", "c"]
    assert [list(g.rows(s)) for s in range(3)] == [[0, 2], [1, 3], [4]]
    assert list(g.first_rows()) == [0, 1, 4]


def test_measured_perf_zeroes_invalid_and_nonsense() -> None:
    perf = measured_perf(np.array([5.0, 7.0, np.nan, -1.0]), np.array([True, False, True, True]))
    assert perf.tolist() == [5.0, 0.0, 0.0, 0.0]


# perf [10, 0 (failed), 8, 10]: two tied best kernels (rows 0 and 3) and one failure.
PERF = np.array([10.0, 0.0, 8.0, 10.0])


def test_metrics_with_failed_pick_and_tied_best() -> None:
    m = shape_metrics(PERF, np.array([1.0, 5.0, 3.0, 2.0]), _one_shape(4)).iloc[0]
    # ranked rows: 1 (failed), 2 (8), 3 (10, tied best), 0 (10)
    assert m["chosen_row"] == 1 and m["best_row"] == 0
    assert m["efficiency"] == 0.0 == m["efficiency@1"]
    assert m["efficiency@2"] == pytest.approx(0.8)
    assert m["efficiency@5"] == 1.0 and m["efficiency@20"] == 1.0
    assert (m["top1"], m["top3"], m["top5"], m["top10"]) == (0.0, 1.0, 1.0, 1.0)
    dcg = 0 + 0.8 / L3 + 1 / 2 + 1 / L5
    ideal = 1 + 1 / L3 + 0.8 / 2
    assert m["ndcg@10"] == pytest.approx(dcg / ideal)


def test_validity_mask_removes_candidates() -> None:
    selectable = np.array([True, False, True, True])
    m = shape_metrics(PERF, np.array([1.0, 5.0, 3.0, 2.0]), _one_shape(4), selectable).iloc[0]
    # ranked rows: 2 (8), 3 (10), 0 (10)
    assert m["chosen_row"] == 2 and m["n_selectable"] == 3
    assert m["efficiency"] == pytest.approx(0.8)
    assert m["efficiency@2"] == 1.0
    assert (m["top1"], m["top3"]) == (0.0, 1.0)
    assert m["ndcg@10"] == pytest.approx((0.8 + 1 / L3 + 1 / 2) / (1 + 1 / L3 + 0.8 / 2))


def test_score_ties_break_by_row_order_and_any_tied_best_is_a_hit() -> None:
    m = shape_metrics(np.array([8.0, 10.0, 10.0]), np.array([0.0, 1.0, 1.0]), _one_shape(3)).iloc[0]
    assert m["chosen_row"] == 1 and m["top1"] == 1.0 and m["efficiency"] == 1.0
    m = shape_metrics(np.array([8.0, 10.0, 10.0]), np.array([2.0, 2.0, 2.0]), _one_shape(3)).iloc[0]
    assert m["chosen_row"] == 0 and m["efficiency"] == pytest.approx(0.8) and m["top1"] == 0.0
    # The second tied-best kernel is a hit too.
    m = shape_metrics(np.array([8.0, 10.0, 10.0]), np.array([0.0, 1.0, 3.0]), _one_shape(3)).iloc[0]
    assert m["chosen_row"] == 2 and m["top1"] == 1.0


def test_nan_scores_rank_last() -> None:
    m = shape_metrics(np.array([10.0, 1.0]), np.array([np.nan, 0.5]), _one_shape(2)).iloc[0]
    assert m["chosen_row"] == 1 and m["efficiency"] == pytest.approx(0.1)


def test_shape_without_valid_kernel_is_counted_not_averaged() -> None:
    groups = ShapeGroups.from_keys(["a", "a", "b", "b"])
    per_shape = shape_metrics(np.array([0.0, 0.0, 4.0, 2.0]), np.array([1.0, 0.0, 0.0, 1.0]), groups)
    assert np.isnan(per_shape.loc[0, "efficiency"])
    assert per_shape.loc[1, "efficiency"] == pytest.approx(0.5)
    s = summarize(per_shape)
    assert (s["n_shapes"], s["n_shapes_without_valid_kernel"]) == (1, 1)
    assert s["mean"] == pytest.approx(0.5)


def test_everything_masked_scores_zero() -> None:
    m = shape_metrics(np.array([3.0, 4.0]), np.array([1.0, 2.0]), _one_shape(2),
                      np.array([False, False])).iloc[0]
    assert m["chosen_row"] == -1 and m["efficiency"] == 0.0 and m["top10"] == 0.0 and m["ndcg@10"] == 0.0


def test_summary_percentiles_and_groups() -> None:
    per_shape = pd.DataFrame({"efficiency": [0.0, 0.5, 1.0, np.nan], "efficiency@2": [1.0, 1.0, 1.0, np.nan]})
    for col in ["efficiency@1", "efficiency@5", "efficiency@10", "efficiency@20", "top1", "top3", "top5",
                "top10", "ndcg@10"]:
        per_shape[col] = per_shape["efficiency"]
    s = summarize(per_shape)
    assert s["mean"] == pytest.approx(0.5) and s["min"] == 0.0
    assert s["p10"] == pytest.approx(0.1) and s["p50"] == pytest.approx(0.5)
    assert s["efficiency@2"] == 1.0 and s["n_shapes"] == 3
    by = summarize_by(per_shape, np.array(["x", "y", "y", "x"]), ["y", "x", "z"])
    assert list(by) == ["y", "x"]
    assert by["y"]["mean"] == pytest.approx(0.75) and by["x"]["n_shapes"] == 1


def test_random_baseline_hand_computed() -> None:
    m = random_shape_metrics(PERF, _one_shape(4)).iloc[0]
    assert m["efficiency"] == pytest.approx(0.7)  # mean(0, .8, 1, 1): failed rows count
    # max of 2 of 4 draws: pairs {0,.8}: .8, five others: 1
    assert m["efficiency@2"] == pytest.approx((0.8 + 5) / 6)
    assert m["efficiency@5"] == 1.0
    assert m["top1"] == pytest.approx(0.5)  # two tied best of four
    assert m["top3"] == 1.0
    ideal = 1 + 1 / L3 + 0.8 / 2
    assert m["ndcg@10"] == pytest.approx(0.7 * (1 + 1 / L3 + 1 / 2 + 1 / L5) / ideal)


def test_random_baseline_equals_average_over_all_orders() -> None:
    perf = np.array([3.0, 0.0, 9.0, 9.0, 6.0, 1.0])
    g = _one_shape(len(perf))
    analytic = random_shape_metrics(perf, g).iloc[0]
    perms = list(itertools.permutations(range(len(perf))))
    brute = pd.concat([shape_metrics(perf, np.array(p, dtype=float), g) for p in perms]).mean()
    for col in ["efficiency", "efficiency@2", "efficiency@5", "top1", "top3", "top5", "ndcg@10"]:
        assert analytic[col] == pytest.approx(brute[col]), col


# One problem, four candidates: rows 0-1 measured (perf 10 and 5), rows 2-3 not measured (perf 0),
# and a second problem with rows 4 (measured, perf 4) and 5 (measured, failed).
SPARSE_PERF = np.array([10.0, 5.0, 0.0, 0.0, 4.0, 0.0])
SPARSE_MEASURED = np.array([True, True, False, False, True, True])
SPARSE_GROUPS = ShapeGroups.from_keys(["a", "a", "a", "a", "b", "b"])


def test_an_unmeasured_pick_scores_zero_and_is_not_a_failed_pick() -> None:
    # a: ranked 2 (unmeasured), 1 (5), 3 (unmeasured), 0 (10); b: ranked 5 (failed), 4 (4)
    scores = np.array([1.0, 3.0, 4.0, 2.0, 1.0, 2.0])
    m = shape_metrics(SPARSE_PERF, scores, SPARSE_GROUPS, measured=SPARSE_MEASURED)
    a, b = m.iloc[0], m.iloc[1]
    assert a["chosen_row"] == 2 and a["efficiency"] == 0.0  # strict: nothing says it runs
    assert a["unmeasured_pick"] == 1.0 and a["failed_pick"] == 0.0
    assert a["fallback_efficiency"] == pytest.approx(0.5)  # the next-ranked measured kernel: row 1
    assert a["efficiency@2"] == pytest.approx(0.5) and a["efficiency@5"] == 1.0
    assert b["chosen_row"] == 5 and b["failed_pick"] == 1.0 and b["unmeasured_pick"] == 0.0
    assert b["fallback_efficiency"] == 1.0
    s = summarize(m)
    assert s["unmeasured_pick"] == 0.5 and s["unmeasured_picks"] == 1.0
    assert s["failed_pick"] == 0.5 and s["failed_picks"] == 1.0 and s["mean"] == 0.0
    # every row measured: the same figures as without the argument
    full = shape_metrics(PERF, np.array([1.0, 5.0, 3.0, 2.0]), _one_shape(4), measured=np.ones(4, dtype=bool))
    pd.testing.assert_frame_equal(full, shape_metrics(PERF, np.array([1.0, 5.0, 3.0, 2.0]), _one_shape(4)))
    assert full.iloc[0]["unmeasured_pick"] == 0.0 and full.iloc[0]["failed_pick"] == 1.0


def test_random_baseline_over_a_pool_with_unmeasured_candidates() -> None:
    m = random_shape_metrics(SPARSE_PERF, SPARSE_GROUPS, measured=SPARSE_MEASURED)
    a, b = m.iloc[0], m.iloc[1]
    assert a["efficiency"] == pytest.approx((1 + 0.5) / 4)
    assert a["unmeasured_pick"] == 0.5 and a["failed_pick"] == 0.0
    assert a["fallback_efficiency"] == pytest.approx(0.75)  # uniform over the two that ran
    assert b["failed_pick"] == 0.5 and b["unmeasured_pick"] == 0.0
    # the pool leaves row 3 out of the draw (a mask dropped it)
    pool = np.array([True, True, True, False, True, True])
    a = random_shape_metrics(SPARSE_PERF, SPARSE_GROUPS, measured=SPARSE_MEASURED, pool=pool).iloc[0]
    assert a["n_candidates"] == 3 and a["efficiency"] == pytest.approx(0.5)
    assert a["unmeasured_pick"] == pytest.approx(1 / 3)


def test_narrowed_mask_falls_back_per_shape_and_says_where() -> None:
    rules = np.array([True, True, False, True, True, True])
    keep = np.array([False, True, True, False, False, False])
    mask, fell = narrowed_mask(rules, keep, SPARSE_GROUPS)
    # a: rows 0, 1, 3 pass the rules, only 1 is kept; b: nothing kept -> the rules alone
    assert mask.tolist() == [False, True, False, False, True, True]
    assert fell.tolist() == [False, True]
    # a shape the rules already leave empty did not fall back: it had nothing to fall back to
    mask, fell = narrowed_mask(np.array([False] * 4 + [True] * 2), np.ones(6, dtype=bool), SPARSE_GROUPS)
    assert fell.tolist() == [False, False]


def test_threshold_curve_and_the_best_threshold() -> None:
    # a: the unmeasured row 2 scores highest; its estimate of being absent is 0.6, the measured
    # rows' 0.2 and 0.4. b: both measured, estimates 0.1 and 0.3.
    scores = np.array([1.0, 3.0, 4.0, 2.0, 1.0, 2.0])
    estimate = np.array([0.2, 0.4, 0.6, 0.9, 0.1, 0.3])
    rules = np.ones(6, dtype=bool)
    curve = threshold_curve(SPARSE_PERF, scores, SPARSE_GROUPS, rules, SPARSE_MEASURED, estimate,
                            [0.1, 0.3, 0.5, 0.7])
    # t=0.1: a keeps nothing (falls back to the rules: picks row 2, strict 0), b keeps row 4 (1.0)
    # t=0.3: a keeps row 0 (1.0), b keeps 4 and 5 and picks 5 (failed: 0)
    # t=0.5: a keeps 0 and 1 and picks 1 (0.5); b picks 5 (0)
    # t=0.7: a picks the unmeasured row 2 (0); b picks 5 (0)
    assert curve["mean"].tolist() == pytest.approx([0.5, 0.5, 0.25, 0.0])
    assert curve["unmeasured_pick"].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.5])
    assert curve["fell_back"].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])
    assert best_threshold(curve) == 0.1  # the lower middle of the two best
    three = pd.DataFrame({"threshold": [0.9, 0.1, 0.5, 0.3], "mean": [0.7, 0.7, 0.7, 0.6]})
    assert best_threshold(three) == 0.5  # the middle of the best three (in threshold order)
    # the failure mask (runs) narrows after the applicability mask: b's failed row 5 is dropped
    runs = np.array([True, True, True, True, True, False])
    curve = threshold_curve(SPARSE_PERF, scores, SPARSE_GROUPS, rules, SPARSE_MEASURED, estimate, [0.3], runs=runs)
    assert curve["mean"].tolist() == [1.0]


def test_best_static_is_learned_on_training_shapes_only() -> None:
    # shape 1: A=10, B=5, C=0 -> rel 1, .5, 0; shape 2: A absent, B=8, C=4 -> rel 1, .5
    kernels = np.array(["A", "B", "C", "B", "C"], dtype=object)
    perf = np.array([10.0, 5.0, 0.0, 8.0, 4.0])
    groups = ShapeGroups.from_keys([1, 1, 1, 2, 2])
    scores, ranking = best_static_scores(kernels, perf, groups, np.array(["C", "B", "D"], dtype=object))
    assert ranking.to_dict() == pytest.approx({"B": 0.75, "A": 0.5, "C": 0.25})
    assert list(ranking.index) == ["B", "A", "C"]
    assert scores[:2] == pytest.approx([0.25, 0.75]) and scores[2] == -np.inf


def test_analytical_roofline_hand_computed() -> None:
    frame = pd.DataFrame({"m": [512, 512], "n": [512, 512], "k": [256, 256],
                          "tile_m": [256, 128], "tile_n": [256, 128], "tile_k": [128, 128]})
    # 4 CUs at 1 TFLOPS each, 1 GB/s: both are memory bound.
    s = analytical_scores(frame, cus=4, peak_tflops=4.0, bandwidth_gbs=1.0, bytes_per_element=1, c_bytes=2)
    big = (512 * 256 * 2 + 256 * 512 * 2) * 1 + 512 * 512 * 2       # A read twice, B twice, C
    small = (512 * 256 * 4 + 256 * 512 * 4) * 1 + 512 * 512 * 2     # A and B read four times
    assert -s[0] == pytest.approx(big / 1e9, rel=1e-5)
    assert -s[1] == pytest.approx(small / 1e9, rel=1e-5)
    assert s[0] > s[1]
    # Compute bound (huge bandwidth): 4 tiles of 256x256 = 1 wave; 16 tiles of 128x128 = 4 waves.
    s = analytical_scores(frame, cus=4, peak_tflops=4.0, bandwidth_gbs=1e12, bytes_per_element=1)
    assert -s[0] == pytest.approx(2 * 256 * 256 * 256 / 1e12, rel=1e-5)
    assert -s[1] == pytest.approx(4 * 2 * 128 * 128 * 256 / 1e12, rel=1e-5)
    # Equal roofline time: the reuse score (bigger tiles) breaks the tie.
    assert s[0] > s[1]


def test_analytical_needs_tile_fields() -> None:
    with pytest.raises(KeyError, match="tile_k"):
        analytical_scores(pd.DataFrame({"m": [1], "n": [1], "k": [1], "tile_m": [1], "tile_n": [1]}),
                          cus=1, peak_tflops=1.0, bandwidth_gbs=1.0, bytes_per_element=1)


def test_report_breakdowns_and_spread_over_folds() -> None:
    from ckpred.evaluate import method_report

    perf = np.array([4.0, 2.0, 5.0, 1.0, 3.0, 3.0, 2.0, 8.0])
    scores = np.array([1.0, 2.0, 2.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    groups = ShapeGroups.from_keys([0, 0, 1, 1, 2, 2, 3, 3])
    per_shape = shape_metrics(perf, scores, groups)  # efficiencies 0.5, 1, 1, 0.25
    rep = method_report(per_shape, np.array(["a", "a", "b", "b"]), ("a", "b"), None,
                        breakdowns={"dtype": np.array(["FP16", "FP32", "FP16", "FP32"])},
                        fold=np.array([0, 0, 1, 1]))
    assert rep["by_dtype"]["FP16"]["mean"] == pytest.approx(0.75) and rep["by_dtype"]["FP32"]["mean"] == 1 - 3 / 8
    assert rep["by_family"]["b"]["mean"] == pytest.approx(0.625)
    folds = rep["folds"]
    assert folds["n"] == 2 and folds["mean"]["values"] == pytest.approx([0.75, 0.625])
    assert folds["mean"]["mean"] == pytest.approx(0.6875) and folds["mean"]["std"] == pytest.approx(0.0625)


def test_heading_names_the_grouping_key_and_folds() -> None:
    from types import SimpleNamespace

    from ckpred.cv import External, GroupKFold, Holdout

    assert GroupKFold(SimpleNamespace(name="group_kfold")).heading(("m", "n", "k", "split_k"), 5) == \
        "unseen (m, n, k, split_k) shapes, 5 folds"
    assert Holdout(SimpleNamespace(name="holdout", test_fraction=0.2)).heading(("n", "c"), 1) == \
        "unseen (n, c) shapes, 1 holdout split (20% of them)"
    assert "second table" in External(SimpleNamespace(name="external")).heading(("m",), 1)
