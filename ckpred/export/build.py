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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
import pandas as pd
from sklearn.compose import TransformedTargetRegressor
from sklearn.pipeline import Pipeline

from ckpred import vocab
from ckpred.errors import ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export.blend import static_matrix
from ckpred.export.validity import (bound_mask, mask_builder_for, with_applicability, with_kernel_list,
                                    with_learned_failures)
from ckpred.kernels.base import OpDefinition
from ckpred.kernels.lists import check_catalogue, validity_on
from ckpred.models import (FLOOR, absent_estimate, applicability_model, expected_throughput, failure_model,
                           predicted_applicable, predicted_ok)
from ckpred.schema import EXPORT_SELECT
from ckpred.transfer import TransferModel, blend

log = logging.getLogger(__name__)

#: Selection strategies ``export.select`` may name (one list, in the config schema).
SELECT_STRATEGIES = EXPORT_SELECT


def node_name(node: object) -> str:
    """The ``name`` of a config node (or the value itself when it is a plain string)."""
    return str(getattr(node, "name", node))


def _feature_names(pipeline: Pipeline) -> list[str]:
    try:
        return [str(n) for n in pipeline.named_steps["features"].get_feature_names_out()]
    except Exception:  # a hand-built pipeline without names: the manifest says so
        return []


def _model_section(pipeline: Pipeline) -> dict[str, Any]:
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


@dataclass(frozen=True, eq=False)
class Graphs:
    """The two compiled graphs of an export and what the selector's was compiled from.

    Attributes
    ----------
    scorer, selector : onnx.ModelProto
    candidates : ndarray of int or None
        Catalogue ids the selector ranks (``select=pruned|reranked``); None = all of them.
    selector_pipeline : sklearn Pipeline or None
        The pipeline the selector compiles when it is not the scorer's (``reranked``).
    transfer : TransferModel or None
        The transfer recipe whose static order the selector blends in.
    """

    scorer: onnx.ModelProto
    selector: onnx.ModelProto
    candidates: np.ndarray | None = None
    selector_pipeline: Pipeline | None = None
    transfer: TransferModel | None = None


@dataclass(frozen=True, eq=False)
class ParityCheck:
    """How :func:`parity_check` checks: on which problems, against which bar, ``top_k`` ids
    compared per problem, ``batch`` problems per selector call."""

    problems: pd.DataFrame
    max_abs_diff: float = 1e-6
    top_k: int = 5
    batch: int = 8


def parity_check(pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, graphs: Graphs,
                 check: ParityCheck, *, arch: Any, dtype: Any, layout: Any) -> dict[str, Any]:
    """sklearn pipeline vs ONNX scorer vs selector on ``check.problems`` x the whole catalogue.

    With ``graphs.candidates`` (``select=pruned|reranked``) the reference selection ranks only
    these, exactly as the pruned selector must; with ``graphs.selector_pipeline`` (``reranked``)
    it ranks that pipeline's scores; with ``graphs.transfer`` (a
    :class:`ckpred.transfer.TransferModel` whose learner is ``pipeline``) it is the recipe's blend
    over each problem's valid kernels (:func:`ckpred.transfer.blend`).

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
    run = _ParityRun.start(pipeline, op, catalogue, graphs, check, (arch, dtype, layout))
    tally = _Tally()
    probs = check.problems[list(op.problem_names)].reset_index(drop=True)
    for start in range(0, len(probs), check.batch):
        run.batch(probs.iloc[start:start + check.batch], tally)
    shapes = len(probs)
    return {
        "shapes": shapes, "rows": shapes * len(catalogue),
        "top1_agreement": tally.top1 / shapes if shapes else 1.0,
        "topk_agreement": tally.topk / shapes if shapes else 1.0, "top_k": check.top_k,
        "max_abs_diff_scorer": tally.max_scorer, "max_abs_diff_selector": tally.max_selector,
        "scorer_rows_over_1e-6": tally.rows_over, "mismatched_shapes": tally.mismatched,
        **({"applicability_fallbacks": tally.fallbacks} if run.flagged else {}),
    }


@dataclass
class _Tally:
    """:func:`parity_check`'s running counts."""

    top1: int = 0
    topk: int = 0
    max_scorer: float = 0.0
    max_selector: float = 0.0
    rows_over: int = 0
    mismatched: list[dict[str, int]] = field(default_factory=list)
    fallbacks: int = 0


