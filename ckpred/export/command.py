"""``python -m ckpred export``: fit (or take) the final pipeline and compile it to ONNX.

Two sources of the pipeline:

* default: fit the config's ``features -> model`` pipeline on all rows of the config's data
  (``rows.*`` picks the training rows like ``train`` does);
* ``run_dir=<train run>``: the finished run's ``pipeline.joblib``; its ``manifest.json``
  (metrics, data hash) and the run's ``.hydra/config.yaml`` (to recover the training data
  and its problem ranges) are read too, and arch/dtype/layout/op must match this config.

Output: ``<out_dir>/<op>_<arch>_<dtype>_<layout>/`` with ``model.onnx`` (selector),
``scorer.onnx`` and ``manifest.json`` (see :mod:`ckpred.export.manifest`), written atomically.
Before anything is written, a parity check runs sklearn vs the ONNX scorer vs the selector on
the training shapes (or ``parity.shapes`` of them): the export is refused unless the top-1
kernel agrees on every shape and the largest score difference is within ``parity.max_abs_diff``;
the figures go into the manifest.
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

from ckpred.errors import ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export.validity import mask_builder_for
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.schema import EXPORT_SELECT

log = logging.getLogger(__name__)

#: Selection strategies ``export.select`` may name (one list, in the config schema).
SELECT_STRATEGIES = EXPORT_SELECT


def export_name(op: str, arch: str, dtype: str, layout: str) -> str:
    """Directory name of an export: ``<op>_<arch>_<dtype>_<layout>``."""
    return f"{op}_{arch}_{dtype}_{layout}"


def _name(node: Any) -> str:
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
                 selector_pipeline: Any = None) -> dict[str, Any]:
    """sklearn pipeline vs ONNX scorer vs selector on ``problems`` x the whole catalogue.

    ``candidates`` (catalogue ids, ``select=pruned|reranked``): the reference selection ranks
    only these, exactly as the pruned selector must. ``selector_pipeline`` (``reranked``): the
    pipeline the selector compiles, when it is not ``pipeline`` (the scorer's).

    Returns
    -------
    dict
        ``shapes``, ``rows``, ``top1_agreement`` (fraction of shapes whose selector top-1 equals
        the sklearn top-1 over valid kernels; shapes with no valid kernel count as agreeing when
        the selector also reports none), ``topk_agreement`` (same ids in the same order),
        ``max_abs_diff_scorer`` (sklearn vs scorer, every row), ``max_abs_diff_selector``
        (sklearn vs selector over the returned scores), ``mismatched_shapes`` (first few).
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
    probs = problems[list(op.problem_names)].reset_index(drop=True)
    for start in range(0, len(probs), batch):
        chunk = probs.iloc[start:start + batch]
        rows = chunk.loc[chunk.index.repeat(C)].reset_index(drop=True)
        cat_rows = catalogue.iloc[np.tile(np.arange(C), len(chunk))].reset_index(drop=True)
        full = pd.concat([rows, cat_rows.drop(columns=["kernel_id", "kernel_name"])], axis=1)
        X = op.encode_frame(full)
        ref = np.asarray(pipeline.predict(X), dtype=np.float64).ravel()
        ref_sel = ref if selector_pipeline is None else np.asarray(selector_pipeline.predict(X), dtype=np.float64).ravel()
        p = chunk.to_numpy(np.int64)
        onx = scorer_s.run(["score"], {"problem": np.repeat(p, C, axis=0), "kernel": np.tile(kernels, (len(chunk), 1))})[0]
        max_scorer = max(max_scorer, float(np.max(np.abs(onx - ref))) if len(ref) else 0.0)
        rows_over += int(np.sum(np.abs(onx - ref) > 1e-6))
        valid, _ = op.validity(full, full, arch=arch, dtype=dtype, layout=layout)
        ids, scores, nvalid = selector_s.run(["kernel_ids", "scores", "num_valid"],
                                             {"problem": p, "top_k": np.array([top_k], dtype=np.int64)})
        for j in range(len(chunk)):
            sl = slice(j * C, (j + 1) * C)
            r_ids, r_scores, r_n = reference_selection(ref_sel[sl], valid[sl] & allowed, top_k)
            n = min(top_k, r_n)
            same_n = int(nvalid[j]) == r_n
            ok1 = same_n and (r_n == 0 or ids[j, 0] == r_ids[0])
            okk = same_n and np.array_equal(ids[j, :n], r_ids[:n])
            top1 += ok1
            topk += okk
            if n:
                max_selector = max(max_selector, float(np.max(np.abs(scores[j, :n] - ref_sel[sl][ids[j, :n]]))))
            if not ok1 and len(mismatched) < 10:
                mismatched.append({name: int(v) for name, v in zip(op.problem_names, p[j])})
    shapes = len(probs)
    return {
        "shapes": shapes, "rows": shapes * C,
        "top1_agreement": top1 / shapes if shapes else 1.0,
        "topk_agreement": topk / shapes if shapes else 1.0, "top_k": top_k,
        "max_abs_diff_scorer": max_scorer, "max_abs_diff_selector": max_selector,
        "scorer_rows_over_1e-6": rows_over, "mismatched_shapes": mismatched,
    }


# -- export --------------------------------------------------------------------------------------
def export_pipeline(pipeline: Any, *, op: OpDefinition, arch: Any, dtype: Any, layout: Any,
                    out_dir: str | Path, training: Mapping[str, Any], parity_problems: pd.DataFrame | None = None,
                    metrics: Any = None, select: str = "full", max_abs_diff: float = 1e-6,
                    source: Mapping[str, Any] | None = None, candidates: np.ndarray | None = None,
                    selection: Mapping[str, Any] | None = None, reranker: Any = None) -> dict[str, Any]:
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
    catalogue = op.catalogue(arch, dtype, layout)
    t0 = time.perf_counter()
    pipe_onnx = xo.convert_pipeline(pipeline, op)
    scorer = xo.build_scorer(pipe_onnx, op)
    if select == "reranked" and reranker is None:
        raise ValueError("export.select='reranked' needs the fitted reranker pipeline")
    selector_pipe = reranker if select == "reranked" else pipeline
    if select == "full":
        candidates = None
    elif candidates is None:
        raise ValueError(f"export.select={select!r} needs the candidate kernel ids (learned from the training data)")
    else:
        candidates = np.asarray(candidates, dtype=np.int64)
    selector = xo.build_selector(selector_pipe, op, catalogue, arch=arch, dtype=dtype, layout=layout,
                                 mask_builder=mask_builder_for(op), keep=candidates)
    convert_s = time.perf_counter() - t0
    parity: dict[str, Any] = {"checked": False}
    if parity_problems is not None and len(parity_problems):
        t0 = time.perf_counter()
        parity = {"checked": True, **parity_check(pipeline, op, catalogue, parity_problems, scorer=scorer,
                                                 selector=selector, arch=arch, dtype=dtype, layout=layout,
                                                 candidates=candidates,
                                                 selector_pipeline=None if selector_pipe is pipeline else selector_pipe)}
        parity["seconds"] = round(time.perf_counter() - t0, 2)
        parity["max_abs_diff_allowed"] = max_abs_diff
        worst = max(parity["max_abs_diff_scorer"], parity["max_abs_diff_selector"])
        if parity["top1_agreement"] < 1.0 or worst > max_abs_diff:
            raise ModelMismatchError(
                f"ONNX parity check failed, nothing exported: top-1 agreement {parity['top1_agreement']:.4%} "
                f"(need 100%), max |score diff| {worst:.3g} (allowed {max_abs_diff:g}) with "
                f"{parity['scorer_rows_over_1e-6']} of {parity['rows']} scorer rows over 1e-6; first shapes whose top-1 "
                f"differs: {parity['mismatched_shapes']}")
    manifest: dict[str, Any] = {
        "format": mf.FORMAT,
        "created_utc": mf.now_utc(),
        "op": op.name, "arch": _name(arch), "dtype": _name(dtype), "layout": _name(layout),
        "select": select,
        "selection": {"strategy": select, **dict(selection or {}),
                      "candidates": len(catalogue) if candidates is None else int(len(candidates)),
                      "candidate_ids": None if candidates is None else [int(i) for i in candidates]},
        "opset": dict(xo.OPSET), "ir_version": xo.IR_VERSION,
        "graphs": mf.graph_io(op, len(catalogue)),
        "problem_fields": mf.fields_section(op.problem_fields),
        "kernel_fields": mf.fields_section(op.kernel_fields),
        "catalogue": mf.catalogue_section(op, catalogue),
        "features": _feature_names(pipeline),
        "model": _model_section(pipeline),
        # the selector's model when it is not the scorer's (select=reranked)
        "selector_model": None if selector_pipe is pipeline else _model_section(selector_pipe),
        "training": dict(training),
        "metrics": metrics,
        "parity": parity,
        "source": dict(source or {}),
        "convert_seconds": round(convert_s, 2),
        "versions": mf.package_versions(),
    }
    meta = mf.metadata_payload(manifest)
    blobs: dict[str, bytes] = {}
    for model, fname in ((selector, mf.SELECTOR_FILE), (scorer, mf.SCORER_FILE)):
        xo.set_metadata(model, meta)
        blobs[fname] = model.SerializeToString()
    manifest["files"] = {name: {"sha256": mf.sha256_bytes(data), "bytes": len(data)} for name, data in blobs.items()}
    blobs[mf.MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
    mf.write_export_dir(out_dir, blobs)
    return manifest


def fit_final(cfg: Any, table: pd.DataFrame, op: OpDefinition) -> Any:
    """Fit the config's pipeline on every shape of ``table``, exactly as ``train`` fits its final model.

    Rows, targets and early stopping (on a validation split of the shapes, when configured)
    come from :func:`ckpred.train.fit_method`, so ``export`` without ``run_dir`` yields the
    pipeline ``train`` would have saved for the same config.
    """
    from omegaconf import OmegaConf

    from ckpred import train as tr

    data = tr.prepare(table, op, cfg)
    recipe = OmegaConf.create({"features": OmegaConf.to_container(cfg.features, resolve=True),
                               "model": OmegaConf.to_container(cfg.model, resolve=True),
                               "target": OmegaConf.to_container(cfg.target, resolve=True),
                               "seed": int(cfg.seed), "layout": OmegaConf.to_container(cfg.layout, resolve=True)})
    method = tr.LearnedMethod("model", recipe, cfg.rows)
    pipe, _ = tr.fit_method(method, data, np.arange(data.groups.n_shapes), op, cfg, int(cfg.seed))
    return pipe


def strategy_cv(run_dir: Path, table: pd.DataFrame, op: OpDefinition, cfg: Any, recipe: Any) -> dict[str, Any]:
    """Per-shape efficiency of the exported strategy under the run's CV, next to the full model's.

    The candidate set (and the reranker) of each fold are learned from its training shapes only
    (:func:`ckpred.export.strategies.cv_efficiency`), so the figures say what the selector being
    exported achieves on unseen shapes, not what ``train`` reported for the full model.
    """
    from omegaconf import OmegaConf

    from ckpred.export.strategies import cv_efficiency

    oof = pd.read_parquet(run_dir / "oof_predictions.parquet")
    tested, trained = set(pd.unique(oof["shape"])), set(pd.unique(np.asarray(op.shape_keys(table))))
    if tested != trained or oof["fold"].nunique() < 2:
        # external / holdout CV: the tested shapes are not the training table's folds, so the
        # candidates and reranker of a fold cannot be relearned from "the other folds".
        return {"skipped": f"the run's CV tested {len(tested)} shapes in {oof['fold'].nunique()} fold(s), "
                           f"its training table has {len(trained)}: a per-fold report needs k-fold CV over "
                           "the training shapes"}
    kw = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    reranker = OmegaConf.to_container(cfg.reranker, resolve=True) if cfg.select == "reranked" else None
    out: dict[str, Any] = {"folds": int(oof["fold"].nunique())}
    for name, top_n, rr in (("full", None, None), (cfg.select, int(cfg.prune_top_n), reranker)):
        eff = cv_efficiency(oof, table, op, top_n=top_n, reranker=rr, recipe=recipe, seed=int(cfg.get("seed", 0)),
                            **kw)["efficiency"].dropna().to_numpy()
        out[name] = {"shapes": int(len(eff)), "mean": float(eff.mean()), "p10": float(np.percentile(eff, 10))}
    return out


def _check_run_matches(cfg: Any, run_cfg: Any, run_dir: Path) -> None:
    diffs = []
    for key in ("op", "arch", "dtype", "layout"):
        mine, theirs = _name(cfg[key]), _name(run_cfg[key])
        if mine != theirs:
            diffs.append(f"{key}: run has {theirs!r}, this export config has {mine!r} (pass {key}={theirs})")
    if diffs:
        raise ModelMismatchError(f"{run_dir} was trained for a different target: " + "; ".join(diffs))


def export_command(cfg: Any) -> str:
    """Task function of ``python -m ckpred export``; returns the export directory."""
    from omegaconf import OmegaConf

    from ckpred.config import resolve_path
    from ckpred.data import load_table

    op = load_op(cfg.op)
    out_root = resolve_path(cfg.out_dir)
    target = out_root / export_name(op.name, _name(cfg.arch), _name(cfg.dtype), _name(cfg.layout))
    metrics = None
    source: dict[str, Any] = {}
    if cfg.run_dir:
        from ckpred.runs import load_train_run

        run = load_train_run(cfg.run_dir, purpose="export", require_manifest=False)
        run_dir, train_manifest = run.path, run.manifest
        for key in ("op", "arch", "dtype", "layout"):
            theirs = train_manifest.get(key)
            if isinstance(theirs, str) and theirs != _name(cfg[key]):
                raise ModelMismatchError(f"{run_dir}/manifest.json: {key} is {theirs!r}, this export config "
                                         f"has {_name(cfg[key])!r} (pass {key}={theirs})")
        # The run's own config says which data it trained on (for the ranges and the parity shapes).
        run_cfg_path = run_dir / ".hydra" / "config.yaml"
        data_cfg = cfg
        if isinstance(train_manifest.get("config"), dict):
            data_cfg = OmegaConf.create(train_manifest["config"])
        elif run_cfg_path.is_file():
            data_cfg = OmegaConf.load(run_cfg_path)
        if data_cfg is not cfg:
            _check_run_matches(cfg, data_cfg, run_dir)
        metrics = train_manifest.get("metrics")
        pipeline = run.pipeline
        pipe_sha = run.sha256
        table = load_table(data_cfg)
        train_hash = (train_manifest.get("data") or {}).get("hash")
        source = {"kind": "run_dir", "run_dir": str(run_dir), "pipeline_sha256": pipe_sha,
                  "train_data_hash": train_hash}
    else:
        data_cfg = cfg
        table = load_table(cfg)
        t0 = time.perf_counter()
        pipeline = fit_final(cfg, table, op)
        source = {"kind": "fit", "fit_seconds": round(time.perf_counter() - t0, 2),
                  "config": OmegaConf.to_container(cfg, resolve=True)}
    training = mf.training_section(table, op, source=str(data_cfg.data.source))
    if source.get("train_data_hash") and source["train_data_hash"] != training["data_hash"]:
        raise ModelMismatchError(
            f"the data this config loads (hash {training['data_hash'][:12]}) is not the data run_dir={cfg.run_dir} "
            f"was trained on (hash {source['train_data_hash'][:12]}): training ranges and parity would be wrong; "
            "export with the run's data settings")
    problems = table[list(op.problem_names)].drop_duplicates()
    if cfg.parity.shapes and len(problems) > cfg.parity.shapes:
        problems = problems.sample(cfg.parity.shapes, random_state=int(cfg.get("seed", 0)))
    candidates, selection, reranker = None, None, None
    if cfg.select in ("pruned", "reranked"):
        from ckpred.export.strategies import fit_reranker, keep_for_table

        top_n = int(cfg.get("prune_top_n", 1))
        candidates = keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=top_n)
        selection = {"top_n": top_n, "learned_from_shapes": int(len(table[list(op.problem_names)].drop_duplicates()))}
        if cfg.select == "reranked":
            # The reranker follows the recipe the pipeline was trained with (the run's, for run_dir).
            size = OmegaConf.to_container(cfg.reranker, resolve=True)
            reranker = fit_reranker(table, op, data_cfg, candidates, reranker=size, arch=cfg.arch, dtype=cfg.dtype,
                                    layout=cfg.layout, seed=int(cfg.get("seed", 0)))
            selection["reranker"] = size
        if cfg.run_dir and (run_dir / "oof_predictions.parquet").is_file():
            selection["cv"] = strategy_cv(run_dir, table, op, cfg, data_cfg)
    manifest = export_pipeline(pipeline, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=target,
                               training=training, parity_problems=problems if cfg.parity.check else None,
                               metrics=metrics, select=cfg.select, max_abs_diff=cfg.parity.max_abs_diff,
                               source=source, candidates=candidates, selection=selection, reranker=reranker)
    par = manifest["parity"]
    if par.get("checked"):
        print(f"parity on {par['shapes']} shapes x {manifest['catalogue']['count']} kernels: top-1 agreement "
              f"{par['top1_agreement']:.2%}, top-{par['top_k']} {par['topk_agreement']:.2%}, max |diff| scorer "
              f"{par['max_abs_diff_scorer']:.3g}, selector {par['max_abs_diff_selector']:.3g}")
    cv = (manifest["selection"] or {}).get("cv")
    if cv and "skipped" in cv:
        print(f"no CV report of the {cfg.select} selector: {cv['skipped']}")
    elif cv:
        print(f"under the run's {cv['folds']}-fold CV: {cfg.select} selector mean efficiency "
              f"{cv[cfg.select]['mean']:.2%}, P10 {cv[cfg.select]['p10']:.2%} (full model {cv['full']['mean']:.2%}, "
              f"P10 {cv['full']['p10']:.2%}) on {cv['full']['shapes']} shapes")
    sizes = ", ".join(f"{k} {v['bytes'] / 1e6:.2f} MB" for k, v in manifest["files"].items())
    print(f"exported {target} ({sizes})")
    return str(target)
