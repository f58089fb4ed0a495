"""Scoring and evaluation of a table held in one process: what each method ranks per test
problem, the scores it gives, and the per-shape and per-method figures.

The seam is :func:`fold_test`: the rows every method ranks for one fold's test problems and
the arch their features and validity rules use. Those rows are the problems' candidate set
(:attr:`Tables.candidates`): every rule-valid catalogue kernel, as the exported selector ranks
them, the ones the table holds no row for included (``measured=False``,
:func:`ckpred.fitting.candidates`; on a table that measures every candidate, the test table
itself). Every method — learned, best static, analytical, random — is scored on exactly those
rows (:class:`OutOfFold`), and :func:`evaluate` turns the scores into per-shape metrics: strict
(a pick without a measurement scores 0), with the unmeasured-pick rate. For an op whose table
lists only the kernels that apply (``op.absence=not_applicable``), the fold's applicability
mask (:func:`ckpred.fitting.fit_applicability`) narrows the rules for every method alike, as it
narrows them in the exported selector.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred.cv.schemes import Fold
from ckpred.fitting import (Applicability, Coverage, LearnedMethod, Prepared, candidates, coverage_note, for_arch,
                            predict, rows_of, rule_mask)
from ckpred.kernels.base import OpDefinition
from ckpred.models import absent_estimate, failure_model, predicted_ok
from ckpred.schema import ArchConfig, DtypeConfig, RecipeConfig
from ckpred.transfer import Fitted, TransferModel


@dataclass
class Tables:
    """The prepared training table and the table the folds test (the same object unless the
    scheme brings its own, as ``external`` does), and the candidate sets ranked.

    ``candidates`` is every rule-valid catalogue kernel of each tested problem
    (:func:`ckpred.fitting.candidates`; ``test`` itself when it measures all of them), on
    ``test``'s shapes. ``train_candidates`` is the same of the training table, which the
    applicability mask learns on (None unless ``op.absence=not_applicable``).
    """

    train: Prepared
    test: Prepared
    candidates: Prepared = None  # type: ignore[assignment]
    train_candidates: Prepared | None = None
    #: Which rule-valid pairs of the tested table have a row (None: not looked at).
    coverage: Coverage | None = None

    def __post_init__(self) -> None:
        if self.candidates is None:
            self.candidates = self.test

    @classmethod
    def of(cls, train: Prepared, test: Prepared, op: OpDefinition, cfg: RecipeConfig) -> "Tables":
        """The tables of a run: ``test``'s candidate set and, for ``op.absence=not_applicable``,
        the training table's; prints what the coverage means (:func:`ckpred.fitting.coverage_note`,
        which also refuses a table the declared absence cannot apply to)."""
        cand, coverage = candidates(test, op, cfg)
        note = coverage_note(op, coverage)
        if note:
            print(note)
        train_cand = None
        if getattr(op, "absence", "unknown") == "not_applicable":
            train_cand = cand if test is train else candidates(train, op, cfg)[0]
        return cls(train, test, cand, train_cand, coverage)


@dataclass
class FoldTest:
    """The rows of ``test`` every method ranks for one fold's test problems, and the arch whose
    constants their features and validity rules use (None: each row's own, on a table of
    several GPUs)."""

    rows: np.ndarray
    arch: Any

    def arch_groups(self, test: Prepared) -> list[tuple[Any, np.ndarray]]:
        """``(arch, rows)`` covering the fold's test rows."""
        return [(self.arch, self.rows)] if self.arch is not None else test.arch_groups(self.rows)


def fold_test(test: Prepared, fold: Fold) -> FoldTest:
    """The test side of ``fold``: every row of its test shapes in ``test`` (the candidate set,
    :attr:`Tables.candidates`), with the fold's arch (:attr:`Fold.test_arch`) or else the table's
    (each row's own on a table of several GPUs)."""
    arch = fold.test_arch if fold.test_arch is not None else (None if test.multi_arch else test.arch)
    return FoldTest(rows_of(test.groups, fold.test_shapes), arch)