@dataclass(frozen=True, eq=False)
class _ParityRun:
    """What :func:`parity_check` holds fixed over its batches of problems."""

    pipeline: Pipeline
    op: OpDefinition
    catalogue: pd.DataFrame
    graphs: Graphs
    check: ParityCheck
    combo: tuple[Any, Any, Any]  # arch, dtype, layout
    sessions: tuple[Any, Any]  # scorer, selector (onnxruntime)
    kernels: np.ndarray
    allowed: np.ndarray
    flagged: bool

    @classmethod
    def start(cls, pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, graphs: Graphs,
              check: ParityCheck, combo: tuple[Any, Any, Any]) -> _ParityRun:
        sessions = xo.session(graphs.scorer), xo.session(graphs.selector)
        kernels = op.encode(catalogue, op.kernel_names)
        C = len(catalogue)
        allowed = np.ones(C, dtype=bool)
        if graphs.candidates is not None:
            allowed = np.zeros(C, dtype=bool)
            allowed[np.asarray(graphs.candidates, dtype=np.int64)] = True
        flagged = applicability_model(pipeline) is not None
        return cls(pipeline, op, catalogue, graphs, check, combo, sessions, kernels, allowed, flagged)

    def batch(self, chunk: pd.DataFrame, tally: _Tally) -> None:
        """Score ``chunk``'s problems x the catalogue three ways and count into ``tally``."""
        op, C, graphs = self.op, len(self.catalogue), self.graphs
        arch, dtype, layout = self.combo
        rows = chunk.loc[chunk.index.repeat(C)].reset_index(drop=True)
        cat_rows = self.catalogue.iloc[np.tile(np.arange(C), len(chunk))].reset_index(drop=True)
        full = pd.concat([rows, cat_rows.drop(columns=["kernel_id", "kernel_name"])], axis=1)
        X = op.encode_frame(full)
        ref = np.asarray(self.pipeline.predict(X), dtype=np.float64).ravel()
        ref_sel = ref if graphs.selector_pipeline is None else \
            np.asarray(graphs.selector_pipeline.predict(X), dtype=np.float64).ravel()
        if graphs.transfer is not None and applicability_model(self.pipeline) is not None:
            # the recipe's learner under a mask: its expected throughput
            ref_sel = expected_throughput(ref, absent_estimate(self.pipeline, X))
        p = op.encode(chunk, op.problem_names)  # categorical problem fields as their codes
        onx = self.sessions[0].run(["score"], {"problem": np.repeat(p, C, axis=0),
                                               "kernel": np.tile(self.kernels, (len(chunk), 1))})[0]
        tally.max_scorer = max(tally.max_scorer, float(np.max(np.abs(onx - ref))) if len(ref) else 0.0)
        tally.rows_over += int(np.sum(np.abs(onx - ref) > 1e-6))
        valid, _ = validity_on(op, full, full, arch=arch, dtype=dtype, layout=layout)
        applies = predicted_applicable(self.pipeline, X)  # the learned masks (all True without them)
        runs = predicted_ok(self.pipeline, X)
        static = None
        if graphs.transfer is not None:
            named = full.assign(kernel_name=cat_rows["kernel_name"].to_numpy())
            static = graphs.transfer.static_scores(named, np.arange(len(named)))
        outputs = ["kernel_ids", "scores", "num_valid"] + ([mf.APPLICABILITY_FALLBACK] if self.flagged else [])
        got = self.sessions[1].run(outputs, {"problem": p, "top_k": np.array([self.check.top_k], dtype=np.int64)})
        for j in range(len(chunk)):
            sl = slice(j * C, (j + 1) * C)
            wanted = ref_sel[sl]
            cand, fell = self._candidates(valid[sl], applies[sl], runs[sl])
            if static is not None:
                assert graphs.transfer is not None
                wanted = blend(wanted, static[sl], np.zeros(C, dtype=np.int64), cand, float(graphs.transfer.weight))
            self._compare(got, j, wanted, cand, fell, tally, p[j])

    def _candidates(self, valid: np.ndarray, applies: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, bool]:
        """The kernels the Python selection ranks for one problem, and whether the applicability
        mask fell back (left none)."""
        cand = valid & self.allowed
        fell = bool(cand.any() and not (cand & applies).any())
        if not fell:  # nothing predicted to apply: the rule mask (fallback, flagged)
            cand = cand & applies
        if (cand & runs).any():  # nothing predicted to run: the mask before (fallback)
            cand = cand & runs
        return cand, fell

    def _compare(self, got: list[np.ndarray], j: int, wanted: np.ndarray, cand: np.ndarray, fell: bool,
                 tally: _Tally, problem: np.ndarray) -> None:
        """Count problem ``j`` of the selector's outputs ``got`` against the Python selection."""
        ids, scores, nvalid, *flag = got
        top_k = self.check.top_k
        tally.fallbacks += fell
        r_ids, r_scores, r_n = reference_selection(wanted, cand, top_k)
        n = min(top_k, r_n)
        same_n = int(nvalid[j]) == r_n and (not self.flagged or bool(flag[0][j]) == fell)
        ok1 = same_n and (r_n == 0 or ids[j, 0] == r_ids[0])
        okk = same_n and np.array_equal(ids[j, :n], r_ids[:n])
        tally.top1 += ok1
        tally.topk += okk
        if n:
            tally.max_selector = max(tally.max_selector, float(np.max(np.abs(scores[j, :n] - wanted[ids[j, :n]]))))
        if not ok1 and len(tally.mismatched) < 10:
            tally.mismatched.append({name: int(v) for name, v in zip(self.op.problem_names, problem)})


