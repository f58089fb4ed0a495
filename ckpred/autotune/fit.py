"""Fitting the confidence budget's calibration on a train run's out-of-fold predictions."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, TypedDict, Unpack

import numpy as np

from ckpred.autotune.calibration import SCORE_FEATURES, Calibration, LogisticCalibration, score_gap, signal_features
from ckpred.autotune.checks import FALLBACK_K, AutotuneError, _count

if TYPE_CHECKING:
    import pandas as pd


def fit_logistic(features: np.ndarray, top_rel: np.ndarray, fields: Sequence[str], *,
                 within: Iterable[float] = (0.01, 0.02, 0.05, 0.1), c: float = 1.0) -> LogisticCalibration:
    """Fit a :class:`LogisticCalibration` (L2-regularised, ``C=c``) on calibration problems.

    Parameters
    ----------
    features : ndarray, shape (problems, features)
        :func:`signal_features` of each problem.
    top_rel : ndarray, shape (problems, max_k)
        Efficiency of the best of the model's top j, j = 1..max_k.
    fields : sequence of str
        The problem fields of ``features`` (in order).
    """
    # lazy: scikit-learn costs ~4 s to import (-X importtime, loaded machine); only this fit needs it
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(SCORE_FEATURES) + len(fields) + 1 or len(x) != len(top_rel) or not len(x):
        raise AutotuneError(f"fit_logistic: features {x.shape}, top_rel {np.shape(top_rel)}, {len(fields)} fields")
    observed = np.where(np.isnan(x), -np.inf, x).max(axis=0)
    fill = np.where(np.isfinite(observed), observed, 0.0)  # a missing gap: as large as the largest seen
    x = np.where(np.isnan(x), fill, x)
    lo, hi = x.min(axis=0), x.max(axis=0)
    mean, std = x.mean(axis=0), x.std(axis=0)
    scale = np.where(std > 0, std, 1.0)
    z = (x - mean) / scale
    within = tuple(float(w) for w in within)
    coef, intercept = [], []
    for w in within:
        rows, icpt = [], []
        for j in range(top_rel.shape[1]):
            hit = top_rel[:, j] >= 1.0 - w - 1e-12
            if hit.all() or not hit.any():  # one class: a constant, with one pseudo-count of the other
                rate = (hit.sum() + (0.0 if hit.all() else 1.0)) / (len(hit) + 1.0)
                rows.append(tuple(0.0 for _ in range(z.shape[1])))
                icpt.append(float(np.log(rate / (1.0 - rate))))
                continue
            m = LogisticRegression(C=c, max_iter=2000).fit(z, hit)
            rows.append(tuple(float(v) for v in m.coef_[0]))
            icpt.append(float(m.intercept_[0]))
        coef.append(tuple(rows))
        intercept.append(tuple(icpt))
    return LogisticCalibration(within, tuple(fields), tuple(map(float, fill)), tuple(map(float, lo)),
                               tuple(map(float, hi)), tuple(map(float, mean)), tuple(map(float, scale)),
                               tuple(coef), tuple(intercept), int(len(x)))


def _pav(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [value, weight, length]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(max(w, 1e-12)), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([[v] * int(n) for v, _, n in blocks])


@dataclass(frozen=True)
class OofRows:
    """Out-of-fold rows a calibration is fitted on, one entry per (problem, kernel) row.

    Attributes
    ----------
    shapes : array-like
        Problem key of each row (rows of a problem need not be contiguous).
    perf : array-like of float
        Measured performance, higher is better, 0 for failed rows (as in ``train``'s
        ``oof_predictions.parquet`` column ``perf``).
    scores : array-like of float
        Out-of-fold model scores (``score_model``), higher is better.
    selectable : array-like of bool, optional
        Rows the selector may pick (the validity mask); default all.
    tie_order : array-like, optional
        Secondary sort key for equal scores (the exported selector's kernel id); default row order.
    """

    shapes: Sequence[Any]
    perf: Sequence[float]
    scores: Sequence[float]
    selectable: Sequence[bool] | None = None
    tie_order: Sequence[Any] | None = None

    @classmethod
    def from_oof(cls, oof: pd.DataFrame, kernel_ids: Mapping[str, int] | None = None) -> "OofRows":
        """The rows of a train run's ``oof_predictions.parquet`` frame (ties by ``kernel_ids``)."""
        ties = None if kernel_ids is None else oof["kernel_name"].map(dict(kernel_ids)).to_numpy()
        return cls(oof["shape"].to_numpy(), oof["perf"].to_numpy(), oof["score_model"].to_numpy(),
                   oof["selectable"].to_numpy(), ties)


class TableOptions(TypedDict, total=False):
    """The keywords of :func:`calibrate` (``export``'s ``autotune`` settings of the table)."""

    within: Iterable[float]
    bins: int
    max_k: int
    prior_failures: float
    gap_to: int


def ranked_problems(rows: OofRows, *, max_k: int = 10) -> Iterable[tuple[Any, np.ndarray, np.ndarray]]:
    """Per problem with a valid measured kernel: its key, the scores of its selectable kernels in
    model order (ties by ``tie_order``, default row order) and the efficiency of the best of the
    top j, j = 1..max_k (the measured best over every row of the problem is 100%)."""
    import pandas as pd  # lazy: pandas costs ~0.8 s to import (ckpred.autotune ~0.13 s); only fitting needs it

    perf, selectable, tie_order = rows.perf, rows.selectable, rows.tie_order
    frame = pd.DataFrame({"shape": np.asarray(rows.shapes, dtype=object), "perf": np.asarray(perf, dtype=np.float64),
                          "score": np.asarray(rows.scores, dtype=np.float64),
                          "sel": np.ones(len(perf), bool) if selectable is None else np.asarray(selectable, bool),
                          "tie": np.arange(len(perf)) if tie_order is None else np.asarray(tie_order)})
    for shape, one in frame.groupby("shape", sort=False):
        best = one["perf"].max()
        cand = one[one["sel"]]
        if best <= 0 or cand.empty:
            continue
        cand = cand.sort_values(["score", "tie"], ascending=[False, True], kind="stable")
        yield shape, cand["score"].to_numpy(), top_j_efficiency(cand["perf"].to_numpy(), best, max_k)


def top_j_efficiency(perf: np.ndarray, best: float, max_k: int) -> np.ndarray:
    """Efficiency of the best of the first j of ``perf`` (model order), j = 1..max_k; past the
    last candidate it stays at the last value (0 when there is none)."""
    rel = np.maximum.accumulate(np.asarray(perf, dtype=np.float64)[:max_k] / best) if len(perf) else np.zeros(1)
    return np.concatenate([rel, np.full(max_k - len(rel), rel[-1])])


def _gap_bins(gaps: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inner bin edges (quantiles of the finite gaps), each problem's bin and the problems per bin."""
    finite = gaps[np.isfinite(gaps)]
    qs = np.quantile(finite, np.linspace(0, 1, bins + 1)[1:-1]) if len(finite) else np.array([])
    edges = np.unique(qs)
    if len(finite):
        edges = edges[edges > finite.min()]  # an edge at the smallest gap would leave its left bin empty
    which = np.searchsorted(edges, gaps, side="right")
    return edges, which, np.bincount(which, minlength=len(edges) + 1)


def _hit_table(hit: np.ndarray, which: np.ndarray, counts: np.ndarray,
               prior_failures: float) -> tuple[tuple[float, ...], ...]:
    """[bin][j - 1]: the share of a bin's problems whose top j hit (``hit``), made non-decreasing in
    the gap and in j, rounded to 6 digits."""
    n_bins, max_k = len(counts), hit.shape[1]
    prob = np.zeros((n_bins, max_k))
    for b in range(n_bins):
        if counts[b]:
            prob[b] = hit[which == b].sum(axis=0) / (counts[b] + prior_failures)
    for j in range(max_k):  # non-decreasing in the gap
        filled = counts > 0
        if filled.any():
            prob[filled, j] = _pav(prob[filled, j], counts[filled])
            # an empty bin takes the nearest filled bin below it (or above, at the bottom)
            for e in np.flatnonzero(~filled):
                below = np.flatnonzero(filled[:e])
                prob[e, j] = prob[below[-1], j] if len(below) else prob[np.flatnonzero(filled)[0], j]
    prob = np.maximum.accumulate(prob, axis=1)
    return tuple(tuple(round(float(p), 6) for p in row) for row in prob)


def calibrate(rows: OofRows, *, within: Iterable[float] = (0.01, 0.02, 0.05, 0.1), bins: int = 6, max_k: int = 10,
              prior_failures: float = 1.0, gap_to: int = 2) -> Calibration:
    """Fit the :class:`Calibration` table from out-of-fold predictions.

    Parameters
    ----------
    rows : OofRows
        The out-of-fold rows (problem keys, measured performance, scores, validity, tie order).
    within : iterable of float
        Tolerances to calibrate.
    bins : int
        Score-gap bins (quantiles of the gap over problems).
    max_k : int
        Largest top-j tabulated.
    prior_failures : float
        Pseudo-count of misses added to every bin (``hits / (n + prior_failures)``), so a
        small bin that never missed still does not claim certainty.
    gap_to : int
        The score gap is the top score minus the ``gap_to``-th (see :class:`Calibration`).

    Returns
    -------
    Calibration
    """
    within = tuple(float(w) for w in within)
    if bins < 1 or max_k < 1 or gap_to < 2:
        raise AutotuneError(f"calibrate: bins={bins!r}, max_k={max_k!r}, gap_to={gap_to!r}; allowed: integers "
                            ">= 1 (gap_to >= 2)")
    gaps, rel_top = [], []
    for _, cand_scores, rel in ranked_problems(rows, max_k=max_k):
        gaps.append(score_gap(cand_scores, gap_to))
        rel_top.append(rel)
    if not gaps:
        raise AutotuneError("calibrate: no problem with a valid measured kernel")
    rel_a = np.vstack(rel_top)
    edges, which, counts = _gap_bins(np.asarray(gaps), bins)
    tables = tuple(_hit_table(rel_a >= 1.0 - w - 1e-12, which, counts, prior_failures) for w in within)
    return Calibration(within, tuple(float(e) for e in edges), tables, tuple(int(c) for c in counts), gap_to)


def _logistic(rows: OofRows, problems: pd.DataFrame, within: tuple[float, ...], max_k: int) -> LogisticCalibration:
    """:func:`fit_logistic` on the rows' problems, their fields read from ``problems``."""
    fields = [str(c) for c in problems.columns]
    feats, top = [], []
    for shape, scores, rel in ranked_problems(rows, max_k=max_k):
        if shape not in problems.index:
            raise AutotuneError(f"calibration: problem {shape!r} of the out-of-fold rows has no field values")
        feats.append(signal_features(scores, problems.loc[shape].to_numpy(np.float64)))
        top.append(rel)
    return fit_logistic(np.vstack(feats), np.vstack(top), fields, within=within)


def calibration_from_oof(oof: pd.DataFrame, kernel_ids: Mapping[str, int] | None = None, *, kind: str = "table",
                         problems: pd.DataFrame | None = None, fallback_k: int = FALLBACK_K, min_problems: int = 10,
                         zero_shot: bool = False, **options: Unpack[TableOptions]) -> dict[str, Any]:
    """The manifest's ``autotune`` section from a train run's ``oof_predictions.parquet`` frame.

    Parameters
    ----------
    oof : DataFrame
        Columns ``shape``, ``kernel_name``, ``perf``, ``selectable``, ``score_model``.
    kernel_ids : mapping, optional
        Kernel name -> catalogue id, so equal scores rank as the exported selector ranks them.
    kind : {"table", "logistic"}
        :func:`calibrate` (score-gap bins) or :func:`fit_logistic` (score gaps and problem size).
    problems : DataFrame, optional
        ``logistic``: indexed by the ``shape`` keys, one column per problem field it uses.
    fallback_k, min_problems
        The stated k of the budget where the calibration has nothing to learn
        (:func:`informative_within`), and the fewest problems it learns from.
    zero_shot : bool
        The out-of-fold scores are of GPUs the folds did not train on (recorded: a selector on
        a new GPU is then what the calibration measured).
    **options
        Passed to :func:`calibrate` (``logistic``: ``within`` and ``max_k`` only).

    Returns
    -------
    dict
        The calibration (:meth:`Calibration.to_dict` / :meth:`LogisticCalibration.to_dict`) with
        ``uninformative_within``, ``fallback_k``, ``zero_shot`` and, when some tolerance is
        uninformative, ``note`` saying why.
    """
    rows = OofRows.from_oof(oof, kernel_ids)
    within = tuple(float(w) for w in options.get("within", (0.01, 0.02, 0.05, 0.1)))
    max_k = int(options.get("max_k", 10))
    rels = [rel for _, _, rel in ranked_problems(rows, max_k=max_k)]
    if not rels:
        raise AutotuneError("calibrate: no problem with a valid measured kernel")
    uninformative, note = informative_within(np.vstack(rels), within, min_problems)
    fallback_k = _count("fallback_k", fallback_k)
    cal: Calibration | LogisticCalibration
    if kind == "table":
        cal = calibrate(rows, **options)
    elif kind != "logistic" or problems is None:
        raise AutotuneError(f"calibration kind={kind!r} (problems given: {problems is not None}); allowed: 'table', "
                            "or 'logistic' with the problems' field values")
    else:
        cal = _logistic(rows, problems, within, max_k)
    out = replace(cal, uninformative=uninformative, fallback_k=fallback_k, zero_shot=bool(zero_shot)).to_dict()
    if note:
        out["note"] = f"{note}: the Confidence budget benchmarks a fixed k = {fallback_k} there"
    return out


def informative_within(top_rel: np.ndarray, within: Sequence[float], min_problems: int) -> tuple[tuple[float, ...], str]:
    """The tolerances a calibration has nothing to learn at, and why ("" when none).

    ``top_rel[p, j - 1]`` is the efficiency of the best of problem p's top j. A tolerance is
    uninformative when fewer than ``min_problems`` problems were scored (a handful of points
    sizes nothing), or when no problem's top-1 is within it: every label of j = 1 is a miss, so
    the probabilities cannot depend on the scores and the budget would only ever plan its cap.
    """
    n = len(top_rel)
    if n < min_problems:
        return tuple(within), f"{n} out-of-fold problem(s), fewer than the {min_problems} a calibration needs"
    missed = tuple(w for w in within if not np.any(top_rel[:, 0] >= 1.0 - w - 1e-12))
    if not missed:
        return (), ""
    return missed, (f"no out-of-fold problem's top-1 kernel is within {100 * max(missed):g}% of its best "
                    f"({n} problems)")
