"""The transfer recipe: picking kernels on a GPU that no training row comes from.

Trained on other GPUs, a ranker learns the order of kernels *on those GPUs*; on a new one it
loses to the simplest baselines (docs/results.md, "A new GPU: zero-shot transfer"). The recipe
that does not, on every multi-GPU table measured there:

* **learner**: plain LightGBM (``baselines.plain``: the log1p regressor on the op's feature set),
  every training row featurised with its own GPU's arch constants, so the trees learn how the
  kernels' throughput moves with the hardware;
* **static order**: the ``best_static`` order (each kernel's mean efficiency over the training
  shapes, per ``baselines.best_static_by`` stratum) of the training GPUs;
* **blend**: score = (1 - w) * p(learner) + w * p(static), where p is the within-problem rank
  percentile over the problem's candidates (:func:`rank_percentile`: average rank of ties,
  1 = the top), so the two scales need no calibration against each other;
* **w** in ``transfer.weights`` (default 0, .25, .5, .75, 1), chosen by an inner
  leave-one-GPU-out split of the training GPUs: per held-out training GPU, the learner and the
  static order fitted on the others, every w scored by the held-out GPU's mean efficiency; the w
  of the best mean over the inner folds wins, ties to the smaller w. With one training GPU
  there is no split and w = 0 (the learner alone); a single weight given is used as it is.

For an op whose table lists only the kernels that apply (``op.absence=not_applicable``), the
learner's score of a candidate is its **expected throughput**: the predicted throughput times the
applicability mask's estimate that the kernel applies, 1 - (its estimate of being absent)
(:func:`ckpred.models.expected_throughput`). A pick the new GPU's library does not list for the problem gains
nothing, so a kernel predicted fast but probably absent ranks below one a little slower that
surely applies; the hard mask (the estimate's threshold) still removes the kernels surely absent,
its threshold chosen on inner folds of the training problems that score the learner this way
(:func:`ckpred.fitting.fit_applicability`).

With w = 0 the recipe's scores are the learner's own (its percentile ranks in the same order);
with w = 1 the static order's. :func:`fit_transfer` is a plain function of a prepared table and
training shapes (used by ``train``'s CV, its final fit, and anything that needs the recipe on
other shapes); :meth:`TransferModel.score` scores rows of any table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence, TypeAlias

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred.fitting import (LearnedMethod, Prepared, arch_scorers, fit_method, for_arch, learner_method, predict,
                            recipe_config, rows_of, same_arch)
from ckpred.kernels.base import OpDefinition
from ckpred.models import absent_estimate, applicability_model, expected_throughput
from ckpred.schema import ArchConfig, RecipeConfig, TrainConfig

log = logging.getLogger(__name__)

__all__ = ["Fitted", "TransferModel", "blend", "choose_weight", "fit_learned", "fit_transfer",
           "learner_predict", "rank_percentile", "transfer_method"]

#: Stands for "never seen in training" in the static order inside a ranking (below every mean
#: efficiency, which is >= 0): a finite value, so that the selector can tell an unseen kernel
#: (ranked last among the candidates) from an invalid one (-inf, no candidate at all).
UNSEEN = -1.0


def learner_predict(scorer: Pipeline, X: pd.DataFrame, absent: np.ndarray | None = None) -> np.ndarray:
    """The learner's score of each row of raw input ``X``: its prediction, or with an
    applicability model attached to ``scorer`` the :func:`ckpred.models.expected_throughput` (``absent``: the
    model's estimates of these rows when already computed, as CV's folds have them)."""
    predicted = predict(scorer, X)
    if applicability_model(scorer) is None:
        return predicted
    return expected_throughput(predicted, absent_estimate(scorer, X) if absent is None else absent)


def transfer_method(cfg: TrainConfig) -> LearnedMethod:
    """The recipe as the run's ``model`` method: ``baselines.plain``'s model and target on the
    model's features and training rows, fitted by :func:`fit_transfer`."""
    plain = cfg.baselines.plain
    return LearnedMethod("model", recipe_config(cfg, cfg.features, plain.model, plain.target), cfg.rows,
                         transfer=cfg.transfer)