# -- export --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ExportOptions:
    """What :func:`export_pipeline` compiles and records besides the pipeline (all optional).

    Attributes
    ----------
    parity_problems : DataFrame or None
        Problems for the parity check (None = skip it; the manifest then says so).
    max_abs_diff : float
        Parity bar on |sklearn - ONNX| scores.
    select : str
        Selection strategy (``full``: every catalogue kernel scored by the full model;
        ``pruned``: only ``candidates``; ``reranked``: only ``candidates``, scored by
        ``reranker``; see :mod:`ckpred.export.strategies`).
    candidates : ndarray of int or None
        Catalogue ids the ``pruned`` and ``reranked`` selectors score (required for them,
        ignored by ``full``).
    reranker : sklearn Pipeline or None
        ``reranked``: the fitted pipeline the selector compiles (:func:`ckpred.export.strategies.fit_reranker`);
        the scorer always compiles the export's pipeline.
    selection : mapping or None
        How the candidates were learned (recorded in the manifest's ``selection`` section).
    transfer : TransferModel or None
        The transfer recipe whose learner the pipeline is (features for ``arch``): the selector
        blends the trees' scores with its static order (``select=full`` only); the scorer
        gives the learner's scores. Recorded as the manifest's ``transfer`` section.
    metrics : mapping or None
        CV metrics to record.
    source : mapping or None
        Where the pipeline came from (the manifest's ``source`` section).
    autotune : mapping or None
        The confidence budget's calibration table (:func:`ckpred.autotune.calibration_from_oof`),
        recorded as the manifest's ``autotune`` section (None: the budget is unavailable).
    """

    parity_problems: pd.DataFrame | None = None
    max_abs_diff: float = 1e-6
    select: str = "full"
    candidates: np.ndarray | None = None
    reranker: Pipeline | None = None
    selection: Mapping[str, Any] | None = None
    transfer: TransferModel | None = None
    metrics: Mapping[str, Any] | None = None
    source: Mapping[str, Any] | None = None
    autotune: Mapping[str, Any] | None = None