@dataclass
class OutOfFold:
    """Every candidate row's scores, filled fold by fold: per method its score, the learned
    validity mask of each method that has one (True = predicted to run), the applicability mask
    every method shares (True = predicted to apply; all True without one), the fold that tested
    the row (-1 = untested) and the rules' mask with the arch the row was tested with."""

    scores: dict[str, np.ndarray]
    runs: dict[str, np.ndarray]
    fold_of_row: np.ndarray
    selectable: np.ndarray
    applicable: np.ndarray = None  # type: ignore[assignment]
    #: The applicability model's estimate that each row is absent (NaN: not estimated), kept for
    #: the transfer recipe's learner, which weighs its scores with it.
    absent: np.ndarray = None  # type: ignore[assignment]
    #: One entry per fold: its test shapes and each method's fit info (``folds.json``).
    log: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.applicable is None:
            self.applicable = np.ones(len(self.fold_of_row), dtype=bool)
        if self.absent is None:
            self.absent = np.full(len(self.fold_of_row), np.nan)

    @classmethod
    def start(cls, test: Prepared, methods: list[LearnedMethod], best_static: bool) -> "OutOfFold":
        n = len(test.table)
        scores = {m.name: np.full(n, np.nan) for m in methods}
        if best_static:
            scores["best_static"] = np.full(n, np.nan)
        runs = {m.name: np.ones(n, dtype=bool) for m in methods if m.validity is not None}
        return cls(scores, runs, np.full(n, -1, dtype=np.int64), test.selectable.copy())

    def begin_fold(self, i: int, side: FoldTest, tables: Tables, op: OpDefinition, cfg: RecipeConfig) -> None:
        """Mark ``side``'s rows as tested by fold ``i``; with an arch of their own, their rules
        are checked again with its constants."""
        self.fold_of_row[side.rows] = i
        if side.arch is not None and side.arch is not tables.candidates.arch:
            self.selectable[side.rows] = rule_mask(tables.candidates.table.iloc[side.rows], op, cfg, side.arch)

    def candidate_mask(self, rows: np.ndarray, groups: ev.ShapeGroups) -> tuple[np.ndarray, np.ndarray]:
        """The rules of ``rows`` narrowed by the applicability mask, with its fallback
        (:func:`ckpred.evaluate.narrowed_mask`): what every method may choose before its own
        failure mask, and which of ``groups``' shapes fell back to the rules."""
        return ev.narrowed_mask(self.selectable[rows], self.applicable[rows], groups)

    def running_mean(self, test: Prepared) -> float:
        """The model's mean per-shape (strict) efficiency over the candidate rows tested so far."""
        so_far = self.fold_of_row >= 0
        groups = ev.ShapeGroups.from_keys(test.groups.codes[so_far])
        mask = self.candidate_mask(so_far, groups)[0]
        if "model" in self.runs:
            mask = ev.learned_selection_mask(mask, self.runs["model"][so_far], groups)
        per_shape = ev.shape_metrics(test.perf[so_far], self.scores["model"][so_far], groups, mask,
                                     test.measured[so_far])
        return float(per_shape["efficiency"].mean())


def scorer_for(method: LearnedMethod, pipe: Fitted, arch: ArchConfig | None, tables: Tables, op: OpDefinition,
               cfg: RecipeConfig) -> Pipeline:
    """The pipeline whose features score rows of ``arch``: ``pipe`` itself, or with features
    rebuilt with ``arch`` when it is not the training table's (a transfer recipe: its learner)."""
    if isinstance(pipe, TransferModel):
        return pipe.learner_pipeline(op, cfg, arch, tables.candidates.table)
    if arch is tables.train.arch:
        return pipe
    return for_arch(pipe, method, op, cfg, arch, tables.candidates.X)


def score_method(method: LearnedMethod, pipe: Fitted, side: FoldTest, tables: Tables, op: OpDefinition,
                 cfg: RecipeConfig, oof: OutOfFold) -> None:
    """Score ``side``'s rows with ``method``'s fitted pipeline (features rebuilt with the rows'
    arch when it is not the training table's) and its learned validity mask."""
    test = tables.candidates
    if isinstance(pipe, TransferModel):  # ranked among each problem's candidates: the rules' mask
        absent = oof.absent[side.rows]
        oof.scores[method.name][side.rows] = pipe.score(test, side.rows, op, cfg, oof.selectable[side.rows],
                                                       arch=side.arch,
                                                       absent=None if np.isnan(absent).any() else absent)
        return
    for arch, rows in side.arch_groups(test):
        scorer = scorer_for(method, pipe, arch, tables, op, cfg)
        X = test.X.iloc[rows]
        oof.scores[method.name][rows] = predict(scorer, X)
        if method.name in oof.runs and failure_model(scorer) is not None:
            oof.runs[method.name][rows] = predicted_ok(scorer, X)


