"""Selection strategies of the exported selector (``export.select``): what the graph scores.

``full``
    Every catalogue kernel is scored by the full model (:func:`ckpred.export.onnx.build_selector`).
``pruned``
    Only a *candidate set* learned from the training data is scored: the union over training
    shapes of their ``top_n`` fastest rule-valid kernels (measured, not predicted), plus a
    fallback kernel valid for (nearly) every problem so that a problem some catalogue kernel can
    run never ends with no candidate. Kernels that never reached the top ``top_n`` of any
    training shape are the ones that cannot win in the data the model knows; dropping them
    shrinks the tree work by ``C / len(keep)`` (4,608 -> a few hundred on the default data).
    The graph is the ``full`` selector over the kept rows of the catalogue, whose local TopK
    indices are mapped back to catalogue ids with a ``Gather``; its Python counterpart is
    ``pipeline.predict`` on the same rows (:func:`reference_scores`).

Quality is measured under the same shape-grouped CV as ``train``: the candidate set is learned
from each fold's training shapes only (:func:`learn_keep`) and applied to the fold's test shapes
(:func:`cv_efficiency`; ``scripts/bench_select.py`` prints it next to the latency).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pandas as pd

from ckpred.export import onnx as xo
from ckpred.kernels.base import OpDefinition


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


def build_pruned_selector(pipeline: Any, op: OpDefinition, catalogue: pd.DataFrame, keep: np.ndarray, *,
                          arch: Any, dtype: Any, layout: Any, mask_builder: xo.MaskBuilder) -> onnx.ModelProto:
    """The selector graph (same inputs/outputs as ``full``) scoring only catalogue rows ``keep``.

    ``num_valid`` counts the valid *candidates* (kept kernels), so ``min(top_k, num_valid)`` is
    still the number of real choices.
    """
    keep = np.asarray(keep, dtype=np.int64)
    C = len(catalogue)
    if not len(keep) or keep.min() < 0 or keep.max() >= C or len(np.unique(keep)) != len(keep):
        raise ValueError(f"keep must be distinct catalogue ids in [0, {C}), got {len(keep)} ids")
    return xo.build_selector(pipeline, op, catalogue, arch=arch, dtype=dtype, layout=layout,
                             mask_builder=mask_builder, keep=keep)


def _kernel_ids(op: OpDefinition, catalogue: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Catalogue id of each table row (by kernel name; a name outside the catalogue is an error)."""
    ids = pd.Series(catalogue["kernel_id"].to_numpy(np.int64), index=catalogue["kernel_name"].to_numpy())
    got = ids.reindex(table["kernel_name"].to_numpy())
    if got.isna().any():
        bad = table["kernel_name"].to_numpy()[got.isna().to_numpy()][:3]
        raise ValueError(f"kernel_name {list(bad)} of the training table is not in the {op.name} catalogue")
    return got.to_numpy(np.int64)


def keep_for_table(table: pd.DataFrame, op: OpDefinition, *, arch: Any, dtype: Any, layout: Any,
                   top_n: int, shapes: Any = None) -> np.ndarray:
    """:func:`learn_keep` on a canonical table (optionally only the shapes ``shapes`` of it).

    ``shapes`` are shape keys (values of ``op.shape_keys(table)``); only those shapes' rows and
    problems are looked at (a CV fold's training shapes). None = every shape.
    """
    from ckpred.evaluate import measured_perf

    catalogue = op.catalogue(arch, dtype, layout)
    table = table.reset_index(drop=True)
    keys = np.asarray(op.shape_keys(table))
    codes, _ = pd.factorize(keys)
    rows = np.arange(len(table)) if shapes is None else np.flatnonzero(np.isin(keys, np.asarray(list(shapes))))
    if not len(rows):
        raise ValueError("no training rows to learn the candidate set from")
    sub = table.iloc[rows].reset_index(drop=True)
    perf = measured_perf(sub["tflops"].to_numpy(), sub["is_valid"].to_numpy())
    valid, _ = op.validity(sub[list(op.problem_names)], sub[list(op.kernel_names)], arch=arch, dtype=dtype,
                           layout=layout)
    problems = sub[list(op.problem_names)].drop_duplicates().reset_index(drop=True)
    probes = probe_validity(op, catalogue, probe_problems(problems, op), arch=arch, dtype=dtype, layout=layout)
    return learn_keep(_kernel_ids(op, catalogue, sub), perf, np.asarray(valid, dtype=bool), codes[rows],
                      len(catalogue), top_n=top_n, fallback_valid=probes)


def cv_efficiency(oof: pd.DataFrame, table: pd.DataFrame, op: OpDefinition, *, arch: Any, dtype: Any,
                  layout: Any, top_n: int | None, score: str = "score_model") -> pd.DataFrame:
    """Per-shape selection metrics of a strategy on ``train``'s out-of-fold predictions.

    Parameters
    ----------
    oof : DataFrame
        ``oof_predictions.parquet`` of a ``train`` run (columns ``shape``, ``fold``,
        ``kernel_name``, ``perf``, ``selectable`` and ``score``).
    table : DataFrame
        The canonical table that run trained on (for the problems of the training shapes).
    top_n : int or None
        ``None`` = ``full`` (every kernel); else ``pruned`` with this ``top_n``, the candidate
        set learned for each fold from the *other* folds' shapes only (its training shapes).

    Returns
    -------
    DataFrame
        :func:`ckpred.evaluate.shape_metrics` of every tested shape plus ``fold`` and ``candidates``.
    """
    from ckpred import evaluate as ev

    catalogue = op.catalogue(arch, dtype, layout)
    oof = oof.reset_index(drop=True)
    kid = _kernel_ids(op, catalogue, oof)
    allowed = np.ones(len(oof), dtype=bool)
    n_cand = np.full(len(oof), len(catalogue))
    fold = oof["fold"].to_numpy()
    if top_n is not None:
        for f in np.unique(fold):
            train_keys = pd.unique(oof["shape"].to_numpy()[fold != f])
            keep = keep_for_table(table, op, arch=arch, dtype=dtype, layout=layout, top_n=top_n, shapes=train_keys)
            rows = fold == f
            allowed[rows] = np.isin(kid[rows], keep)
            n_cand[rows] = len(keep)
    groups = ev.ShapeGroups.from_keys(oof["shape"].to_numpy())
    out = ev.shape_metrics(oof["perf"].to_numpy(), oof[score].to_numpy(), groups,
                           oof["selectable"].to_numpy(bool) & allowed)
    first = groups.first_rows()
    out["fold"] = fold[first]
    out["candidates"] = n_cand[first]
    return out