def export_pipeline(pipeline: Pipeline, *, op: OpDefinition, arch: Any, dtype: Any, layout: Any,
                    out_dir: str | Path, training: Mapping[str, Any],
                    options: ExportOptions = ExportOptions()) -> dict[str, Any]:
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
    options : ExportOptions
        Selection strategy, parity check and what else the manifest records.

    Returns
    -------
    dict
        The manifest written.

    Raises
    ------
    ModelMismatchError
        When the parity check fails (nothing is written then).
    ckpred.errors.InputFileError
        When ``arch``'s kernel list for the op cannot be read or names no catalogue kernel
        (:func:`ckpred.kernels.lists.check_catalogue`).
    """
    _check_select(options)
    transfer = options.transfer
    catalogue = op.catalogue(arch, dtype, layout)
    listed = check_catalogue(arch, op, catalogue)  # the arch's kernel list, where it has one
    t0 = time.perf_counter()
    graphs = _compile(pipeline, op, catalogue, (arch, dtype, layout), options)
    convert_s = time.perf_counter() - t0
    parity = _parity_section(pipeline, op, catalogue, graphs, options, (arch, dtype, layout))
    manifest: dict[str, Any] = {
        "format": mf.FORMAT,
        "created_utc": mf.now_utc(),
        **_identity_section(op, arch, dtype, layout),
        **_graph_sections(op, catalogue, graphs, options),
        **_model_sections(pipeline, pipeline if graphs.selector_pipeline is None else graphs.selector_pipeline),
        "training": dict(training),
        "metrics": options.metrics,
        "autotune": None if options.autotune is None else dict(options.autotune),
        # the transfer recipe: the selector's scores blend the model's with this static order
        "transfer": None if transfer is None else transfer_section(transfer, op, catalogue),
        "parity": parity,
        "source": dict(options.source or {}),
        "convert_seconds": round(convert_s, 2),
        "versions": mf.package_versions(),
    }
    if listed is not None:  # the selector's mask holds the arch's list (export.validity.with_kernel_list)
        manifest["selection"]["kernel_list"] = listed.record(catalogue, op)
    _write_export(out_dir, manifest, selector=graphs.selector, scorer=graphs.scorer)
    return manifest


def _identity_section(op: OpDefinition, arch: Any, dtype: Any, layout: Any) -> dict[str, Any]:
    """What the model was trained for: the manifest keys a loader checks before it runs."""
    return {
        "op": op.name, "arch": node_name(arch), "dtype": node_name(dtype), "layout": node_name(layout),
        # the declared op's config: a runtime rebuilds the op from it (a user op is in no package)
        "op_config": op.config_section() if hasattr(op, "config_section") else None,
        # the dtypes and layouts the op's expressions and constants were read with (a user's
        # dtype loads without their config dir)
        "vocabulary": vocab.current().records(),
    }


def _check_select(options: ExportOptions) -> None:
    """Refuse a ``select`` that is not a strategy, or not ``full`` with the transfer recipe."""
    select = options.select
    if select not in SELECT_STRATEGIES:
        raise ValueError(f"export.select={select!r} is not implemented; allowed: {list(SELECT_STRATEGIES)}")
    if options.transfer is not None and select != "full":
        raise ValueError(f"export.select={select!r} with the transfer recipe; allowed: 'full' (the recipe ranks "
                         "every catalogue kernel)")


def _compile(pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, combo: tuple[Any, Any, Any],
             options: ExportOptions) -> Graphs:
    """The scorer and selector graphs of :func:`export_pipeline`."""
    select = options.select
    pipe_onnx = xo.convert_pipeline(pipeline, op)
    scorer = xo.build_scorer(pipe_onnx, op)
    if select == "reranked" and options.reranker is None:
        raise ValueError("export.select='reranked' needs the fitted reranker pipeline")
    selector_pipe = options.reranker if select == "reranked" else pipeline
    candidates = _candidate_ids(select, options.candidates)
    # the op's rules, narrowed by the kernels the model learned not to apply (a table that lists
    # only the applicable ones), then by the failures it learned from the training data
    masks = with_learned_failures(with_applicability(with_kernel_list(mask_builder_for(op)), pipeline), pipeline)
    selector = xo.build_selector(selector_pipe, op, catalogue, mask=bound_mask(masks, op, *combo),
                                 keep=candidates, transfer=options.transfer)
    return Graphs(scorer, selector, candidates=candidates,
                  selector_pipeline=None if selector_pipe is pipeline else selector_pipe, transfer=options.transfer)


def _parity_section(pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, graphs: Graphs,
                    options: ExportOptions, combo: tuple[Any, Any, Any]) -> dict[str, Any]:
    """The manifest's ``parity`` section: :func:`_checked_parity` on ``options.parity_problems``
    (``checked`` false without them)."""
    if options.parity_problems is None or not len(options.parity_problems):
        return {"checked": False}
    arch, dtype, layout = combo
    return _checked_parity(pipeline, op, catalogue, graphs,
                           ParityCheck(options.parity_problems, max_abs_diff=options.max_abs_diff),
                           arch=arch, dtype=dtype, layout=layout)


def _graph_sections(op: OpDefinition, catalogue: pd.DataFrame, graphs: Graphs,
                    options: ExportOptions) -> dict[str, Any]:
    """The manifest's sections from ``select`` to ``catalogue``: the strategy and the graphs' I/O."""
    candidates = graphs.candidates
    return {
        "select": options.select,
        "selection": {"strategy": options.select, **dict(options.selection or {}),
                      "candidates": len(catalogue) if candidates is None else int(len(candidates)),
                      "candidate_ids": None if candidates is None else [int(i) for i in candidates]},
        "opset": dict(xo.OPSET), "ir_version": xo.IR_VERSION,
        "graphs": mf.graph_io(op, len(catalogue), flags=[o.name for o in graphs.selector.graph.output
                                                          if o.name in mf.SELECTOR_FLAGS]),
        "problem_fields": mf.fields_section(op.problem_fields),
        "kernel_fields": mf.fields_section(op.kernel_fields),
        "catalogue": mf.catalogue_section(op, catalogue),
    }


def _model_sections(pipeline: Pipeline, selector_pipe: Pipeline) -> dict[str, Any]:
    """The manifest's sections from ``features`` to ``selector_model``: what the graphs compile."""
    failures, applicability = failure_model(pipeline), applicability_model(pipeline)
    return {
        "features": _feature_names(pipeline),
        "model": _model_section(pipeline),
        # the learned validity mask inside the selector (None: no failure the features predict)
        "failure_model": None if failures is None else {
            "n_trees": int(failures.booster_.num_trees()),
            "threshold": float(pipeline.ckpred_failure_threshold_)},
        # the learned applicability mask (None: the op's table measures every candidate, op.absence=unknown)
        "applicability_model": None if applicability is None else {
            "n_trees": int(applicability.booster_.num_trees()),
            "threshold": float(pipeline.ckpred_applicability_threshold_)},
        # the selector's model when it is not the scorer's (select=reranked)
        "selector_model": None if selector_pipe is pipeline else _model_section(selector_pipe),
    }