def rank_percentile(scores: np.ndarray, codes: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Within-problem rank percentile of ``scores`` among the ``mask``-ed rows of each problem
    (``codes``): (number of candidates scoring less + (number scoring equal + 1) / 2) / number of
    candidates, so the top is 1 and ties share their average rank; NaN outside ``mask``.

    The exported selector computes exactly these doubles (:mod:`ckpred.export.blend`).
    """
    scores = np.asarray(scores, dtype=np.float64)
    out = np.full(len(scores), np.nan)
    rows = np.flatnonzero(np.asarray(mask, dtype=bool))
    if not len(rows):
        return out
    s, q = scores[rows], np.asarray(codes)[rows]
    order = np.lexsort((s, q))  # by problem, then score ascending
    s_sorted, q_sorted = s[order], q[order]
    new_problem = np.r_[True, q_sorted[1:] != q_sorted[:-1]]
    new_value = new_problem | np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    problem_start = np.maximum.accumulate(np.where(new_problem, np.arange(len(s)), 0))
    value_id = np.cumsum(new_value) - 1
    value_start = np.flatnonzero(new_value)
    value_count = np.diff(np.r_[value_start, len(s)])
    problem_id = np.cumsum(new_problem) - 1
    problem_count = np.diff(np.r_[np.flatnonzero(new_problem), len(s)])
    less = (value_start[value_id] - problem_start).astype(np.float64)
    rank = less + (value_count[value_id].astype(np.float64) + 1.0) / 2.0
    pct = np.empty(len(s))
    pct[order] = rank / problem_count[problem_id].astype(np.float64)
    out[rows] = pct
    return out


def blend(learner: np.ndarray, static: np.ndarray, codes: np.ndarray, mask: np.ndarray, w: float) -> np.ndarray:
    """The recipe's score of rows (``learner`` and ``static`` scores, problem ``codes``, candidate
    ``mask``): the learner's scores when w = 0, the static order's when w = 1, else
    (1 - w) * p(learner) + w * p(static) over each problem's candidates; NaN outside ``mask``."""
    mask = np.asarray(mask, dtype=bool)
    if w == 0.0:
        return np.where(mask, learner, np.nan)
    static = np.where(np.isfinite(static), static, UNSEEN)
    if w == 1.0:
        return np.where(mask, static, np.nan)
    return (1.0 - w) * rank_percentile(learner, codes, mask) + w * rank_percentile(static, codes, mask)


def choose_weight(inner: dict[float, float]) -> float:
    """The w of the best inner mean efficiency; among equals (within 1e-9) the smaller w."""
    top = max(inner.values())
    return min(w for w, mean in inner.items() if mean >= top - 1e-9)