def score_applicability(fitted: Applicability, method: LearnedMethod, pipe: Fitted, side: FoldTest,
                        tables: Tables, op: OpDefinition, cfg: RecipeConfig, oof: OutOfFold) -> dict[str, Any]:
    """The fold's applicability mask on ``side``'s rows (on the features of ``pipe``, the fold's
    model); returns the fold's entry: its threshold, the inner folds' strict mean per threshold and
    what scored them, its training pairs and how many of the fold's test problems it left without
    a kernel."""
    for arch, rows in side.arch_groups(tables.candidates):
        oof.absent[rows] = absent_estimate(scorer_for(method, pipe, arch, tables, op, cfg),
                                           tables.candidates.X.iloc[rows], fitted.model)
        oof.applicable[rows] = oof.absent[rows] <= fitted.threshold
    rows = side.rows
    fell = oof.candidate_mask(rows, ev.ShapeGroups.from_keys(tables.candidates.groups.codes[rows]))[1]
    curve = fitted.curve
    inner = {f"{t:g}": round(float(m), 6) for t, m in zip(curve["threshold"], curve["mean"])} \
        if "mean" in curve else None
    return {"threshold": fitted.threshold, "train_pairs": fitted.train_pairs, "fell_back": int(fell.sum()),
            "inner_mean": inner, "inner_scores": fitted.inner_scores}


def fit_times(info: dict[str, Any], started: float, cpu_started: float, timings: dict[str, float],
              name: str) -> None:
    """Record a fit's wall and CPU seconds in its fold info and add them to the run's timings
    (CPU seconds too: on a shared machine wall time also measures the other processes)."""
    info["fit_predict_s"] = round(time.perf_counter() - started, 2)
    info["fit_predict_cpu_s"] = round(time.process_time() - cpu_started, 2)
    timings[f"{name}_s"] = timings.get(f"{name}_s", 0.0) + info["fit_predict_s"]
    timings[f"{name}_cpu_s"] = timings.get(f"{name}_cpu_s", 0.0) + info["fit_predict_cpu_s"]


def score_best_static(fold: Fold, side: FoldTest, tables: Tables, static_by: list[str],
                      oof: OutOfFold) -> dict[str, Any]:
    """The best static order learned on the fold's training shapes, scored on its test rows;
    returns the fold's entry (its top kernels)."""
    data, test = tables.train, tables.candidates
    train_rows = rows_of(data.groups, fold.train_shapes)
    sub = ev.ShapeGroups.from_keys(data.groups.codes[train_rows])
    scores, ranking = ev.best_static_scores(ev.static_keys(data.table, train_rows, static_by),
                                            data.perf[train_rows], sub,
                                            ev.static_keys(test.table, side.rows, static_by))
    oof.scores["best_static"][side.rows] = scores
    return {"top_kernels": ranking.head(5).round(4).to_dict()}


def score_analytical(sides: list[FoldTest], test: Prepared, op: OpDefinition, dtype: DtypeConfig,
                     oof: OutOfFold) -> str | None:
    """The analytical heuristic on every tested row, with the arch each was tested with; returns
    why it was skipped (None when scored). It reasons about the GEMM the kernel tiles: the op's
    GEMM view."""
    scores = np.full(len(test.table), np.nan)
    by_arch: dict[int, np.ndarray] = {}
    try:
        for side in sides:
            for arch, rows in side.arch_groups(test):
                if id(arch) not in by_arch:
                    by_arch[id(arch)] = ev.op_analytical_scores(test.table, op, arch, dtype)
                scores[rows] = by_arch[id(arch)][rows]
    except (KeyError, NotImplementedError) as exc:
        return f"skipped: {exc}"
    oof.scores["analytical"] = scores
    return None


@dataclass
class Evaluation:
    """The figures of the tested shapes: which rows were tested, their shapes, per method the
    per-shape metrics (:func:`ckpred.evaluate.shape_metrics`) and the report of each method."""

    tested: np.ndarray
    groups: ev.ShapeGroups
    shapes: pd.DataFrame
    per_shape: dict[str, pd.DataFrame]
    metrics: dict[str, Any]


