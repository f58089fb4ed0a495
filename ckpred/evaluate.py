"""Selection metrics by shape, the no-learning baselines and summaries (the run's plots: :mod:`ckpred.cv.report`).

Everything here answers one question: *when a selector ranks the candidate kernels of a shape
it has never seen, how good is the kernel it picks?*

Definitions (the unit tests in ``tests/test_evaluate.py`` check each one on hand-computed cases):

* **Candidates** of a shape are all rows of that shape in the table. Measured performance
  ``perf`` is the row's TFLOPS, 0 for rows that failed or are invalid (``is_valid=False``).
* **Best** of a shape is ``max(perf)`` over its candidates. Shapes whose best is 0 (no kernel
  ran, e.g. N=1 or K=1) have no defined efficiency: they are counted
  (``n_shapes_without_valid_kernel``) and left out of every average, as a deployed dispatcher
  routes them to a fallback before the model.
* **Selection**: rows that the op's validity rules reject (``selectable=False``) are masked and
  never chosen, exactly as the exported selector masks them. The remaining rows are ordered by
  predicted score, highest first; ties are broken by row order (a stable sort), which is the
  catalogue order for simulated data. NaN scores rank last. A masked or unmeasured row can
  still be the shape's best (it then simply cannot be chosen).
* **efficiency** of a shape = perf of the chosen (top-1) kernel / best. Choosing a kernel that
  passed the validity rules but failed when measured scores 0.
* **failed_pick** of a shape = 1 when the chosen kernel's measured row failed or is invalid
  (perf 0), else 0; its mean over shapes is the *failed-pick rate*. A dispatcher that picks
  such a kernel crashes or falls back.
* **Unmeasured candidates.** The exported selector ranks every rule-valid kernel of the
  catalogue, not only those the table measured for the problem. A table that does not hold
  every (problem, kernel) pair (a find-db listing only the applicable solvers, a pruned sweep)
  is scored on that same candidate set: the rows a problem lacks are added with
  ``measured=False`` and perf 0 (``ckpred.fitting.with_unmeasured``). The efficiency is then
  *strict*: a pick without a measurement scores 0, since nothing says it runs, let alone how
  fast. **unmeasured_pick** of a shape = 1 when the chosen row is such a row (it is not a
  failed pick: nothing failed, nothing was measured); its mean is the *unmeasured-pick rate*.
  A table with every pair measured has no such row, and every figure is what it was without them.
* **fallback_efficiency** = perf of the first kernel in the ranked (masked) list that was
  measured and did not fail / best: what a dispatcher gets that launches the next-ranked kernel
  whenever one fails (or is not applicable) at run time, the documented fallback. Equal to the
  efficiency when the pick ran.
* **efficiency@k** = max perf among the top k ranked kernels / best: what a budgeted two-phase
  search gets when it benchmarks the model's top k and keeps the fastest. ``efficiency@1`` is
  the efficiency.
* **topk** (hit rate) = 1 when a kernel whose perf equals the best (any of several tied best
  kernels counts) is among the top k ranked, else 0. ``top1`` is exact-winner accuracy.
* **ndcg@10**: graded relevance ``rel = perf / best`` in [0, 1], linear gain,
  ``DCG = sum_{i<10} rel_i / log2(i + 2)`` over the ranked list, divided by the DCG of the
  ideal order of all candidates.
* Percentiles (P10, P50) use numpy's default linear interpolation over shapes.

The ``random`` baseline is computed analytically (no sampling): a uniform pick among all
candidates of the shape (its measured rows, valid or not, and the unmeasured candidates the
selector's masks keep), so ``efficiency = mean(rel)``; ``efficiency@k`` is the
expected max of k draws without replacement, ``topk = 1 - C(n - n_best, k) / C(n, k)`` and
``ndcg@10 = mean(rel) * sum_{i<min(10, n)} 1/log2(i+2) / IDCG``; its failed-pick rate is the
share of measured candidates that failed, its unmeasured-pick rate the share of unmeasured
ones, and its fallback efficiency the mean ``rel`` of the candidates that ran (a random order's
first runnable kernel is uniform among them).

Learned masks (:func:`narrowed_mask`): a selector may also mask kernels a model predicts not
to apply to the problem (applicability, for an op whose absent rows mean "not applicable")
or to fail (:func:`learned_selection_mask`). When a learned mask leaves a shape with no
candidate, the shape keeps the mask it had before, so the choice is the highest-ranked kernel
the rules (and the earlier masks) allow.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy.special import gammaln

from ckpred.dtypes import bytes_per_element, c_bytes_per_element
from ckpred.errors import ConfigValueError
from ckpred.kernels.base import OpDefinition
from ckpred.schema import ArchConfig, DtypeConfig, BaselinesConfig, arch_value

#: Budgets k reported as efficiency@k (the budgeted two-phase search).
EFFICIENCY_KS: tuple[int, ...] = (1, 2, 5, 10, 20)
#: k of the top-k hit rates.
HIT_KS: tuple[int, ...] = (1, 3, 5, 10)
#: Cut-off of the NDCG.
NDCG_K: int = 10
#: Methods in report order: the learned model first, then the baselines.
METHODS: tuple[str, ...] = ("model", "plain", "reference", "best_static", "analytical", "random")


# ---------------------------------------------------------------------------------------------
# Grouping rows by shape
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeGroups:
    """Rows of a table grouped by shape, keeping table row order inside each shape.

    Attributes
    ----------
    codes : ndarray of int64
        Shape index of each row (0..n_shapes-1, in order of first appearance).
    keys : ndarray of object
        Shape key of each shape index.
    order : ndarray of int64
        Row indices sorted by shape, stable (row order inside a shape is kept).
    bounds : ndarray of int64
        ``order[bounds[s]:bounds[s + 1]]`` are the rows of shape ``s``.
    """

    codes: np.ndarray
    keys: np.ndarray
    order: np.ndarray
    bounds: np.ndarray

    @classmethod
    def from_keys(cls, keys: Sequence[Any] | pd.Series) -> "ShapeGroups":
        codes, uniques = pd.factorize(pd.Series(keys).to_numpy(), sort=False)
        codes = codes.astype(np.int64)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
        return cls(codes=codes, keys=np.asarray(uniques, dtype=object), order=order,
                   bounds=np.asarray(bounds, dtype=np.int64))

    @property
    def n_shapes(self) -> int:
        return len(self.keys)

    def rows(self, s: int) -> np.ndarray:
        """Row indices of shape ``s`` in table order."""
        return self.order[self.bounds[s]:self.bounds[s + 1]]

    def first_rows(self) -> np.ndarray:
        """Index of the first row of every shape (to read per-shape problem fields)."""
        return self.order[self.bounds[:-1]]


def measured_perf(tflops: np.ndarray, is_valid: np.ndarray) -> np.ndarray:
    """Measured performance that selection is scored on: TFLOPS, 0 where the row is invalid."""
    perf = np.where(np.asarray(is_valid, dtype=bool), np.asarray(tflops, dtype=np.float64), 0.0)
    # A NaN or negative measurement can never be a good choice; treat it as a failure.
    return np.where(np.isfinite(perf) & (perf > 0), perf, 0.0)


def _metric_columns() -> list[str]:
    return (["efficiency"] + [f"efficiency@{k}" for k in EFFICIENCY_KS]
            + [f"top{k}" for k in HIT_KS] + [f"ndcg@{NDCG_K}", "failed_pick", "fallback_efficiency",
                                             "unmeasured_pick"])


def narrowed_mask(mask: np.ndarray, keep: np.ndarray, groups: ShapeGroups) -> tuple[np.ndarray, np.ndarray]:
    """``mask & keep`` per row, except in shapes where that leaves nothing: they keep ``mask``.

    Parameters
    ----------
    mask : ndarray of bool
        What the selector may choose so far (the rules, or the rules and earlier masks).
    keep : ndarray of bool
        A learned prediction per row (True = the row stays a candidate).
    groups : ShapeGroups
        The rows' shapes.

    Returns
    -------
    mask : ndarray of bool
        The narrowed mask.
    fell_back : ndarray of bool, one per shape
        Shapes where ``mask`` had a candidate and ``mask & keep`` had none (the learned mask was
        dropped for them).
    """
    mask = np.asarray(mask, dtype=bool)
    both = mask & np.asarray(keep, dtype=bool)
    any_both = np.zeros(groups.n_shapes, dtype=bool)
    np.logical_or.at(any_both, groups.codes, both)
    any_mask = np.zeros(groups.n_shapes, dtype=bool)
    np.logical_or.at(any_mask, groups.codes, mask)
    return np.where(any_both[groups.codes], both, mask), any_mask & ~any_both


def learned_selection_mask(selectable: np.ndarray, predicted_ok: np.ndarray, groups: ShapeGroups) -> np.ndarray:
    """The rule mask narrowed by a learned validity prediction, with the fallback.

    A row stays selectable when the rules allow it and the model predicts it runs; a shape
    where no rule-valid row is predicted to run keeps its rule mask (the selector then picks
    the highest-ranked rule-valid kernel: nothing better is known).

    Parameters
    ----------
    selectable : ndarray of bool
        The op's validity rules per row.
    predicted_ok : ndarray of bool
        The learned prediction per row (True = expected to run).
    groups : ShapeGroups
        The rows' shapes.
    """
    return narrowed_mask(selectable, predicted_ok, groups)[0]


def threshold_curve(perf: np.ndarray, scores: np.ndarray, groups: ShapeGroups, selectable: np.ndarray,
                    measured: np.ndarray, estimate: np.ndarray, thresholds: Sequence[float],
                    runs: np.ndarray | None = None) -> pd.DataFrame:
    """Strict efficiency of a selection whose learned mask drops the rows with ``estimate > t``.

    For each threshold ``t``: the rule mask narrowed by ``estimate <= t`` (:func:`narrowed_mask`),
    then by ``runs`` (the learned failure mask) when given, scored by :func:`shape_metrics`.

    Returns
    -------
    DataFrame
        One row per threshold, in the given order: ``threshold``, ``mean`` and ``p10`` of the
        strict efficiency, ``unmeasured_pick`` (rate) and ``fell_back`` (share of shapes the mask
        left without a candidate).
    """
    estimate = np.asarray(estimate, dtype=np.float64)
    out = []
    for t in thresholds:
        mask, fell = narrowed_mask(selectable, estimate <= float(t), groups)
        if runs is not None:
            mask = narrowed_mask(mask, runs, groups)[0]
        r = summarize(shape_metrics(perf, scores, groups, mask, measured))
        out.append({"threshold": float(t), "mean": r.get("mean", np.nan), "p10": r.get("p10", np.nan),
                    "unmeasured_pick": r.get("unmeasured_pick", np.nan), "fell_back": float(fell.mean())})
    return pd.DataFrame(out, columns=["threshold", "mean", "p10", "unmeasured_pick", "fell_back"])


def best_threshold(curve: pd.DataFrame) -> float:
    """The threshold of :func:`threshold_curve` with the highest strict mean efficiency; among
    equal ones the middle one (the lower of the two middle ones), farthest from both a mask that
    drops kernels the inner folds needed and one that keeps kernels they lacked."""
    best = curve["mean"].max()
    tied = np.sort(curve.loc[curve["mean"] >= best, "threshold"].to_numpy(np.float64))
    return float(tied[(len(tied) - 1) // 2])


def _dcg(rel: np.ndarray) -> float:
    return float(np.sum(rel / np.log2(np.arange(2, len(rel) + 2))))


# ---------------------------------------------------------------------------------------------
# Per-shape metrics
# ---------------------------------------------------------------------------------------------
def _metric_inputs(perf: np.ndarray, scores: np.ndarray, selectable: np.ndarray | None,
                   measured: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`shape_metrics`' inputs as arrays (NaN scores as -inf, rank last; masks default all True)."""
    perf = np.asarray(perf, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if perf.shape != scores.shape:
        raise ValueError(f"perf and scores must have the same length, got {perf.shape} and {scores.shape}")
    selectable = np.ones(len(perf), dtype=bool) if selectable is None else np.asarray(selectable, dtype=bool)
    measured = np.ones(len(perf), dtype=bool) if measured is None else np.asarray(measured, dtype=bool)
    return perf, np.where(np.isnan(scores), -np.inf, scores), selectable, measured


def _shape_values(p: np.ndarray, full: np.ndarray, max_k: int, pick_measured: bool) -> list[float]:
    """:func:`_metric_columns` of a shape with a valid kernel from ``p`` (its candidates' perf), ``full``
    (its selectable ones' perf, ranked) and ``pick_measured`` (the top-ranked one has a measurement)."""
    b = p.max()
    rp = full[:max_k]
    vals = [rp[:1].max() / b if len(rp) else 0.0]
    vals += [(rp[:k].max() / b if len(rp) else 0.0) for k in EFFICIENCY_KS]
    vals += [float(np.any(rp[:k] >= b)) for k in HIT_KS]
    ideal = _dcg(np.sort(p)[::-1][:NDCG_K] / b)
    vals.append(_dcg(rp[:NDCG_K] / b) / ideal)
    ran = full > 0
    vals.append(float(len(rp) > 0 and rp[0] <= 0 and pick_measured))
    vals.append(full[int(np.argmax(ran))] / b if ran.any() else 0.0)
    vals.append(float(len(rp) > 0 and not pick_measured))
    return vals


def shape_metrics(perf: np.ndarray, scores: np.ndarray, groups: ShapeGroups,
                  selectable: np.ndarray | None = None, measured: np.ndarray | None = None) -> pd.DataFrame:
    """Selection metrics of one scoring method, one row per shape.

    Parameters
    ----------
    perf : ndarray of float, shape (n_rows,)
        Measured performance (see :func:`measured_perf`); 0 for failed/invalid and unmeasured rows.
    scores : ndarray of float, shape (n_rows,)
        Predicted scores, higher = better. NaN ranks last.
    groups : ShapeGroups
        The rows' shapes.
    selectable : ndarray of bool, optional
        Rows the selector may choose (the op's validity rules and the learned masks); default all.
    measured : ndarray of bool, optional
        False for a candidate the table holds no measurement of (see the module docstring);
        default all True.

    Returns
    -------
    DataFrame
        Index: shape index. Columns: ``best``, ``n_candidates``, ``n_selectable``,
        ``chosen_row`` (-1 when nothing was selectable), ``best_row`` and the metric columns
        (NaN for shapes without any valid kernel).
    """
    perf, scores, selectable, measured = _metric_inputs(perf, scores, selectable, measured)
    cols = _metric_columns()
    out = np.full((groups.n_shapes, len(cols)), np.nan)
    best = np.zeros(groups.n_shapes)
    n_cand = np.zeros(groups.n_shapes, dtype=np.int64)
    n_sel = np.zeros(groups.n_shapes, dtype=np.int64)
    chosen = np.full(groups.n_shapes, -1, dtype=np.int64)
    best_row = np.full(groups.n_shapes, -1, dtype=np.int64)
    max_k = max(max(EFFICIENCY_KS), max(HIT_KS), NDCG_K)
    for s in range(groups.n_shapes):
        rows = groups.rows(s)
        p = perf[rows]
        n_cand[s] = len(rows)
        b = p.max() if len(p) else 0.0
        best[s] = b
        if b > 0:
            best_row[s] = rows[int(np.argmax(p))]  # first of tied best, table order
        cand = rows[selectable[rows]]
        n_sel[s] = len(cand)
        # Stable sort on -score: equal scores keep table (catalogue) order.
        full = cand[np.argsort(-scores[cand], kind="stable")]
        ranked = full[:max_k]
        if len(ranked):
            chosen[s] = ranked[0]
        if b <= 0:
            continue
        out[s] = _shape_values(p, perf[full], max_k, bool(measured[ranked[0]]) if len(ranked) else True)
    frame = pd.DataFrame(out, columns=cols)
    frame.insert(0, "best_row", best_row)
    frame.insert(0, "chosen_row", chosen)
    frame.insert(0, "n_selectable", n_sel)
    frame.insert(0, "n_candidates", n_cand)
    frame.insert(0, "best", best)
    return frame


def _log_comb(n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return gammaln(np.asarray(n, dtype=np.float64) + 1) - gammaln(np.asarray(k, dtype=np.float64) + 1) \
        - gammaln(np.asarray(n, dtype=np.float64) - np.asarray(k, dtype=np.float64) + 1)


def random_shape_metrics(perf: np.ndarray, groups: ShapeGroups, measured: np.ndarray | None = None,
                         pool: np.ndarray | None = None) -> pd.DataFrame:
    """Expected metrics of a uniformly random pick among all candidates of each shape.

    Computed in closed form (see the module docstring); candidates include invalid and failed
    rows, which score 0. ``measured`` is :func:`shape_metrics`'s; ``pool`` (bool per row,
    default all) leaves rows out of the draw (the unmeasured rows the selector's masks drop).
    Same columns as :func:`shape_metrics`; ``chosen_row`` is -1.
    """
    perf = np.asarray(perf, dtype=np.float64)
    measured = np.ones(len(perf), dtype=bool) if measured is None else np.asarray(measured, dtype=bool)
    pool = np.ones(len(perf), dtype=bool) if pool is None else np.asarray(pool, dtype=bool)
    cols = _metric_columns()
    out = np.full((groups.n_shapes, len(cols)), np.nan)
    best = np.zeros(groups.n_shapes)
    n_cand = np.zeros(groups.n_shapes, dtype=np.int64)
    best_row = np.full(groups.n_shapes, -1, dtype=np.int64)
    for s in range(groups.n_shapes):
        rows = groups.rows(s)
        rows = rows[pool[rows]]
        p = perf[rows]
        n = len(p)
        n_cand[s] = n
        b = p.max() if n else 0.0
        best[s] = b
        if b <= 0:
            continue
        best_row[s] = rows[int(np.argmax(p))]
        rel = np.sort(p / b)  # ascending
        idx = np.arange(n)
        vals = [rel.mean()]
        for k in EFFICIENCY_KS:
            kk = min(k, n)
            # P(max of kk draws without replacement is the i-th smallest) = C(i, kk-1) / C(n, kk)
            w = np.zeros(n)
            ok = idx >= kk - 1
            w[ok] = np.exp(_log_comb(idx[ok], kk - 1) - _log_comb(n, kk))
            vals.append(float(np.sum(w * rel)))
        n_best = int(np.sum(p >= b))
        for k in HIT_KS:
            kk = min(k, n)
            miss = 0.0 if n - n_best < kk else float(np.exp(_log_comb(n - n_best, kk) - _log_comb(n, kk)))
            vals.append(1.0 - miss)
        discounts = 1.0 / np.log2(np.arange(2, min(NDCG_K, n) + 2))
        vals.append(rel.mean() * discounts.sum() / _dcg(rel[::-1][:NDCG_K]))
        vals.append(float(np.mean((p <= 0) & measured[rows])))
        vals.append(float(rel[rel > 0].mean()))
        vals.append(float(np.mean(~measured[rows])))
        out[s] = vals
    frame = pd.DataFrame(out, columns=cols)
    frame.insert(0, "best_row", best_row)
    frame.insert(0, "chosen_row", np.full(groups.n_shapes, -1, dtype=np.int64))
    frame.insert(0, "n_selectable", n_cand)
    frame.insert(0, "n_candidates", n_cand)
    frame.insert(0, "best", best)
    return frame


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------
def summarize(per_shape: pd.DataFrame) -> dict[str, float]:
    """Mean, P10, P50 and min of the efficiency plus the mean of every other metric.

    Shapes without any valid kernel (NaN efficiency) are counted, not averaged. ``failed_pick``
    is the failed-pick *rate* (mean over shapes) and ``failed_picks`` their number.
    """
    ok = per_shape["efficiency"].notna()
    eff = per_shape.loc[ok, "efficiency"].to_numpy()
    out: dict[str, float] = {"n_shapes": int(ok.sum()),
                             "n_shapes_without_valid_kernel": int((~ok).sum())}
    if len(eff) == 0:
        return out
    out.update(mean=float(eff.mean()), p10=float(np.percentile(eff, 10)),
               p50=float(np.percentile(eff, 50)), min=float(eff.min()))
    for col in _metric_columns()[1:]:
        if col in per_shape:
            out[col] = float(per_shape.loc[ok, col].mean())
    if "failed_pick" in per_shape:
        out["failed_picks"] = float(per_shape.loc[ok, "failed_pick"].sum())
    if "unmeasured_pick" in per_shape:
        out["unmeasured_picks"] = float(per_shape.loc[ok, "unmeasured_pick"].sum())
    return out


def summarize_by(per_shape: pd.DataFrame, labels: np.ndarray | pd.Series,
                 order: Iterable[str] | None = None) -> dict[str, dict[str, float]]:
    """:func:`summarize` for each label (e.g. M family, pipeline of the best kernel)."""
    labels = pd.Series(np.asarray(labels, dtype=object), index=per_shape.index)
    names = list(order) if order is not None else sorted(labels.dropna().unique(), key=str)
    return {str(name): summarize(per_shape[labels == name]) for name in names if (labels == name).any()}


#: Summary keys whose spread over folds (and over seeds) the reports give.
SPREAD_KEYS: tuple[str, ...] = ("mean", "p10", "min", "top1", "failed_pick", "unmeasured_pick")


def spread(values: Sequence[Mapping[str, Any]], keys: Sequence[str] = SPREAD_KEYS) -> dict[str, dict[str, Any]]:
    """Mean, standard deviation (ddof 0) and the values of ``keys`` over several summaries.

    Used for the spread over folds (each fold's test shapes summarised alone) and over seeds.
    A key missing from some summaries is taken over the others.
    """
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        got = [float(v[key]) for v in values if v.get(key) is not None]
        if got:
            out[key] = {"mean": float(np.mean(got)), "std": float(np.std(got)), "values": got}
    return out


def method_report(per_shape: pd.DataFrame, family: np.ndarray, families: Sequence[str],
                  best_pipeline: np.ndarray | None, *, breakdowns: Mapping[str, np.ndarray] | None = None,
                  fold: np.ndarray | None = None) -> dict[str, Any]:
    """Full metrics dict of one method.

    Overall (:func:`summarize`), ``by_family`` (the op's families), ``by_best_pipeline``,
    ``by_<field>`` for every entry of ``breakdowns`` (a label per shape, e.g. a categorical
    problem field) and, with ``fold`` (the fold of each shape), ``folds``: the summary of each
    fold alone and their :func:`spread`.
    """
    report: dict[str, Any] = summarize(per_shape)
    report["by_family"] = summarize_by(per_shape, family, families)
    if best_pipeline is not None:
        report["by_best_pipeline"] = summarize_by(per_shape, best_pipeline)
    for name, labels in (breakdowns or {}).items():
        report[f"by_{name}"] = summarize_by(per_shape, labels)
    if fold is not None:
        fold = np.asarray(fold)
        per_fold = [summarize(per_shape[fold == f]) for f in pd.unique(fold)]
        report["folds"] = {"n": len(per_fold), **spread(per_fold)}
    return report


# ---------------------------------------------------------------------------------------------
# Baselines without a learned model
# ---------------------------------------------------------------------------------------------
def best_static_sums(train_kernels: np.ndarray, train_perf: np.ndarray,
                     train_groups: ShapeGroups) -> tuple[pd.Series, int]:
    """The additive part of the ``best_static`` order: per kernel, the sum of ``perf / best``
    over the training shapes, and the number of training shapes with a valid kernel.

    Sums and counts over disjoint sets of shapes add up, so a dataset too large for one
    process is reduced file by file (:mod:`ckpred.scale`); the order is the summed
    ``sums / count`` (:func:`best_static_scores`).
    """
    train_perf = np.asarray(train_perf, dtype=np.float64)
    best = np.zeros(train_groups.n_shapes)
    np.maximum.at(best, train_groups.codes, train_perf)
    rel = np.divide(train_perf, best[train_groups.codes], out=np.zeros_like(train_perf),
                    where=best[train_groups.codes] > 0)
    sums = pd.Series(rel).groupby(np.asarray(train_kernels, dtype=object), sort=False).sum()
    return sums, int(np.sum(best > 0))


def best_static_apply(per_kernel: pd.Series, test_kernels: np.ndarray) -> np.ndarray:
    """Scores of test rows under a ``best_static`` order (kernel -> training score); a kernel
    the order does not hold scores -inf."""
    scores = pd.Series(np.asarray(test_kernels, dtype=object)).map(per_kernel).to_numpy(dtype=np.float64)
    return np.where(np.isnan(scores), -np.inf, scores)


def best_static_scores(train_kernels: np.ndarray, train_perf: np.ndarray, train_groups: ShapeGroups,
                       test_kernels: np.ndarray) -> tuple[np.ndarray, pd.Series]:
    """Score test rows by each kernel's mean efficiency over the training shapes.

    The ``best_static`` baseline is one fixed preference order of kernels, learned on the
    training folds only: a kernel's training score is its mean ``perf / best`` over the training
    shapes (a shape where it is absent or failed contributes 0). At a test shape the usual
    selection applies (validity mask, highest score first), so the choice is the best static
    kernel whenever it can run the shape and the next one in the order otherwise. A test kernel
    never seen in training is scored -inf (ranked after every seen one, catalogue order).

    Returns
    -------
    scores : ndarray of float, one per test row
    ranking : Series
        Mean training efficiency per kernel name, highest first.
    """
    sums, n_scored = best_static_sums(train_kernels, train_perf, train_groups)
    per_kernel = sums / max(n_scored, 1)
    ranking = per_kernel.sort_values(ascending=False, kind="stable")
    return best_static_apply(per_kernel, test_kernels), ranking


def best_static_by(baselines: BaselinesConfig, op: OpDefinition) -> list[str]:
    """``baselines.best_static_by``: the problem fields the ``best_static`` order is learned per.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When one is not a problem field of ``op``.
    """
    by = [str(f) for f in baselines.best_static_by]
    for f in by:
        if f not in op.problem_names:
            raise ConfigValueError("baselines.best_static_by", f, f"a problem field of op {op.name}: "
                                   + ", ".join(op.problem_names))
    return by


def static_keys(table: pd.DataFrame, rows: np.ndarray, by: Sequence[str]) -> np.ndarray:
    """The kernel names the best-static order ranks: with ``by``, one name per (kernel, values of by)."""
    names = table["kernel_name"].to_numpy()[rows]
    if not by:
        return names
    strata = table[list(by)].iloc[rows].astype(str).agg("|".join, axis=1).to_numpy(dtype=object)
    return np.asarray(names, dtype=object) + "@" + strata


#: Columns the analytical heuristic needs.
ANALYTICAL_FIELDS: tuple[str, ...] = ("m", "n", "k", "tile_m", "tile_n", "tile_k")


def analytical_scores(frame: pd.DataFrame, *, cus: int, peak_tflops: float, bandwidth_gbs: float,
                      bytes_per_element: float, c_bytes: float = 2) -> np.ndarray:
    """A roofline time estimate with wave quantisation; no learning. Higher score = better.

    For a kernel with block tile (tm, tn, tk) on problem (M, N, K), with T = ceil(M/tm)*ceil(N/tn)
    output tiles spread over the CUs in ``waves = ceil(T / CUs)`` waves:

    * compute time = waves * 2*tm*tn*(ceil(K/tk)*tk) / (peak / CUs)  — padded tiles and the
      idle CUs of the last wave cost full time (wave quantisation);
    * memory time = (M*K*ceil(N/tn) + K*N*ceil(M/tm)) * b + M*N*c_b, divided by the memory
      bandwidth — A is re-read once per column of tiles and B once per row (tile reuse), so
      bigger tiles move fewer bytes;
    * estimate = max(compute, memory) (roofline); the score is its negative. Ties (common on
      small problems) are broken by the reuse score 2*tm*tn*tk / (4*(tm*tk + tk*tn)) from the
      budgeted-search literature, scaled to stay below one roofline step.

    Pipelines, schedulers and warp layouts are ignored: the heuristic ranks tiles only.
    """
    missing = [c for c in ANALYTICAL_FIELDS if c not in frame.columns]
    if missing:
        raise KeyError(f"the analytical baseline needs columns {list(ANALYTICAL_FIELDS)}; missing {missing}")
    m, n, k, tm, tn, tk = (frame[c].to_numpy(np.float64) for c in ANALYTICAL_FIELDS)
    tiles = np.ceil(m / tm) * np.ceil(n / tn)
    waves = np.ceil(tiles / cus)
    per_cu_flops = peak_tflops * 1e12 / cus
    compute_s = waves * 2.0 * tm * tn * np.ceil(k / tk) * tk / per_cu_flops
    bytes_moved = (m * k * np.ceil(n / tn) + k * n * np.ceil(m / tm)) * bytes_per_element + m * n * c_bytes
    memory_s = bytes_moved / (bandwidth_gbs * 1e9)
    estimate = np.maximum(compute_s, memory_s)
    reuse = 2.0 * tm * tn * tk / (4.0 * (tm * tk + tk * tn))
    # reuse <= 128 for the tile ranges in use; the tie-break is tiny relative to the estimate.
    return -estimate * (1.0 + 1e-6 * (1.0 - reuse / (1.0 + reuse.max(initial=1.0))))


def op_analytical_scores(table: pd.DataFrame, op: OpDefinition, arch: ArchConfig, dtype: DtypeConfig) -> np.ndarray:
    """:func:`analytical_scores` of a table of one op on one arch and dtype: the problem as the
    op's GEMM view, the arch's CUs, peak and bandwidth and the dtype's element sizes.

    Raises ``NotImplementedError`` when the op has no GEMM view and ``KeyError`` when a column
    or an arch constant (the dtype's peak) is missing: the caller skips the baseline with that reason.
    """
    m, n, k = op.gemm_view(table)
    return analytical_scores(table.assign(m=m, n=n, k=k), cus=int(arch_value(arch, "compute_units")),
                             peak_tflops=float(arch.peak_tflops[dtype.name]),
                             bandwidth_gbs=float(arch.memory_bandwidth_gbs),
                             bytes_per_element=bytes_per_element(dtype), c_bytes=c_bytes_per_element(dtype))


# ---------------------------------------------------------------------------------------------
# Reports and plots
# ---------------------------------------------------------------------------------------------
def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as indented JSON (NaN written as null)."""
    def clean(obj: object) -> object:
        if isinstance(obj, Mapping):
            return {str(k): clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        if isinstance(obj, (np.integer,)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            return None if not np.isfinite(obj) else float(obj)
        return obj

    path.write_text(json.dumps(clean(payload), indent=2) + "\n")
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (plots are written, never shown)."""
    # lazy: matplotlib.pyplot costs 0.4-1 s to import and only the plots need it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    return plt


def _pm(stats: Mapping[str, Any] | None, key: str) -> str:
    """``mean ± std`` in percent of one :func:`spread` entry, or ``-``."""
    if not stats or key not in stats:
        return "-"
    return f"{100 * stats[key]['mean']:.2f} ± {100 * stats[key]['std']:.2f}"


def print_summary(metrics: dict[str, Any], families: tuple[str, ...], out_dir: Path,
                  timings: dict[str, float], heading: str = "unseen shapes",
                  over_seeds: Mapping[str, Any] | None = None) -> None:
    """Rich tables: every method side by side, overall, the spread over folds (and seeds), by family.

    ``heading`` names what is held out (:meth:`ckpred.cv.schemes.CVScheme.heading`);
    ``over_seeds`` is the ``over_seeds`` section of a several-seed run (method -> :func:`spread`).
    """
    console = Console(width=None if sys.stdout.isatty() else 140)
    scored = {m: r for m, r in metrics.items() if isinstance(r, dict) and "mean" in r}
    for table in (_overall_table(scored, heading), _spread_table(scored, over_seeds),
                  *_family_table(scored, families), *_group_tables(scored)):
        console.print(table)
    skipped = {m: r["skipped"] for m, r in metrics.items() if isinstance(r, dict) and "skipped" in r}
    for method, why in skipped.items():
        console.print(f"{method}: {why}")
    console.print(_timing_line(timings, scored.get("model", {}).get("n_shapes", 0), out_dir))


def _overall_table(scored: Mapping[str, Any], heading: str) -> Table:
    """Every method's overall figures, side by side."""
    cols = [("mean", "mean"), ("p10", "P10"), ("p50", "P50"), ("min", "min"), ("top1", "top1"),
            ("top5", "top5"), ("efficiency@5", "eff@5"), ("efficiency@20", "eff@20"), ("ndcg@10", "ndcg@10"),
            ("failed_pick", "failed"), ("unmeasured_pick", "unmeasured"), ("fallback_efficiency", "w/ fallback")]
    table = Table(title=f"efficiency on {heading}, %",
                  caption="efficiency = chosen kernel / best kernel (0 for a pick the table has no row for); "
                          "failed = failed-pick rate; unmeasured = share of picks without a row; w/ fallback = "
                          "efficiency when such a pick falls back to the next-ranked kernel that ran")
    table.add_column("method")
    for _, title in cols:
        table.add_column(title, justify="right")
    for method, rep in scored.items():
        table.add_row(method, *[f"{100 * rep[key]:.2f}" if rep.get(key) is not None else "-" for key, _ in cols])
    return table


def _spread_table(scored: Mapping[str, Any], over_seeds: Mapping[str, Any] | None) -> Table:
    """Every method's mean ± std over the folds (and over the seeds)."""
    spread_table = Table(title=f"mean ± std over folds{' and over seeds' if over_seeds else ''}, %")
    spread_table.add_column("method")
    heads = [("mean", "mean (folds)"), ("p10", "P10 (folds)"), ("failed_pick", "failed (folds)"),
             ("unmeasured_pick", "unmeasured (folds)")]
    for _, title in heads:
        spread_table.add_column(title, justify="right")
    if over_seeds:
        for _, title in heads:
            spread_table.add_column(title.replace("folds", "seeds"), justify="right")
    for method, rep in scored.items():
        cells = [_pm(rep.get("folds"), key) for key, _ in heads]
        if over_seeds:
            cells += [_pm(over_seeds.get(method), key) for key, _ in heads]
        spread_table.add_row(method, *cells)
    return spread_table


def _family_table(scored: Mapping[str, Any], families: tuple[str, ...]) -> list[Table]:
    """Every method's mean / P10 per family (no table with fewer than two families present)."""
    present = [f for f in families if any(f in r["by_family"] for r in scored.values())]
    if len(present) <= 1:
        return []
    fam = Table(title="mean / P10 efficiency by family, %")
    fam.add_column("method")
    for f in present:
        n = next(r["by_family"][f]["n_shapes"] for r in scored.values() if f in r["by_family"])
        fam.add_column(f"{f} (n={n})", justify="right")
    for method, rep in scored.items():
        fam.add_row(method, *[f"{100 * rep['by_family'][f]['mean']:.2f} / {100 * rep['by_family'][f]['p10']:.2f}"
                              if f in rep["by_family"] else "-" for f in present])
    return [fam]


def _group_tables(scored: Mapping[str, Any]) -> list[Table]:
    """One table per other grouping of the model's report (``by_arch``...) with at least two groups."""
    tables = []
    model = scored.get("model", {})
    for key in sorted(k for k in model if k.startswith("by_") and k not in ("by_family", "by_best_pipeline")):
        groups = model[key]
        if len(groups) < 2:
            continue
        by = Table(title=f"mean / P10 / failed-pick rate {key.replace('_', ' ', 1)}, %")
        by.add_column("method")
        for label, rep in groups.items():
            by.add_column(f"{label} (n={rep['n_shapes']})", justify="right")
        over_archs = key == "by_arch"  # each GPU once: the mean a new GPU can expect
        if over_archs:
            by.add_column("mean over GPUs", justify="right")
        for method, rep in scored.items():
            cells = [f"{100 * rep[key][g]['mean']:.2f} / {100 * rep[key][g]['p10']:.2f} / "
                     f"{100 * rep[key][g].get('failed_pick', 0):.2f}"
                     if g in rep.get(key, {}) and "mean" in rep[key][g] else "-" for g in groups]
            if over_archs:
                cells.append(f"{100 * rep['mean_over_archs']:.2f}" if "mean_over_archs" in rep else "-")
            by.add_row(method, *cells)
        tables.append(by)
    return tables


def _timing_line(timings: Mapping[str, float], n_shapes: int, out_dir: Path) -> str:
    """The closing line: test shapes, fit+predict times (model against plain), wall time, outputs."""
    fits = [f"{m} {timings[f'{m}_s']:.1f}s" for m in METHODS if f"{m}_s" in timings]
    if timings.get("plain_s") and "model_s" in timings:
        fits.append(f"model / plain {timings['model_s'] / timings['plain_s']:.2f}x")
    if timings.get("plain_cpu_s") and "model_cpu_s" in timings:
        fits.append(f"CPU model {timings['model_cpu_s']:.1f}s / plain {timings['plain_cpu_s']:.1f}s = "
                    f"{timings['model_cpu_s'] / timings['plain_cpu_s']:.2f}x")
    return (f"{n_shapes} test shapes; fit+predict over the folds: {', '.join(fits) or '-'}; "
            f"wall time {timings.get('total_s', 0):.1f}s; outputs in {out_dir}")
