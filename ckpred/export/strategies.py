"""Selection strategies of the exported selector (``export.select``): what the graph scores.

``full``
    Every catalogue kernel is scored by the full model (:func:`ckpred.export.onnx.build_selector`).
``pruned``
    Only a *candidate set* learned from the training data is scored: the union over training
    shapes of their ``top_n`` fastest rule-valid kernels (measured, not predicted), plus a
    fallback kernel valid for (nearly) every problem so that a problem some catalogue kernel can
    run never ends with no candidate. Kernels that never reached the top ``top_n`` of any
    training shape are the ones that cannot win in the data the model knows; dropping them
    shrinks the tree work by ``C / len(keep)`` (4,608 -> a few dozen on the default data).
    The graph is the ``full`` selector over the kept rows of the catalogue
    (:func:`ckpred.export.onnx.build_selector` with ``keep``), whose local TopK indices are
    mapped back to catalogue ids with a ``Gather``; its Python counterpart is
    ``pipeline.predict`` on the same rows.
``reranked``
    The ``pruned`` candidate set, ranked by a *reranker*: the same recipe (features, model,
    target) with a small model (``export.reranker``: 31 leaves, 70 trees at a learning rate of 0.1
    by default, more at a smaller rate: :func:`reranker_size`) fitted
    only on the candidates' rows of the training shapes (:func:`fit_reranker`). Telling a few
    dozen strong kernels apart is an easier problem than ranking all 4,608, so a model a
    fraction of the size ranks them as well as the full one, and its trees (which dominate the
    pruned selector's time) cost a fraction. The scorer graph keeps the full model.

Quality is measured under the same shape-grouped CV as ``train``: the candidate set is learned
from each fold's training shapes only (:func:`learn_keep`) and applied to the fold's test shapes
(:func:`cv_efficiency`; ``scripts/bench/bench_select.py`` prints it next to the latency).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Iterable, Mapping

import numpy as np
import pandas as pd

from ckpred import evaluate as ev
from ckpred.fitting import with_unmeasured
from ckpred.kernels.base import OpDefinition
from ckpred.models import FitRows, Recipe, build_pipeline, fit_pipeline, target_name, training_target
from ckpred.schema import Hardware, ModelConfig, RecipeConfig


@dataclass(frozen=True, eq=False)
class Strategy:
    """A selection strategy for one arch/dtype/layout, as :func:`strategy_scores` relearns it
    per fold and :func:`fit_reranker` fits it.

    Attributes
    ----------
    arch, dtype, layout : config nodes or names
        What the selector is for.
    top_n : int or None
        ``None`` = ``full`` (every kernel); else the candidate set keeps each training shape's
        ``top_n`` fastest kernels (:func:`learn_keep`).
    reranker : mapping, optional
        ``reranked``: ``n_estimators`` and ``num_leaves`` of the reranker (:func:`reranker_size`).
    recipe : RecipeConfig, optional
        ``features``, ``model`` and ``target`` the reranker follows (a train or export config).
    seed : int
        The reranker's seed.
    """

    arch: Any
    dtype: Any
    layout: Any
    top_n: int | None = None
    reranker: Mapping[str, Any] | None = None
    recipe: RecipeConfig | None = None
    seed: int = 0


def learn_keep(kernel_ids: np.ndarray, perf: np.ndarray, selectable: np.ndarray, codes: np.ndarray,
               n_kernels: int, *, top_n: int, fallback_valid: np.ndarray | None = None) -> np.ndarray:
    """The candidate set (sorted catalogue ids) learned from training rows.

    Parameters
    ----------
    kernel_ids : ndarray of int, shape (n_rows,)
        Catalogue id of each training row.
    perf : ndarray of float, shape (n_rows,)
        Measured performance (0 = failed/invalid).
    selectable : ndarray of bool, shape (n_rows,)
        The op's validity rules on each row.
    codes : ndarray of int, shape (n_rows,)
        Shape index of each row (only training shapes may appear here).
    n_kernels : int
        Catalogue size.
    top_n : int
        Kernels kept per training shape (its ``top_n`` fastest selectable ones).
    fallback_valid : ndarray of bool, shape (n_probes, n_kernels), optional
        Validity of each kernel on probe problems; the kernel valid on the most probes (ties:
        the one most often kept) is added so that awkward unseen sizes keep a candidate.

    Returns
    -------
    ndarray of int64
        Sorted unique catalogue ids.
    """
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    p = np.where(selectable, perf, 0.0)
    order = np.lexsort((-p, codes))  # rows grouped by shape, fastest first
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    chosen = order[(rank < top_n) & (p[order] > 0)]
    counts = np.bincount(kernel_ids[chosen], minlength=n_kernels)
    keep = set(np.flatnonzero(counts).tolist())
    if fallback_valid is not None and fallback_valid.size:
        coverage = fallback_valid.sum(axis=0)
        best = int(np.lexsort((-counts, -coverage))[0])  # most probes valid, then most often kept
        keep.add(best)
    return np.asarray(sorted(keep), dtype=np.int64)


def probe_problems(problems: pd.DataFrame, op: OpDefinition) -> pd.DataFrame:
    """Training problems plus the same problems with every size field + 1 (awkward sizes)."""
    odd = problems.copy()
    for f in op.problem_fields:
        if f.name != "split_k" and f.kind == "int":
            odd[f.name] = odd[f.name] + 1
    return pd.concat([problems, odd], ignore_index=True)


def probe_validity(op: OpDefinition, catalogue: pd.DataFrame, problems: pd.DataFrame, *, arch: Any,
                   dtype: Any, layout: Any) -> np.ndarray:
    """bool ``[n_problems, C]``: which catalogue kernels the op's rules allow on each problem."""
    P, C = len(problems), len(catalogue)
    rows = problems.loc[problems.index.repeat(C)].reset_index(drop=True)
    kern = catalogue.iloc[np.tile(np.arange(C), P)].reset_index(drop=True)
    valid, _ = op.validity(rows, kern, arch=arch, dtype=dtype, layout=layout)
    return np.asarray(valid, dtype=bool).reshape(P, C)