def per_shape_metrics(test: Prepared, oof: OutOfFold, random: bool) -> Evaluation:
    """Per method the per-shape metrics on the tested rows (a hold-out tests a subset) of the
    candidate set ``test``: the rules narrowed by the applicability mask, then by each learned
    validity mask, each with its fallback; strict (an unmeasured pick scores 0). ``random``
    draws among the measured rows and the unmeasured ones the applicability mask keeps."""
    tested = oof.fold_of_row >= 0
    groups = ev.ShapeGroups.from_keys(test.groups.codes[tested])
    shapes = test.shapes.iloc[np.asarray(groups.keys, dtype=np.int64)].reset_index(drop=True)
    perf, measured = test.perf[tested], test.measured[tested]
    selectable = oof.candidate_mask(tested, groups)[0]
    per_shape: dict[str, pd.DataFrame] = {}
    for name, scores in oof.scores.items():
        mask = selectable
        if name in oof.runs:
            mask = ev.learned_selection_mask(selectable, oof.runs[name][tested], groups)
        per_shape[name] = ev.shape_metrics(perf, scores[tested], groups, mask, measured)
    if random:
        per_shape["random"] = ev.random_shape_metrics(perf, groups, measured, pool=measured | selectable)
    per_shape = {m: per_shape[m] for m in ev.METHODS if m in per_shape}
    return Evaluation(tested, groups, shapes, per_shape, {})


def best_kernel_seen(tables: Tables, folds: list[Fold]) -> np.ndarray | None:
    """Per test shape, ``seen`` or ``unseen``: whether its best kernel is among the kernels of its
    fold's training rows (a GPU whose library lists kernels the training GPUs never ran); None
    when every tested best kernel was seen."""
    train, test = tables.train, tables.test
    labels = np.full(test.groups.n_shapes, "", dtype=object)
    names = train.table["kernel_name"].to_numpy()
    for fold in folds:
        seen = set(pd.unique(names[rows_of(train.groups, fold.train_shapes)]))
        best = test.shapes["best_kernel"].to_numpy()[fold.test_shapes]
        labels[fold.test_shapes] = np.where([b in seen or b == "" for b in best], "seen", "unseen")
    return labels if (labels == "unseen").any() else None


def evaluate(test: Prepared, oof: OutOfFold, op: OpDefinition, n_folds: int, random: bool,
             labels: dict[str, np.ndarray] | None = None) -> Evaluation:
    """Every method's report on the tested shapes: overall, by family, by best pipeline, by each
    categorical problem field, by each of ``labels`` (name -> a label per test shape, e.g.
    :func:`best_kernel_seen`), by GPU on a table of several and (with several folds) over folds."""
    out = per_shape_metrics(test, oof, random)
    shapes = out.shapes
    best_pipeline = shapes["best_pipeline"].to_numpy() if "best_pipeline" in shapes else None
    shape_fold = oof.fold_of_row[np.flatnonzero(out.tested)[out.groups.first_rows()]]
    breakdowns = {f.name: shapes[f.name].to_numpy() for f in op.problem_fields
                  if f.kind in ("category", "categorical", "bool") and f.name in shapes
                  and shapes[f.name].nunique() > 1}
    if "arch" in shapes and "arch" not in breakdowns and shapes["arch"].nunique() > 1:
        breakdowns["arch"] = shapes["arch"].to_numpy()  # a table of several GPUs: each GPU's figures
    for name, values in (labels or {}).items():
        breakdowns[name] = np.asarray(values, dtype=object)[np.asarray(out.groups.keys, dtype=np.int64)]
    out.metrics = {m: ev.method_report(ps, shapes["family"].to_numpy(), op.families, best_pipeline,
                                       breakdowns=breakdowns, fold=shape_fold if n_folds > 1 else None)
                   for m, ps in out.per_shape.items()}
    for report in out.metrics.values():
        by_arch = [r["mean"] for r in report.get("by_arch", {}).values() if "mean" in r]
        if by_arch:  # each GPU counts once, however many problems it has
            report["mean_over_archs"] = float(np.mean(by_arch))
    return out
