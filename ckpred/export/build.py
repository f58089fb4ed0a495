"""Compile a fitted pipeline into an export directory: selector and scorer ONNX, manifest, parity.

:func:`export_pipeline` writes ``<out_dir>`` with ``model.onnx`` (selector), ``scorer.onnx`` and
``manifest.json`` (see :mod:`ckpred.export.manifest`), atomically. Before anything is written, a
parity check runs sklearn vs the ONNX scorer vs the selector on the given problems: the export
is refused unless the top-1 kernel agrees on every problem and the largest score difference is
within ``max_abs_diff``; the figures go into the manifest.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
import pandas as pd

from ckpred import vocab
from ckpred.errors import ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export.validity import bound_mask, mask_builder_for, with_applicability, with_learned_failures
from ckpred.kernels.base import OpDefinition
from ckpred.models import applicability_model, failure_model, predicted_applicable, predicted_ok
from ckpred.schema import EXPORT_SELECT
from ckpred.transfer import blend

log = logging.getLogger(__name__)

#: Selection strategies ``export.select`` may name (one list, in the config schema).
SELECT_STRATEGIES = EXPORT_SELECT


def export_name(op: str, arch: str, dtype: str, layout: str) -> str:
    """Directory name of an export: ``<op>_<arch>_<dtype>_<layout>``."""
    return f"{op}_{arch}_{dtype}_{layout}"


def node_name(node: Any) -> str:
    """The ``name`` of a config node (or the value itself when it is a plain string)."""
    return str(getattr(node, "name", node))


def _feature_names(pipeline: Any) -> list[str]:
    try:
        return [str(n) for n in pipeline.named_steps["features"].get_feature_names_out()]
    except Exception:  # a hand-built pipeline without names: the manifest says so
        return []


def _model_section(pipeline: Any) -> dict[str, Any]:
    from sklearn.compose import TransformedTargetRegressor

    model = pipeline.steps[-1][1]
    inner = model.regressor_ if isinstance(model, TransformedTargetRegressor) else model
    section: dict[str, Any] = {
        "estimator": type(inner).__name__,
        "wrapper": type(model).__name__ if inner is not model else None,
        "target": getattr(pipeline, "ckpred_target_", None),
        "target_transformer": type(model.transformer_).__name__ if inner is not model else None,
    }
    booster = getattr(inner, "booster_", None)
    if booster is not None:
        section["n_trees"] = int(booster.num_trees())
        section["best_iteration"] = int(getattr(inner, "best_iteration_", 0) or 0)
        params = inner.get_params()
        section["params"] = {k: params[k] for k in ("n_estimators", "learning_rate", "num_leaves", "max_depth",
                                                    "min_child_samples", "objective") if k in params}
    return section


# -- parity --------------------------------------------------------------------------------------
def reference_selection(scores: np.ndarray, valid: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """What the selector must return for one problem: ids, scores, number valid (stable ties)."""
    masked = np.where(valid, scores, -np.inf)
    order = np.argsort(-masked, kind="stable")[: min(top_k, len(masked))]
    return order, masked[order], int(valid.sum())


def parity_check(pipeline: Any, op: OpDefinition, catalogue: pd.DataFrame, problems: pd.DataFrame, *,
                 scorer: onnx.ModelProto, selector: onnx.ModelProto, arch: Any, dtype: Any, layout: Any,
                 top_k: int = 5, batch: int = 8, candidates: np.ndarray | None = None,
                 selector_pipeline: Any = None, transfer: Any = None) -> dict[str, Any]:
    """sklearn pipeline vs ONNX scorer vs selector on ``problems`` x the whole catalogue.

    ``candidates`` (catalogue ids, ``select=pruned|reranked``): the reference selection ranks
    only these, exactly as the pruned selector must. ``selector_pipeline`` (``reranked``): the
    pipeline the selector compiles, when it is not ``pipeline`` (the scorer's). ``transfer``
    (a :class:`ckpred.transfer.TransferModel` whose learner is ``pipeline``): the reference
    selection is the recipe's blend over each problem's valid kernels
    (:func:`ckpred.transfer.blend`).

    Returns
    -------
    dict
        ``shapes``, ``rows``, ``top1_agreement`` (fraction of shapes whose selector top-1 equals
        the sklearn top-1 over valid kernels, and, with an applicability mask, whose fallback flag
        equals the Python one; shapes with no valid kernel count as agreeing when the selector
        also reports none), ``topk_agreement`` (same ids in the same order),
        ``max_abs_diff_scorer`` (sklearn vs scorer, every row), ``max_abs_diff_selector``
        (sklearn vs selector over the returned scores), ``mismatched_shapes`` (first few) and,
        with an applicability mask, ``applicability_fallbacks`` (shapes it left without a kernel).
    """
    scorer_s, selector_s = xo.session(scorer), xo.session(selector)
    kernels = op.encode(catalogue, op.kernel_names)
    C = len(catalogue)
    allowed = np.ones(C, dtype=bool)
    if candidates is not None:
        allowed = np.zeros(C, dtype=bool)
        allowed[np.asarray(candidates, dtype=np.int64)] = True
    top1 = topk = 0
    max_scorer = max_selector = 0.0
    rows_over = 0
    mismatched: list[dict[str, int]] = []
    fallbacks = 0
    flagged = applicability_model(pipeline) is not None
    outputs = ["kernel_ids", "scores", "num_valid"] + ([mf.APPLICABILITY_FALLBACK] if flagged else [])
    probs = problems[list(op.problem_names)].reset_index(drop=True)
    for start in range(0, len(probs), batch):
        chunk = probs.iloc[start:start + batch]
        rows = chunk.loc[chunk.index.repeat(C)].reset_index(drop=True)
        cat_rows = catalogue.iloc[np.tile(np.arange(C), len(chunk))].reset_index(drop=True)
        full = pd.concat([rows, cat_rows.drop(columns=["kernel_id", "kernel_name"])], axis=1)
        X = op.encode_frame(full)
        ref = np.asarray(pipeline.predict(X), dtype=np.float64).ravel()
        ref_sel = ref if selector_pipeline is None else np.asarray(selector_pipeline.predict(X), dtype=np.float64).ravel()
        p = op.encode(chunk, op.problem_names)  # categorical problem fields as their codes
        onx = scorer_s.run(["score"], {"problem": np.repeat(p, C, axis=0), "kernel": np.tile(kernels, (len(chunk), 1))})[0]
        max_scorer = max(max_scorer, float(np.max(np.abs(onx - ref))) if len(ref) else 0.0)
        rows_over += int(np.sum(np.abs(onx - ref) > 1e-6))
        valid, _ = op.validity(full, full, arch=arch, dtype=dtype, layout=layout)
        applies = predicted_applicable(pipeline, X)  # the learned masks (all True without them)
        runs = predicted_ok(pipeline, X)
        static = None
        if transfer is not None:
            named = full.assign(kernel_name=cat_rows["kernel_name"].to_numpy())
            static = transfer.static_scores(named, np.arange(len(named)))
        ids, scores, nvalid, *flag = selector_s.run(outputs, {"problem": p, "top_k": np.array([top_k], dtype=np.int64)})
        for j in range(len(chunk)):
            sl = slice(j * C, (j + 1) * C)
            cand = valid[sl] & allowed
            fell = bool(cand.any() and not (cand & applies[sl]).any())
            if not fell:  # nothing predicted to apply: the rule mask (fallback, flagged)
                cand = cand & applies[sl]
            if (cand & runs[sl]).any():  # nothing predicted to run: the mask before (fallback)
                cand = cand & runs[sl]
            fallbacks += fell
            wanted = ref_sel[sl]
            if static is not None:
                wanted = blend(wanted, static[sl], np.zeros(C, dtype=np.int64), cand, float(transfer.weight))
            r_ids, r_scores, r_n = reference_selection(wanted, cand, top_k)
            n = min(top_k, r_n)
            same_n = int(nvalid[j]) == r_n and (not flagged or bool(flag[0][j]) == fell)
            ok1 = same_n and (r_n == 0 or ids[j, 0] == r_ids[0])
            okk = same_n and np.array_equal(ids[j, :n], r_ids[:n])
            top1 += ok1
            topk += okk
            if n:
                max_selector = max(max_selector, float(np.max(np.abs(scores[j, :n] - wanted[ids[j, :n]]))))
            if not ok1 and len(mismatched) < 10:
                mismatched.append({name: int(v) for name, v in zip(op.problem_names, p[j])})
    shapes = len(probs)
    return {
        "shapes": shapes, "rows": shapes * C,
        "top1_agreement": top1 / shapes if shapes else 1.0,
        "topk_agreement": topk / shapes if shapes else 1.0, "top_k": top_k,
        "max_abs_diff_scorer": max_scorer, "max_abs_diff_selector": max_selector,
        "scorer_rows_over_1e-6": rows_over, "mismatched_shapes": mismatched,
        **({"applicability_fallbacks": fallbacks} if flagged else {}),
    }


# -- export --------------------------------------------------------------------------------------
def export_pipeline(pipeline: Any, *, op: OpDefinition, arch: Any, dtype: Any, layout: Any,
                    out_dir: str | Path, training: Mapping[str, Any], parity_problems: pd.DataFrame | None = None,
                    metrics: Any = None, select: str = "full", max_abs_diff: float = 1e-6,
                    source: Mapping[str, Any] | None = None, candidates: np.ndarray | None = None,
                    selection: Mapping[str, Any] | None = None, reranker: Any = None,
                    autotune: Mapping[str, Any] | None = None, transfer: Any = None) -> dict[str, Any]:
    """Compile ``pipeline`` into ``out_dir`` (selector, scorer, manifest), atomically.

    Parameters
    ----------
    pipeline : sklearn Pipeline
        Fitted; input X = ``op.encode_frame(table)``.
    op, arch, dtype, layout
        The op and the arch/dtype/layout configs (or names) the model was trained for.
    out_dir : path
        The export directory (created or replaced as a whole).
    training : mapping
        The manifest's ``training`` section (see :func:`ckpred.export.manifest.training_section`).
    parity_problems : DataFrame or None
        Problems for the parity check (None = skip it; the manifest then says so).
    metrics : mapping or None
        CV metrics to record.
    select : str
        Selection strategy (``full``: every catalogue kernel scored by the full model;
        ``pruned``: only ``candidates``; ``reranked``: only ``candidates``, scored by
        ``reranker``; see :mod:`ckpred.export.strategies`).
    max_abs_diff : float
        Parity bar on |sklearn - ONNX| scores.
    candidates : ndarray of int or None
        Catalogue ids the ``pruned`` and ``reranked`` selectors score (required for them,
        ignored by ``full``).
    reranker : sklearn Pipeline or None
        ``reranked``: the fitted pipeline the selector compiles (:func:`ckpred.export.strategies.fit_reranker`);
        the scorer always compiles ``pipeline``.
    selection : mapping or None
        How the candidates were learned (recorded in the manifest's ``selection`` section).
    autotune : mapping or None
        The confidence budget's calibration table (:func:`ckpred.autotune.calibration_from_oof`),
        recorded as the manifest's ``autotune`` section (None: the budget is unavailable).
    transfer : TransferModel or None
        The transfer recipe whose learner ``pipeline`` is (features for ``arch``): the selector
        blends the trees' scores with its static order (``select=full`` only); the scorer
        gives the learner's scores. Recorded as the manifest's ``transfer`` section.

    Returns
    -------
    dict
        The manifest written.

    Raises
    ------
    ModelMismatchError
        When the parity check fails (nothing is written then).
    """
    if select not in SELECT_STRATEGIES:
        raise ValueError(f"export.select={select!r} is not implemented; allowed: {list(SELECT_STRATEGIES)}")
    if transfer is not None and select != "full":
        raise ValueError(f"export.select={select!r} with the transfer recipe; allowed: 'full' (the recipe ranks "
                         "every catalogue kernel)")
    catalogue = op.catalogue(arch, dtype, layout)
    t0 = time.perf_counter()
    pipe_onnx = xo.convert_pipeline(pipeline, op)
    scorer = xo.build_scorer(pipe_onnx, op)
    if select == "reranked" and reranker is None:
        raise ValueError("export.select='reranked' needs the fitted reranker pipeline")
    selector_pipe = reranker if select == "reranked" else pipeline
    candidates = _candidate_ids(select, candidates)
    # the op's rules, narrowed by the kernels the model learned not to apply (a table that lists
    # only the applicable ones), then by the failures it learned from the training data
    masks = with_learned_failures(with_applicability(mask_builder_for(op), pipeline), pipeline)
    selector = xo.build_selector(selector_pipe, op, catalogue, mask=bound_mask(masks, op, arch, dtype, layout),
                                 keep=candidates, transfer=transfer)
    convert_s = time.perf_counter() - t0
    parity: dict[str, Any] = {"checked": False}
    if parity_problems is not None and len(parity_problems):
        parity = _checked_parity(pipeline, op, catalogue, parity_problems, scorer=scorer, selector=selector,
                                 arch=arch, dtype=dtype, layout=layout, candidates=candidates,
                                 selector_pipeline=None if selector_pipe is pipeline else selector_pipe,
                                 max_abs_diff=max_abs_diff, transfer=transfer)
    manifest: dict[str, Any] = {
        "format": mf.FORMAT,
        "created_utc": mf.now_utc(),
        "op": op.name, "arch": node_name(arch), "dtype": node_name(dtype), "layout": node_name(layout),
        # the declared op's config: a runtime rebuilds the op from it (a user op is in no package)
        "op_config": op.config_section() if hasattr(op, "config_section") else None,
        # the dtypes and layouts the op's expressions and constants were read with (a user's
        # dtype loads without their config dir)
        "vocabulary": vocab.current().records(),
        "select": select,
        "selection": {"strategy": select, **dict(selection or {}),
                      "candidates": len(catalogue) if candidates is None else int(len(candidates)),
                      "candidate_ids": None if candidates is None else [int(i) for i in candidates]},
        "opset": dict(xo.OPSET), "ir_version": xo.IR_VERSION,
        "graphs": mf.graph_io(op, len(catalogue), flags=[o.name for o in selector.graph.output
                                                          if o.name in mf.SELECTOR_FLAGS]),
        "problem_fields": mf.fields_section(op.problem_fields),
        "kernel_fields": mf.fields_section(op.kernel_fields),
        "catalogue": mf.catalogue_section(op, catalogue),
        "features": _feature_names(pipeline),
        "model": _model_section(pipeline),
        # the learned validity mask inside the selector (None: no failure the features predict)
        "failure_model": None if failure_model(pipeline) is None else {
            "n_trees": int(failure_model(pipeline).booster_.num_trees()),
            "threshold": float(pipeline.ckpred_failure_threshold_)},
        # the learned applicability mask (None: the op's table measures every candidate, op.absence=unknown)
        "applicability_model": None if applicability_model(pipeline) is None else {
            "n_trees": int(applicability_model(pipeline).booster_.num_trees()),
            "threshold": float(pipeline.ckpred_applicability_threshold_)},
        # the selector's model when it is not the scorer's (select=reranked)
        "selector_model": None if selector_pipe is pipeline else _model_section(selector_pipe),
        "training": dict(training),
        "metrics": metrics,
        "autotune": None if autotune is None else dict(autotune),
        # the transfer recipe: the selector's scores blend the model's with this static order
        "transfer": None if transfer is None else transfer_section(transfer, op, catalogue),
        "parity": parity,
        "source": dict(source or {}),
        "convert_seconds": round(convert_s, 2),
        "versions": mf.package_versions(),
    }
    _write_export(out_dir, manifest, selector=selector, scorer=scorer)
    return manifest


def transfer_section(transfer: Any, op: OpDefinition, catalogue: pd.DataFrame) -> dict[str, Any]:
    """The manifest's ``transfer`` section: the blend weight, the training GPUs, the inner split's
    means and the static order aligned with the catalogue (one row per stratum of ``by``, in
    the mixed-radix order of the fields' category codes)."""
    from ckpred.export.blend import static_matrix

    matrix, by, sizes = static_matrix(transfer, op, catalogue)
    return {"recipe": "transfer", "weight": float(transfer.weight), "trained_archs": list(transfer.archs),
            "inner": {f"{w:g}": float(m) for w, m in transfer.inner.items()},
            "static_by": by, "static_strata": sizes,
            "static_order": [[round(float(v), 9) for v in row] for row in matrix],
            "scores": "the selector's: (1 - weight) * p(model) + weight * p(static order), p = rank percentile "
                      "among the problem's valid kernels (weight 0: the model's scores, 1: the static order's); "
                      "the scorer's: the model's"}


def _candidate_ids(select: str, candidates: np.ndarray | None) -> np.ndarray | None:
    """The catalogue ids a ``pruned`` / ``reranked`` selector scores; None for ``full``."""
    if select == "full":
        return None
    if candidates is None:
        raise ValueError(f"export.select={select!r} needs the candidate kernel ids (learned from the training data)")
    return np.asarray(candidates, dtype=np.int64)


def _checked_parity(pipeline: Any, op: OpDefinition, catalogue: pd.DataFrame, problems: pd.DataFrame, *,
                    max_abs_diff: float, **kw: Any) -> dict[str, Any]:
    """The manifest's ``parity`` section of :func:`parity_check` (``kw``: its keyword arguments).

    Raises
    ------
    ModelMismatchError
        When a top-1 choice differs or a score differs by more than ``max_abs_diff``.
    """
    t0 = time.perf_counter()
    parity = {"checked": True, **parity_check(pipeline, op, catalogue, problems, **kw)}
    parity["seconds"] = round(time.perf_counter() - t0, 2)
    parity["max_abs_diff_allowed"] = max_abs_diff
    worst = max(parity["max_abs_diff_scorer"], parity["max_abs_diff_selector"])
    if parity["top1_agreement"] < 1.0 or worst > max_abs_diff:
        raise ModelMismatchError(
            f"ONNX parity check failed, nothing exported: top-1 agreement {parity['top1_agreement']:.4%} "
            f"(need 100%), max |score diff| {worst:.3g} (allowed {max_abs_diff:g}) with "
            f"{parity['scorer_rows_over_1e-6']} of {parity['rows']} scorer rows over 1e-6; first shapes whose top-1 "
            f"differs: {parity['mismatched_shapes']}")
    return parity


def _write_export(out_dir: str | Path, manifest: dict[str, Any], *, selector: Any, scorer: Any) -> None:
    """Embed the manifest in both graphs, record their sha256 and sizes in ``manifest["files"]``
    and write the directory atomically (``manifest.json`` last)."""
    meta = mf.metadata_payload(manifest)
    blobs: dict[str, bytes] = {}
    for model, fname in ((selector, mf.SELECTOR_FILE), (scorer, mf.SCORER_FILE)):
        xo.set_metadata(model, meta)
        blobs[fname] = model.SerializeToString()
    manifest["files"] = {name: {"sha256": mf.sha256_bytes(data), "bytes": len(data)} for name, data in blobs.items()}
    blobs[mf.MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
    mf.write_export_dir(out_dir, blobs)