def _kernel_ids(op: OpDefinition, catalogue: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Catalogue id of each table row (by kernel name; a name outside the catalogue is an error)."""
    ids = pd.Series(catalogue["kernel_id"].to_numpy(np.int64), index=catalogue["kernel_name"].to_numpy())
    got = ids.reindex(table["kernel_name"].to_numpy())
    if got.isna().any():
        bad = table["kernel_name"].to_numpy()[got.isna().to_numpy()][:3]
        raise ValueError(f"kernel_name {list(bad)} of the training table is not in the {op.name} catalogue")
    return got.to_numpy(np.int64)


def _among(keys: np.ndarray, wanted: Iterable[Hashable]) -> np.ndarray:
    """bool per key: is it one of ``wanted`` (hashed; np.isin sorts object arrays, seconds per call)."""
    return pd.Series(keys).isin(set(wanted)).to_numpy()


def _table_rows(table: pd.DataFrame, table_keys: np.ndarray, oof: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Positions in ``table`` of the out-of-fold rows ``rows`` (matched by shape and kernel)."""
    index = pd.MultiIndex.from_arrays([table_keys, table["kernel_name"].to_numpy()])
    wanted = pd.MultiIndex.from_arrays([oof["shape"].to_numpy()[rows], oof["kernel_name"].to_numpy()[rows]])
    pos = index.get_indexer(wanted)
    if (pos < 0).any():
        raise ValueError("out-of-fold rows not found in the table: was the run trained on this data?")
    return pos


def keep_for_table(table: pd.DataFrame, op: OpDefinition, *, arch: Any, dtype: Any, layout: Any,
                   top_n: int, shapes: Iterable[Hashable] | None = None) -> np.ndarray:
    """:func:`learn_keep` on a canonical table (optionally only the shapes ``shapes`` of it).

    ``shapes`` are shape keys (values of ``op.shape_keys(table)``); only those shapes' rows and
    problems are looked at (a CV fold's training shapes). None = every shape.
    """
    catalogue = op.catalogue(arch, dtype, layout)
    table = table.reset_index(drop=True)
    keys = np.asarray(op.shape_keys(table))
    codes, _ = pd.factorize(keys)
    rows = np.arange(len(table)) if shapes is None else np.flatnonzero(_among(keys, shapes))
    if not len(rows):
        raise ValueError("no training rows to learn the candidate set from")
    sub = table.iloc[rows].reset_index(drop=True)
    perf = ev.measured_perf(sub["tflops"].to_numpy(), sub["is_valid"].to_numpy())
    valid, _ = op.validity(sub[list(op.problem_names)], sub[list(op.kernel_names)], arch=arch, dtype=dtype,
                           layout=layout)
    problems = sub[list(op.problem_names)].drop_duplicates().reset_index(drop=True)
    probes = probe_validity(op, catalogue, probe_problems(problems, op), arch=arch, dtype=dtype, layout=layout)
    return learn_keep(_kernel_ids(op, catalogue, sub), perf, np.asarray(valid, dtype=bool), codes[rows],
                      len(catalogue), top_n=top_n, fallback_valid=probes)


def candidate_rows(table: pd.DataFrame, op: OpDefinition, keep: np.ndarray, *, arch: Any, dtype: Any,
                   layout: Any) -> np.ndarray:
    """bool per table row: a kept candidate the op's rules allow on the row's problem."""
    out = np.isin(_kernel_ids(op, op.catalogue(arch, dtype, layout), table), keep)
    rows = table.iloc[np.flatnonzero(out)]  # the rules only on the candidates' rows (a few % of them)
    valid, _ = op.validity(rows[list(op.problem_names)], rows[list(op.kernel_names)], arch=arch, dtype=dtype,
                           layout=layout)
    out[out] = np.asarray(valid, dtype=bool)
    return out


#: Trees x learning rate of the default reranker: 70 trees at LightGBM's 0.1. A fixed tree count
#: under-fits a recipe with a smaller rate (at 0.05, 70 trees miss the quality bar on MIOpen's
#: find-db, 140 pass); a fixed product keeps the fit and the selector as small as the rate allows.
RERANKER_TREES_X_RATE = 7.0


def reranker_size(reranker: Mapping[str, Any], model: ModelConfig) -> dict[str, int]:
    """The reranker's ``n_estimators`` and ``num_leaves``: the configured ones, with a null
    ``n_estimators`` resolved to ``round(RERANKER_TREES_X_RATE / model.learning_rate)``."""
    trees = reranker["n_estimators"]
    if trees is None:
        trees = max(1, round(RERANKER_TREES_X_RATE / float(model.learning_rate)))
    return {"n_estimators": int(trees), "num_leaves": int(reranker["num_leaves"])}


def fit_reranker(table: pd.DataFrame, op: OpDefinition, keep: np.ndarray, strategy: Strategy) -> Any:
    """The ``reranked`` strategy's model: ``strategy.recipe``'s pipeline, sized by
    ``strategy.reranker``, fitted on the rows of ``table`` whose kernel is a candidate (``keep``)
    and rule-valid.

    Parameters
    ----------
    table : DataFrame
        Canonical table of the training shapes (rows contiguous per shape, as ``load_table``
        returns them).
    keep : ndarray of int
        The candidate set (:func:`keep_for_table` on the same shapes).
    strategy : Strategy
        Its ``recipe`` (``features``, ``model`` and ``target`` of the run: a train or export
        config), ``reranker`` (``n_estimators`` and ``num_leaves`` replacing the recipe model's,
        :func:`reranker_size`; every other model parameter is the recipe's, early stopping off:
        every training shape is used; one thread), ``seed``, ``arch``, ``dtype`` and ``layout``.

    Returns
    -------
    sklearn.pipeline.Pipeline or None
        Fitted; ``ckpred_target_`` set like ``train``'s pipelines. None when no training shape
        has two candidate rows (one training shape whose winner is the only candidate, as in a
        2-fold CV over two CV groups): there is no choice among candidates to learn, so the
        candidates keep the full model's scores (the ``pruned`` strategy).
    """
    recipe, reranker, layout = strategy.recipe, strategy.reranker, strategy.layout
    if recipe is None or reranker is None:
        raise ValueError("a reranker is fitted with the run's recipe and a size: pass recipe= and reranker=")
    rows = candidate_rows(table, op, keep, arch=strategy.arch, dtype=strategy.dtype, layout=layout)
    sub = table.iloc[np.flatnonzero(rows)]
    codes = pd.factorize(np.asarray(op.shape_keys(sub)))[0]
    if not len(codes) or np.bincount(codes).max() < 2:
        return None
    size = reranker_size(reranker, recipe.model)
    model_cfg = replace(recipe.model, n_estimators=size["n_estimators"], num_leaves=size["num_leaves"],
                        early_stopping_rounds=0,
                        # a few thousand rows fit in a second on one thread;
                        # more OpenMP threads only spin on a busy machine
                        n_jobs=1)
    cfg = Recipe(recipe.features, model_cfg, recipe.target, int(strategy.seed), layout)
    pipe = build_pipeline(cfg, op, strategy.arch, strategy.dtype)
    perf = ev.measured_perf(sub["tflops"].to_numpy(), sub["is_valid"].to_numpy())
    y = training_target(perf, codes, cfg.model, cfg.target)
    return fit_pipeline(pipe, FitRows(op.encode_frame(sub), y, codes), model_cfg=cfg.model,
                        target=target_name(cfg.model, cfg.target))


def strategy_scores(oof: pd.DataFrame, table: pd.DataFrame, op: OpDefinition, strategy: Strategy, *,
                    score: str = "score_model", train_table: pd.DataFrame | None = None,
                    on_fold: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Out-of-fold scores of a strategy on ``train``'s out-of-fold rows, fold by fold.

    Parameters
    ----------
    oof : DataFrame
        ``oof_predictions.parquet`` of a ``train`` run (columns ``shape``, ``fold``,
        ``kernel_name``, ``perf``, ``selectable`` and ``score``).
    table : DataFrame
        The canonical table that run trained on (for the problems of the training shapes).
    strategy : Strategy
        ``top_n`` None = ``full`` (the run's ``score``); else the candidate set of each fold is
        learned from the *other* folds' shapes only (its training shapes), and with a
        ``reranker`` :func:`fit_reranker` on them scores the fold's candidates.
    train_table : DataFrame, optional
        For a run tested on another table (``cv=external``, ``table`` the tested shapes' rows):
        the table it trained on, every fold's training shapes. None: the other folds' shapes.
    on_fold : callable, optional
        Called with the fold's position (0, 1, ...) before its candidates are learned (progress).

    Returns
    -------
    scores : ndarray of float
        Per row of ``oof`` (its index reset): the strategy's score (the run's ``score`` outside
        the candidates).
    allowed : ndarray of bool
        Per row: the kernel is one of the fold's candidates (all True for ``full``).
    candidates : ndarray of int
        Per row: the size of the fold's candidate set.
    """
    catalogue = op.catalogue(strategy.arch, strategy.dtype, strategy.layout)
    oof = oof.reset_index(drop=True)
    kid = _kernel_ids(op, catalogue, oof)
    allowed = np.ones(len(oof), dtype=bool)
    n_cand = np.full(len(oof), len(catalogue))
    fold = oof["fold"].to_numpy()
    scores = oof[score].to_numpy(np.float64).copy()
    if strategy.reranker is not None and strategy.top_n is None:
        raise ValueError("the reranker scores a candidate set: give top_n")
    if strategy.top_n is None:
        return scores, allowed, n_cand
    table = table.reset_index(drop=True)
    table_keys = np.asarray(op.shape_keys(table))
    scored_table, scored_keys = _scored_table(oof, table, table_keys, op, strategy)
    for position, f in enumerate(np.unique(fold)):
        if on_fold is not None:
            on_fold(position)
        # the fold's training shapes: the other folds' (candidates and reranker learned there only)
        fold_train = train_table if train_table is not None else \
            table[_among(table_keys, pd.unique(oof["shape"].to_numpy()[fold != f]))]
        rows = fold == f
        keep = _fold_candidates(fold_train, op, strategy, kid, rows, allowed, n_cand)
        pipe = None if strategy.reranker is None else fit_reranker(fold_train, op, keep, strategy)
        if pipe is not None:  # None: nothing to rerank, the fold's candidates keep the run's scores
            test = np.flatnonzero(rows & allowed)
            test_rows = scored_table.iloc[_table_rows(scored_table, scored_keys, oof, test)]
            scores[test] = pipe.predict(op.encode_frame(test_rows))
    return scores, allowed, n_cand


def _fold_candidates(fold_train: pd.DataFrame, op: OpDefinition, strategy: Strategy, kid: np.ndarray,
                     rows: np.ndarray, allowed: np.ndarray, n_cand: np.ndarray) -> np.ndarray:
    """The candidate set learned from a fold's training shapes; marks the fold's ``rows`` in
    ``allowed`` (their kernel is a candidate) and ``n_cand`` (the set's size)."""
    assert strategy.top_n is not None  # full (no candidate set) returned before the folds
    keep = keep_for_table(fold_train, op, arch=strategy.arch, dtype=strategy.dtype, layout=strategy.layout,
                          top_n=strategy.top_n)
    allowed[rows] = np.isin(kid[rows], keep)
    n_cand[rows] = len(keep)
    return keep


def _scored_table(oof: pd.DataFrame, table: pd.DataFrame, table_keys: np.ndarray, op: OpDefinition,
                  strategy: Strategy) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows the reranker scores and their shape keys: ``table``'s, plus the unmeasured
    candidates' when the run ranked them too."""
    if strategy.reranker is not None and "measured" in oof and not oof["measured"].all():
        # the run ranked unmeasured candidates too (ckpred.fitting.with_unmeasured): their rows
        # come from the same candidate set; the reranker still learns on measured rows only
        combo = Hardware(arch=strategy.arch, dtype=strategy.dtype, layout=strategy.layout)
        scored_table, _ = with_unmeasured(table, op, combo)
        return scored_table, np.asarray(op.shape_keys(scored_table))
    return table, table_keys


def cv_efficiency(oof: pd.DataFrame, table: pd.DataFrame, op: OpDefinition, strategy: Strategy, *,
                  score: str = "score_model", train_table: pd.DataFrame | None = None,
                  scored: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """Per-shape selection metrics of a strategy on ``train``'s out-of-fold predictions.

    The parameters are :func:`strategy_scores`'s; ``scored`` is its result when already
    computed (it is then used as is).

    Returns
    -------
    DataFrame
        :func:`ckpred.evaluate.shape_metrics` of every tested shape plus ``fold`` and ``candidates``.
    """
    oof = oof.reset_index(drop=True)
    if scored is None:
        scored = strategy_scores(oof, table, op, strategy, score=score, train_table=train_table)
    scores, allowed, n_cand = scored
    groups = ev.ShapeGroups.from_keys(oof["shape"].to_numpy())
    measured = oof["measured"].to_numpy(bool) if "measured" in oof else None
    out = ev.shape_metrics(oof["perf"].to_numpy(), scores, groups,
                           oof["selectable"].to_numpy(bool) & allowed, measured)
    first = groups.first_rows()
    out["fold"] = oof["fold"].to_numpy()[first]
    out["candidates"] = n_cand[first]
    return out
