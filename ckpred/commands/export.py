"""``python -m ckpred export``: fit (or take) the final pipeline and compile it to ONNX.

Two sources of the pipeline:

* default: fit the config's ``features -> model`` pipeline on all rows of the config's data
  (:func:`ckpred.fitting.fit_final`, the rows and targets ``train`` uses);
* ``run_dir=<train run>``: the finished run's ``pipeline.joblib``; its run record ``run.json``
  (metrics, data hash) and the run's ``.hydra/config.yaml`` (to recover the training data
  and its problem ranges) are read too, and arch/dtype/layout/op must match this config.

Output: ``<out_dir>/<op>_<arch>_<dtype>_<layout>/``, written by
:func:`ckpred.export.build.export_pipeline` (parity-checked, atomic).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpred.errors import ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export.build import export_name, export_pipeline, node_name
from ckpred.fitting import fit_final
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.kernels.declared import bind_training_catalogue


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
        mine, theirs = node_name(cfg[key]), node_name(run_cfg[key])
        if mine != theirs:
            diffs.append(f"{key}: run has {theirs!r}, this export config has {mine!r} (pass {key}={theirs})")
    if diffs:
        raise ModelMismatchError(f"{run_dir} was trained for a different target: " + "; ".join(diffs))


def export_command(cfg: Any) -> str:
    """Task function of ``python -m ckpred export``; returns the export directory."""
    from omegaconf import OmegaConf

    from ckpred.util import resolve_path
    from ckpred.data import load_table

    op = load_op(cfg.op)
    out_root = resolve_path(cfg.out_dir)
    target = out_root / export_name(op.name, node_name(cfg.arch), node_name(cfg.dtype), node_name(cfg.layout))
    metrics = None
    source: dict[str, Any] = {}
    if cfg.run_dir:
        from ckpred.runs import RUN_RECORD, load_train_run

        run = load_train_run(cfg.run_dir, purpose="export", require_record=False)
        run_dir, train_record = run.path, run.record
        for key in ("op", "arch", "dtype", "layout"):
            theirs = train_record.get(key)
            if isinstance(theirs, str) and theirs != node_name(cfg[key]):
                raise ModelMismatchError(f"{run_dir}/{RUN_RECORD}: {key} is {theirs!r}, this export config "
                                         f"has {node_name(cfg[key])!r} (pass {key}={theirs})")
        # The run's own config says which data it trained on (for the ranges and the parity shapes).
        run_cfg_path = run_dir / ".hydra" / "config.yaml"
        data_cfg = cfg
        if isinstance(train_record.get("config"), dict):
            data_cfg = OmegaConf.create(train_record["config"])
        elif run_cfg_path.is_file():
            data_cfg = OmegaConf.load(run_cfg_path)
        if data_cfg is not cfg:
            _check_run_matches(cfg, data_cfg, run_dir)
        metrics = train_record.get("metrics")
        pipeline = run.pipeline
        pipe_sha = run.sha256
        table = load_table(data_cfg)
        bind_training_catalogue(op, table, data_cfg)
        train_hash = (train_record.get("data") or {}).get("hash")
        source = {"kind": "run_dir", "run_dir": str(run_dir), "pipeline_sha256": pipe_sha,
                  "train_data_hash": train_hash}
    else:
        data_cfg = cfg
        table = load_table(cfg)
        bind_training_catalogue(op, table, cfg)
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
    calibration = None
    # The confidence budget's calibration: the run's out-of-fold scores are the full model's, so
    # it holds only for selectors that rank with that model (full, pruned; not the reranker).
    if cfg.run_dir and cfg.select in ("full", "pruned") and (run_dir / "oof_predictions.parquet").is_file():
        from ckpred.autotune import calibration_from_oof

        ids = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).set_index("kernel_name")["kernel_id"]
        calibration = calibration_from_oof(pd.read_parquet(run_dir / "oof_predictions.parquet"), ids)
    manifest = export_pipeline(pipeline, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=target,
                               training=training, parity_problems=problems if cfg.parity.check else None,
                               metrics=metrics, select=cfg.select, max_abs_diff=cfg.parity.max_abs_diff,
                               source=source, candidates=candidates, selection=selection, reranker=reranker,
                               autotune=calibration)
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