@dataclass
class TransferModel:
    """A fitted transfer recipe (see the module docstring)."""

    #: The fitted learner (a ``features -> model`` Pipeline, features for ``arch``).
    learner: Pipeline
    #: The static order: static key (kernel name, ``@stratum`` with ``static_by``) -> mean efficiency.
    static: pd.Series
    static_by: tuple[str, ...]
    #: The blend weight of the static order.
    weight: float
    #: The learner's method (its recipe rebuilds the features for another arch).
    method: LearnedMethod
    #: The arch the learner's features are built for.
    arch: ArchConfig
    #: The GPUs (arch names) of the training rows.
    archs: tuple[str, ...] = ()
    #: The inner split's mean efficiency per w (empty without an inner split).
    inner: dict[float, float] = field(default_factory=dict)

    @property
    def pipeline(self) -> Pipeline:
        """The learner pipeline (what ``pipeline.joblib`` readers, plots and exports inspect)."""
        return self.learner

    def learner_pipeline(self, op: OpDefinition, cfg: RecipeConfig, arch: ArchConfig | None, table: pd.DataFrame) -> Pipeline:
        """The learner with its features built for ``arch`` (itself when that is its own arch);
        ``table`` gives the input columns it is fitted on."""
        if same_arch(arch, self.arch):
            return self.learner
        return for_arch(self.learner, self.method, op, cfg, arch, op.encode_frame(table.head(8)))

    def static_scores(self, table: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
        """The static order's score of ``rows`` of ``table`` (-inf for a kernel never seen)."""
        return ev.best_static_apply(self.static, ev.static_keys(table, rows, list(self.static_by)))

    def learner_scores(self, data: Prepared, rows: np.ndarray, op: OpDefinition, cfg: RecipeConfig,
                       arch: ArchConfig | None = None, absent: np.ndarray | None = None) -> np.ndarray:
        """The learner's scores of ``rows`` of ``data``, each row featurised with its own arch
        (or every row with ``arch``); ``absent``: the applicability model's estimates of ``rows``
        when already computed (:func:`learner_predict`)."""
        out = np.full(len(rows), np.nan)
        groups = [(arch, np.asarray(rows))] if arch is not None else data.arch_groups(rows)
        for scorer, at, sub in arch_scorers(self.learner, self.method, op, cfg, data.X, rows, groups, self.arch):
            out[at] = learner_predict(scorer, data.X.iloc[sub], None if absent is None else absent[at])
        return out

    def score(self, data: Prepared, rows: np.ndarray, op: OpDefinition, cfg: RecipeConfig, mask: np.ndarray,
              arch: ArchConfig | None = None, absent: np.ndarray | None = None) -> np.ndarray:
        """The recipe's scores of ``rows`` (every row of their problems: the candidates), ranked
        among the ``mask``-ed ones of each problem (NaN elsewhere); ``absent`` as in
        :meth:`learner_scores`."""
        rows = np.asarray(rows)
        learner = self.learner_scores(data, rows, op, cfg, arch, absent) if self.weight < 1.0 else np.zeros(len(rows))
        static = self.static_scores(data.table, rows) if self.weight > 0.0 else np.zeros(len(rows))
        return blend(learner, static, data.groups.codes[rows], mask, self.weight)

    def score_candidates(self, table: pd.DataFrame, X: pd.DataFrame, op: OpDefinition, cfg: RecipeConfig,
                         arch: ArchConfig) -> np.ndarray:
        """The recipe's scores of every row of ``table`` (candidates of some problems, all featurised
        with ``arch``; ``X`` their encoded frame), ranked within each problem as the exported
        selector ranks them."""
        rows = np.arange(len(table))
        learner = learner_predict(self.learner_pipeline(op, cfg, arch, table), X) if self.weight < 1.0 \
            else np.zeros(len(rows))
        static = self.static_scores(table.reset_index(drop=True), rows) if self.weight > 0.0 else np.zeros(len(rows))
        codes = pd.factorize(op.shape_keys(table))[0]
        return blend(learner, static, codes, np.ones(len(rows), dtype=bool), self.weight)

    def info(self) -> dict[str, Any]:
        """What the fit chose (a fold's fit info, the run record)."""
        return {"recipe": "transfer", "weight": self.weight, "archs": list(self.archs),
                "inner": {f"{w:g}": round(m, 6) for w, m in self.inner.items()}}


#: A fitted learned method: a ``features -> model`` Pipeline, or the transfer recipe.
Fitted: TypeAlias = "Pipeline | TransferModel"


def _static_order(data: Prepared, shapes: np.ndarray, by: Sequence[str]) -> pd.Series:
    """The best static order of ``shapes`` (static key -> mean efficiency)."""
    rows = rows_of(data.groups, shapes)
    groups = ev.ShapeGroups.from_keys(data.groups.codes[rows])
    _, ranking = ev.best_static_scores(ev.static_keys(data.table, rows, by), data.perf[rows], groups,
                                       np.zeros(0, dtype=object))
    return ranking


def fit_transfer(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: RecipeConfig,
                 seed: int, weights: Sequence[float] | None = None) -> tuple[TransferModel, dict[str, Any]]:
    """Fit the transfer recipe on the training ``shapes`` of ``data``; returns (model, fit info).

    Parameters
    ----------
    method : LearnedMethod
        The learner (:func:`transfer_method`: ``baselines.plain`` on the model's features).
    data : Prepared
        The prepared table; a table of several GPUs featurises each row with its own arch.
    shapes : ndarray of int
        Training shape indices.
    op, cfg
        The op and the composed train config (``baselines.best_static_by``, ``dtype``).
    seed : int
        Seed of every learner fit (the outer one and the inner split's).
    weights : sequence of float, optional
        The blend weights to choose among (default ``method.transfer.weights``).
    """
    shapes = np.asarray(shapes, dtype=np.int64)
    if weights is None:
        assert method.transfer is not None  # a transfer method carries its config
        weights = method.transfer.weights
    weights = [float(w) for w in weights]
    by = ev.best_static_by(cfg.baselines, op)
    plain = learner_method(method)
    learner, info = fit_method(plain, data, shapes, op, cfg, seed)
    archs = data.arch_names(shapes)
    inner: dict[float, float] = {}
    if data.multi_arch and len(archs) >= 2 and len(weights) > 1:
        inner = _inner_split(plain, data, shapes, op, cfg, seed, weights, by)
        weight = choose_weight(inner)
    else:  # one training GPU: nothing to weigh the static order on (one weight given: that one)
        weight = weights[0] if len(weights) == 1 else 0.0
    model = TransferModel(learner, _static_order(data, shapes, by), tuple(by), weight, plain,
                          data.arch if data.arch is not None else cfg.arch, tuple(archs), inner)
    info.update(model.info())
    log.info("transfer recipe on %s: w = %g (inner means %s)", archs, weight, model.info()["inner"])
    return model, info


def fit_learned(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: RecipeConfig,
                seed: int) -> tuple[Fitted, dict[str, Any]]:
    """Fit any learned method on the training ``shapes`` of ``data``; returns (model, fit info):
    the transfer recipe (``method.transfer`` set) by :func:`fit_transfer`, a
    :class:`TransferModel`; every other by :func:`ckpred.fitting.fit_method`, a Pipeline."""
    if method.transfer is not None:
        return fit_transfer(method, data, shapes, op, cfg, seed)
    return fit_method(method, data, shapes, op, cfg, seed)


def _inner_split(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: RecipeConfig, seed: int,
                 weights: list[float], by: Sequence[str]) -> dict[float, float]:
    """Mean efficiency of every w over an inner leave-one-GPU-out split of the training shapes."""
    per: dict[float, list[float]] = {w: [] for w in weights}
    codes = data.shape_arch[shapes]
    for code in np.unique(codes):
        held, rest = shapes[codes == code], shapes[codes != code]
        learner, _ = fit_method(method, data, rest, op, cfg, seed)
        arch = data.archs[int(code)]
        model = TransferModel(learner, _static_order(data, rest, by), tuple(by), 0.0, method,
                              data.arch if data.arch is not None else cfg.arch)
        rows = rows_of(data.groups, held)
        learner_s = model.learner_scores(data, rows, op, cfg, arch)
        static_s = model.static_scores(data.table, rows)
        local = ev.ShapeGroups.from_keys(data.groups.codes[rows])
        mask = data.selectable[rows]
        for w in weights:
            scores = blend(learner_s, static_s, data.groups.codes[rows], mask, w)
            eff = ev.shape_metrics(data.perf[rows], scores, local, mask)["efficiency"].to_numpy()
            per[w].append(float(np.nanmean(eff)) if np.isfinite(eff).any() else 0.0)
    return {w: float(np.mean(v)) for w, v in per.items()}