def transfer_section(transfer: TransferModel, op: OpDefinition, catalogue: pd.DataFrame) -> dict[str, Any]:
    """The manifest's ``transfer`` section: the blend weight, the training GPUs, the inner split's
    means and the static order aligned with the catalogue (one row per stratum of ``by``, in
    the mixed-radix order of the fields' category codes)."""
    matrix, by, sizes = static_matrix(transfer, op, catalogue)
    return {"recipe": "transfer", "weight": float(transfer.weight), "trained_archs": list(transfer.archs),
            "inner": {f"{w:g}": float(m) for w, m in transfer.inner.items()},
            "static_by": by, "static_strata": sizes,
            "static_order": [[round(float(v), 9) for v in row] for row in matrix],
            "scores": "the selector's: (1 - weight) * p(model) + weight * p(static order), p = rank percentile "
                      "among the problem's valid kernels (weight 0: the model's scores, 1: the static order's); "
                      "the scorer's: the model's",
            # with an applicability mask the selector's model scores are expected throughput
            "model_scores": "expected throughput: max(score, floor) * clip(1 - applicability estimate, floor, 1)"
                            if applicability_model(transfer.learner) is not None else "the scorer's",
            "floor": FLOOR}


def _candidate_ids(select: str, candidates: np.ndarray | None) -> np.ndarray | None:
    """The catalogue ids a ``pruned`` / ``reranked`` selector scores; None for ``full``."""
    if select == "full":
        return None
    if candidates is None:
        raise ValueError(f"export.select={select!r} needs the candidate kernel ids (learned from the training data)")
    return np.asarray(candidates, dtype=np.int64)


def _checked_parity(pipeline: Pipeline, op: OpDefinition, catalogue: pd.DataFrame, graphs: Graphs,
                    check: ParityCheck, *, arch: Any, dtype: Any, layout: Any) -> dict[str, Any]:
    """The manifest's ``parity`` section of :func:`parity_check` (the parameters are its).

    Raises
    ------
    ModelMismatchError
        When a top-1 choice differs or a score differs by more than ``check.max_abs_diff``.
    """
    max_abs_diff = check.max_abs_diff
    t0 = time.perf_counter()
    parity = {"checked": True, **parity_check(pipeline, op, catalogue, graphs, check, arch=arch, dtype=dtype,
                                              layout=layout)}
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


def _write_export(out_dir: str | Path, manifest: dict[str, Any], *, selector: onnx.ModelProto,
                  scorer: onnx.ModelProto) -> None:
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
