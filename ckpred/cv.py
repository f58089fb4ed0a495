"""Cross-validation engine of ``ckpred train``: folds by shape, every method fitted per fold, the run directory.

:func:`cross_validate` is a plain function of a composed train config and an output folder; it
returns the model's mean per-shape efficiency over the test folds. One run:

1. loads the canonical table (:func:`ckpred.data.load_table`), the op's validity mask and the
   measured perf (0 for failed rows);
2. splits shapes into folds (``cv``); for each fold fits the model pipeline and the baselines
   on the training shapes only — the ``reference`` replica (its own features/target/model),
   ``best_static`` (a fixed kernel preference order), plus the no-learning ``analytical`` and
   ``random`` baselines — and scores every row of the test shapes. Early stopping, when on,
   watches a seeded fraction of the *training* shapes;
3. evaluates all methods on the same test shapes (:mod:`ckpred.evaluate`);
4. fits the final pipeline on all data and writes the run directory::

       metrics.json            per method: mean, p10, p50, min, top1/3/5/10, efficiency@k,
                               ndcg@10, by_family, by_best_pipeline
       per_shape.csv           one row per test shape: best kernel, each method's pick and efficiency
       oof_predictions.parquet every test row: fold, measured perf, each method's score
       folds.json              train / validation / test shape keys of every fold
       pipeline.joblib         the final Pipeline (features -> model) fitted on all data
       run.json                the run record: config, data hash, versions, metrics, feature names, op/arch/...
       efficiency_cdf.png  efficiency_at_k.png  feature_importance.png
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import json

import joblib
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from sklearn.model_selection import GroupKFold, GroupShuffleSplit

from ckpred import evaluate as ev
from ckpred.data.table import data_hash
from ckpred.errors import ConfigValueError
from ckpred.fitting import (LearnedMethod, Prepared, cv_group_names, fit_method, for_arch, model_method,
                            plain_method, predict, prepare, recipe_config, rows_of)
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.kernels.declared import bind_training_catalogue
from ckpred.models import booster, failure_model, predicted_ok, target_name
from ckpred.runs import RUN_RECORD
from ckpred.schema import CV_NAMES
from ckpred.util import package_versions, sha256_file

log = logging.getLogger(__name__)

#: Packages whose versions go into the run record.
_PACKAGES = ("ckpred", "lightgbm", "scikit-learn", "numpy", "pandas", "pyarrow", "hydra-core",
             "omegaconf", "scipy")


@dataclass
class Fold:
    """One split: shape indices of the training table and of the test table."""

    name: str
    train_shapes: np.ndarray
    test_shapes: np.ndarray


def make_folds(cv: Any, data: Prepared, seed: int, test: Prepared | None = None) -> list[Fold]:
    """Folds of shape indices for ``cv`` (never splitting a shape's rows).

    ``external`` returns one fold: every training shape vs every shape of ``test``.
    """
    n = data.groups.n_shapes
    idx = np.arange(n)
    if cv.name == "external":
        assert test is not None
        return [Fold("external", idx, np.arange(test.groups.n_shapes))]
    # shapes of one CV group (the op's cv group key) always land in the same fold
    groups = data.cv_groups if len(data.cv_groups) == n else idx
    n_groups = len(np.unique(groups))
    unit = "shapes" if n_groups == n else f"CV groups (its {n} shapes grouped by the op's cv key)"
    if cv.name == "group_kfold":
        if n_groups < cv.n_splits:
            raise ConfigValueError("cv.n_splits", int(cv.n_splits),
                                   f"an integer in [2, {n_groups}]: each fold tests one CV group at least, so n_splits "
                                   f"needs at least that many CV groups and the data has {n_groups} {unit}" if n_groups >= 2 else
                                   f"none: the data has {n_groups} {unit}, cross-validation needs at least 2")
        splitter = GroupKFold(n_splits=int(cv.n_splits), shuffle=bool(cv.shuffle),
                              random_state=int(seed) if cv.shuffle else None)
        return [Fold(f"fold{i}", tr, te) for i, (tr, te) in enumerate(splitter.split(idx, groups=groups))]
    if cv.name == "holdout":
        # GroupShuffleSplit's sizes: ceil(fraction * groups) test groups, the rest train.
        n_test = int(np.ceil(float(cv.test_fraction) * n_groups))
        if n_groups < 2 or n_test >= n_groups:
            top = (n_groups - 1) / n_groups if n_groups >= 2 else 0.0
            raise ConfigValueError("cv.test_fraction", float(cv.test_fraction),
                                   f"a number in (0, {top:.4g}]: the data has {n_groups} {unit} and the fraction "
                                   "must leave at least one to train on" if n_groups >= 2 else
                                   f"none: the data has {n_groups} {unit}, a hold-out split needs at least 2")
        splitter = GroupShuffleSplit(n_splits=1, test_size=float(cv.test_fraction), random_state=int(seed))
        tr, te = next(splitter.split(idx, groups=groups))
        return [Fold("holdout", tr, te)]
    if cv.name == "leave_family_out":
        family = data.shapes["family"].to_numpy()
        folds = [Fold(f"without_{f}", idx[family != f], idx[family == f]) for f in pd.unique(family)]
        folds = [f for f in folds if len(f.train_shapes) and len(f.test_shapes)]
        if not folds:
            raise ConfigValueError("cv", "leave_family_out",
                                   f"a cv that splits shapes ({', '.join(c for c in CV_NAMES if c != 'leave_family_out')}"
                                   f"): leave_family_out needs shapes of at least two M families and the data has "
                                   f"only {list(pd.unique(family))}")
        return folds
    raise ConfigValueError("cv.name", cv.name, f"one of {list(CV_NAMES)}")



def external_data_config(cfg: DictConfig) -> DictConfig:
    """The train config with ``cv.data`` merged over ``data``: what ``cv=external`` tests on."""
    ext = OmegaConf.to_container(cfg, resolve=True)
    merged = OmegaConf.merge(OmegaConf.to_container(cfg.data, resolve=True),
                             OmegaConf.to_container(cfg.cv.data, resolve=True))
    ext["data"] = OmegaConf.to_container(merged)
    return OmegaConf.create(ext)


def external_arch(cfg: DictConfig, test_table: pd.DataFrame) -> Any:
    """The arch of ``cv=external``'s test table: ``cv.arch`` when given, else the packaged arch
    config named by the table's ``arch`` column when it holds one name other than the training
    arch's, else the training arch. Its constants drive the test table's validity rules and
    hardware features."""
    from ckpred.schema import arch_config

    if cfg.cv.get("arch") is not None:
        return cfg.cv.arch
    names = pd.unique(test_table["arch"].astype(str)) if "arch" in test_table else []
    if len(names) == 1 and names[0] != cfg.arch.name:
        log.info("cv=external: the test table's arch is %s (its own hardware constants)", names[0])
        return arch_config(str(names[0]))
    return cfg.arch


def _catalogue_hash(op: OpDefinition, cfg: Any) -> str | None:
    try:
        return op.catalogue_hash(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))
    except (ValueError, KeyError, NotImplementedError) as exc:
        log.info("no kernel catalogue for %s/%s/%s: %s", cfg.arch.name, cfg.dtype.name, cfg.layout.name, exc)
        return None


class FoldProgress:
    """rich progress over folds (silent when ``progress=false``)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> "FoldProgress":
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("folds", total=self.total)
        return self

    def describe(self, text: str) -> None:
        if self.enabled:
            self.bar.update(self.task, description=text)

    def advance(self) -> None:
        if self.enabled:
            self.bar.advance(self.task)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)


def cross_validate(cfg: DictConfig, out_dir: Path, on_fold: Callable[[int, float], None] | None = None) -> float:
    """Cross-validate the model against the baselines and write the run directory ``out_dir``.

    With ``seeds`` (several), the whole CV runs once per seed into ``out_dir/seed<s>/`` (the
    final pipeline is fitted for the first seed only) and ``out_dir/metrics.json`` holds each
    method's spread over seeds (``over_seeds``) beside the first seed's metrics.

    Parameters
    ----------
    cfg : DictConfig
        A composed ``train`` config (:class:`ckpred.schema.TrainConfig`).
    out_dir : Path
        Where the run's files go (created by the caller).
    on_fold : callable, optional
        Called after each fold as ``on_fold(fold_index, mean)`` with the model's mean per-shape
        efficiency over the shapes tested so far (``ckpred tune`` prunes trials with it). An
        exception it raises stops the run before anything is written.

    Returns
    -------
    float
        The model's mean per-shape efficiency over the test shapes (what sweeps maximise); with
        several seeds, its mean over the seeds.
    """
    seeds = [int(x) for x in (cfg.get("seeds") or [])]
    if len(seeds) <= 1:
        if seeds:
            cfg = _with(cfg, seed=seeds[0], seeds=[])
        return _cross_validate_one(cfg, out_dir, on_fold)
    return cross_validate_seeds(cfg, out_dir, seeds, on_fold)


def _with(cfg: DictConfig, **values: Any) -> DictConfig:
    """A copy of ``cfg`` with top-level keys replaced (struct mode kept)."""
    out = cfg.copy()
    for key, value in values.items():
        out[key] = value
    return out


def cross_validate_seeds(cfg: DictConfig, out_dir: Path, seeds: list[int],
                         on_fold: Callable[[int, float], None] | None = None) -> float:
    """:func:`cross_validate` once per seed, then the spread of every method over the seeds."""
    per_seed: dict[int, dict[str, Any]] = {}
    progress = bool(cfg.progress)
    for i, seed in enumerate(seeds):
        sub = out_dir / f"seed{seed}"
        sub.mkdir(parents=True, exist_ok=True)
        one = _with(cfg, seed=seed, seeds=[], progress=False, save_pipeline=bool(cfg.save_pipeline) and i == 0,
                    plots=bool(cfg.plots) and i == 0)
        _cross_validate_one(one, sub, on_fold if i == 0 else None)
        per_seed[seed] = json.loads((sub / "metrics.json").read_text())
    heading = per_seed[seeds[0]].get("_heading", "")
    first = {m: r for m, r in per_seed[seeds[0]].items() if isinstance(r, dict)}
    methods = [m for m in first if "mean" in first[m]]
    over = {m: ev.spread([per_seed[s][m] for s in seeds if m in per_seed[s]]) for m in methods}
    # the first seed's metrics as in a one-seed run, plus the spread of each method over the seeds
    payload = {"_heading": f"{heading}, seeds {seeds}", **first, "seeds": seeds, "over_seeds": over,
               "timings_s": {str(s): json.loads((out_dir / f"seed{s}" / RUN_RECORD).read_text())["timings_s"]
                             for s in seeds}}
    ev.write_json(out_dir / "metrics.json", payload)
    if progress:
        record = json.loads((out_dir / f"seed{seeds[0]}" / RUN_RECORD).read_text())
        ev.print_summary(first, tuple(record.get("families", ())), out_dir, record["timings_s"],
                         heading=f"{heading}, seed {seeds[0]}", over_seeds=over)
    mean = over.get("model", {}).get("mean", {}).get("mean", float("nan"))
    log.info("model mean efficiency over seeds %s: %.4f -> %s", seeds, mean, out_dir)
    return float(mean)


def _cross_validate_one(cfg: DictConfig, out_dir: Path, on_fold: Callable[[int, float], None] | None = None) -> float:
    """One seed of :func:`cross_validate`.

    With ``model.backend=dask`` the fold fits run as tasks on the Dask cluster
    (:func:`ckpred.scale.fold_fits`), and a partitioned dataset (``data.path`` a directory
    written by :func:`ckpred.scale.write_partitions`) is trained through LightGBM's Dask
    interface instead (:func:`ckpred.scale.cross_validate_partitioned`).
    """
    t_start = time.perf_counter()
    seed = int(cfg.seed)
    op = load_op(cfg.op)
    if cfg.model.backend == "dask" and cfg.data.source == "path":
        from ckpred import scale
        from ckpred.data.partitions import is_partitioned
        from ckpred.util import resolve_path

        if isinstance(cfg.data.path, str) and is_partitioned(resolve_path(cfg.data.path)):
            return scale.cross_validate_partitioned(cfg, op, resolve_path(cfg.data.path), out_dir)
    from ckpred.data import load_table

    timings: dict[str, float] = {}
    t = time.perf_counter()
    table = load_table(cfg)
    bind_training_catalogue(op, table, cfg)
    data = prepare(table, op, cfg)
    test = data
    if cfg.cv.name == "external":
        test_table = load_table(external_data_config(cfg))
        test = prepare(test_table, op, cfg, arch=external_arch(cfg, test_table))
    timings["load_s"] = time.perf_counter() - t
    log.info("data: %d rows, %d shapes (test table: %d rows, %d shapes)", len(data.table),
             data.groups.n_shapes, len(test.table), test.groups.n_shapes)

    learned = [model_method(cfg)]
    if cfg.baselines.get("plain") is not None and cfg.baselines.plain.enabled:
        learned.append(plain_method(cfg))
    ref = cfg.baselines.reference
    if ref.enabled and ref.features is None:
        print(f"baseline reference skipped: op {op.name!r} has no features/reference_{op.name} set "
              "(name one with features@baselines.reference.features=<set>)")
    elif ref.enabled:
        learned.append(LearnedMethod("reference", recipe_config(cfg, ref.features, ref.model, ref.target), ref.rows))
    # Warm start (ckpred.warm_start): the model (never the reference) continues from a previous run.
    base = None
    if cfg.get("warm_start"):
        from ckpred import warm_start

        base = warm_start.prepare(cfg, op, data.X.head(8))
        learned[0].init_model = base.booster

    folds = make_folds(cfg.cv, data, seed, test)
    n_test = len(test.table)
    scores: dict[str, np.ndarray] = {m.name: np.full(n_test, np.nan) for m in learned}
    # the learned validity mask of each method that has one (True = predicted to run)
    runs: dict[str, np.ndarray] = {m.name: np.ones(n_test, dtype=bool) for m in learned if m.validity is not None}
    if cfg.baselines.best_static:
        scores["best_static"] = np.full(n_test, np.nan)
    static_by = ev.best_static_by(cfg.baselines, op)
    fold_of_row = np.full(n_test, -1, dtype=np.int64)
    fold_log: list[dict[str, Any]] = []
    fitted_external: Any = None

    # every (fold, method) fit, in loop order: here, or as tasks on a Dask cluster (model.backend=dask)
    jobs = [(method, fold.train_shapes, seed + i) for i, fold in enumerate(folds) for method in learned]
    if cfg.model.backend == "dask":
        from ckpred import scale

        fits = scale.fold_fits(cfg, data, op, jobs)
    else:
        fits = (fit_method(method, data, shapes, op, cfg, s) for method, shapes, s in jobs)

    with FoldProgress(bool(cfg.progress), len(folds) * len(learned)) as progress:
        for i, fold in enumerate(folds):
            test_rows = rows_of(test.groups, fold.test_shapes)
            fold_of_row[test_rows] = i
            entry: dict[str, Any] = {"fold": fold.name,
                                     "test_shapes": [str(k) for k in test.groups.keys[fold.test_shapes]]}
            for method in learned:
                progress.describe(f"{fold.name}: {method.name}")
                t, cpu = time.perf_counter(), time.process_time()
                pipe, info = next(fits)
                scorer = pipe if test.arch is data.arch else for_arch(pipe, method, op, cfg, test.arch, test.X)
                scores[method.name][test_rows] = predict(scorer, test.X.iloc[test_rows])
                if method.name in runs and failure_model(scorer) is not None:
                    runs[method.name][test_rows] = predicted_ok(scorer, test.X.iloc[test_rows])
                info["fit_predict_s"] = round(time.perf_counter() - t, 2)
                # CPU seconds too: on a shared machine wall time also measures the other processes
                info["fit_predict_cpu_s"] = round(time.process_time() - cpu, 2)
                timings[f"{method.name}_s"] = timings.get(f"{method.name}_s", 0.0) + info["fit_predict_s"]
                timings[f"{method.name}_cpu_s"] = timings.get(f"{method.name}_cpu_s", 0.0) + info["fit_predict_cpu_s"]
                entry[method.name] = info
                if cfg.cv.name == "external" and method.name == "model":
                    fitted_external = pipe
                progress.advance()
            if on_fold is not None:
                so_far = fold_of_row >= 0
                sub_groups = ev.ShapeGroups.from_keys(test.groups.codes[so_far])
                mask = test.selectable[so_far]
                if "model" in runs:
                    mask = ev.learned_selection_mask(mask, runs["model"][so_far], sub_groups)
                running = ev.shape_metrics(test.perf[so_far], scores["model"][so_far], sub_groups,
                                           mask)["efficiency"].mean()
                on_fold(i, float(running))
            if cfg.baselines.best_static:
                train_rows = rows_of(data.groups, fold.train_shapes)
                sub = ev.ShapeGroups.from_keys(data.groups.codes[train_rows])
                s, ranking = ev.best_static_scores(ev.static_keys(data.table, train_rows, static_by),
                                                   data.perf[train_rows], sub,
                                                   ev.static_keys(test.table, test_rows, static_by))
                scores["best_static"][test_rows] = s
                entry["best_static"] = {"top_kernels": ranking.head(5).round(4).to_dict()}
            fold_log.append(entry)

    analytical_note = None
    if cfg.baselines.analytical and type(op).gemm_view is not OpDefinition.gemm_view:
        try:
            # The heuristic reasons about the GEMM the kernel tiles: the op's GEMM view.
            scores["analytical"] = ev.op_analytical_scores(test.table, op, cfg.arch, cfg.dtype)
        except (KeyError, NotImplementedError) as exc:
            analytical_note = f"skipped: {exc}"
            log.warning("analytical baseline %s", analytical_note)

    # ---- evaluation on the tested shapes only (holdout tests a subset) ----
    tested = fold_of_row >= 0
    eval_groups = ev.ShapeGroups.from_keys(test.groups.codes[tested])
    eval_shape_idx = np.asarray(eval_groups.keys, dtype=np.int64)
    shapes = test.shapes.iloc[eval_shape_idx].reset_index(drop=True)
    perf = test.perf[tested]
    selectable = test.selectable[tested]
    per_shape: dict[str, pd.DataFrame] = {}
    for name, s in scores.items():
        mask = selectable
        if name in runs:  # the rules narrowed by the learned validity mask, with its fallback
            mask = ev.learned_selection_mask(selectable, runs[name][tested], eval_groups)
        per_shape[name] = ev.shape_metrics(perf, s[tested], eval_groups, mask)
    if cfg.baselines.random:
        per_shape["random"] = ev.random_shape_metrics(perf, eval_groups)
    per_shape = {m: per_shape[m] for m in ev.METHODS if m in per_shape}
    family = shapes["family"].to_numpy()
    best_pipeline = shapes["best_pipeline"].to_numpy() if "best_pipeline" in shapes else None
    shape_fold = fold_of_row[np.flatnonzero(tested)[eval_groups.first_rows()]]
    breakdowns = {f.name: shapes[f.name].to_numpy() for f in op.problem_fields
                  if f.kind in ("category", "categorical", "bool") and f.name in shapes and shapes[f.name].nunique() > 1}
    metrics: dict[str, Any] = {m: ev.method_report(ps, family, op.families, best_pipeline, breakdowns=breakdowns,
                                                   fold=shape_fold if len(folds) > 1 else None)
                               for m, ps in per_shape.items()}
    heading = ev.cv_heading(cv_group_names(op), cfg.cv, len(folds))
    if analytical_note:
        metrics["analytical"] = {"skipped": analytical_note}

    # ---- final model on all data ----
    final = fitted_external if cfg.save_pipeline else None
    final_info: dict[str, Any] = {}
    if cfg.save_pipeline and final is None:
        t = time.perf_counter()
        final, final_info = fit_method(learned[0], data, np.arange(data.groups.n_shapes), op, cfg, seed)
        timings["final_fit_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start

    write_run(out_dir, cfg, op, data, test, tested, scores, fold_of_row, shapes, per_shape, eval_groups,
              metrics, fold_log, final, final_info, timings, heading=heading)
    if base is not None:  # lineage into the run record (ckpred.warm_start)
        warm_start.record_lineage(out_dir, base, cfg, fold_log)
    if cfg.progress:
        ev.print_summary(metrics, op.families, out_dir, timings, heading=heading)
    mean = metrics["model"].get("mean", float("nan"))
    log.info("model mean efficiency %.4f (%s) in %.1fs -> %s", mean, cfg.cv.name, timings["total_s"], out_dir)
    return float(mean)


def _field_range(column: pd.Series) -> list[Any]:
    """A problem field's range in the run record: [min, max] of a number, the sorted values of a category."""
    if pd.api.types.is_numeric_dtype(column):
        return [int(column.min()), int(column.max())]
    return sorted(str(v) for v in column.unique())


def write_run(out_dir: Path, cfg: DictConfig, op: OpDefinition, data: Prepared, test: Prepared,
                   tested: np.ndarray, scores: dict[str, np.ndarray], fold_of_row: np.ndarray,
                   shapes: pd.DataFrame, per_shape: dict[str, pd.DataFrame], eval_groups: ev.ShapeGroups,
                   metrics: dict[str, Any], fold_log: list[dict[str, Any]], final: Any,
                   final_info: dict[str, Any], timings: dict[str, float], heading: str = "") -> None:
    # "_heading": what the figures hold out (the grouping key and the folds)
    ev.write_json(out_dir / "metrics.json", {"_heading": heading, **metrics})
    ev.write_json(out_dir / "folds.json", {"cv": cfg.cv.name, "folds": fold_log})

    # per-shape CSV: the shape, its best kernel, and each method's pick
    kernel_names = test.table["kernel_name"].to_numpy()[tested]
    tested_rows = np.flatnonzero(tested)
    frame = shapes.copy()
    frame.insert(1, "fold", fold_of_row[tested_rows[eval_groups.first_rows()]])
    frame["n_candidates"] = per_shape[next(iter(per_shape))]["n_candidates"].to_numpy()
    for name, ps in per_shape.items():
        frame[f"{name}_efficiency"] = ps["efficiency"].to_numpy()
        frame[f"{name}_efficiency@5"] = ps["efficiency@5"].to_numpy()
        frame[f"{name}_top1"] = ps["top1"].to_numpy()
        if name != "random":
            chosen = ps["chosen_row"].to_numpy()
            frame[f"{name}_kernel"] = np.where(chosen >= 0, kernel_names[np.maximum(chosen, 0)], "")
    frame.to_csv(out_dir / "per_shape.csv", index=False)

    # out-of-fold predictions
    oof = pd.DataFrame({"shape": test.groups.keys[test.groups.codes[tested]],
                        "fold": fold_of_row[tested], "kernel_name": kernel_names,
                        "tflops": test.table["tflops"].to_numpy()[tested], "perf": test.perf[tested],
                        "is_valid": test.table["is_valid"].to_numpy()[tested],
                        "selectable": test.selectable[tested]})
    for name, s in scores.items():
        oof[f"score_{name}"] = s[tested]
    oof.to_parquet(out_dir / "oof_predictions.parquet", index=False)

    feature_names: list[str] = []
    if final is not None:
        joblib.dump(final, out_dir / "pipeline.joblib", compress=3)
        feature_names = [str(n) for n in final.named_steps["features"].get_feature_names_out()]

    if cfg.plots:
        ev.plot_efficiency_cdf(per_shape, shapes["family"].to_numpy(), op.families, out_dir / "efficiency_cdf.png")
        ev.plot_efficiency_at_k({m: r for m, r in metrics.items() if "mean" in r}, out_dir / "efficiency_at_k.png")
        if final is not None:
            ev.plot_feature_importance(feature_names, booster(final).feature_importance(importance_type="gain"),
                                       out_dir / "feature_importance.png")

    pipeline_sha = None
    if final is not None:
        pipeline_sha = sha256_file(out_dir / "pipeline.joblib")
    record = {
        "command": "train",
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "op": op.name, "arch": cfg.arch.name, "dtype": cfg.dtype.name, "layout": cfg.layout.name,
        "model": cfg.model.name, "target": target_name(cfg.model, cfg.target), "features": cfg.features.name,
        "feature_names": feature_names, "input_names": list(op.input_names),
        "catalogue_hash": _catalogue_hash(op, cfg),
        "data": {"hash": data_hash(data.table), "rows": int(len(data.table)), "shapes": int(data.groups.n_shapes),
                 "valid_rows": int(data.table["is_valid"].sum()),
                 "shape_ranges": {c: _field_range(data.table[c]) for c in op.problem_names}},
        "test_data": None if test is data else {"hash": data_hash(test.table), "rows": int(len(test.table)),
                                                 "shapes": int(test.groups.n_shapes)},
        "cv": cfg.cv.name, "n_folds": len(fold_log), "seed": int(cfg.seed), "heading": heading,
        "families": list(op.families),
        "pipeline": {"file": "pipeline.joblib" if final is not None else None, "sha256": pipeline_sha,
                     **({k: v for k, v in final_info.items() if k not in ("train_shapes", "validation_shapes")})},
        "metrics": {m: {k: v for k, v in r.items() if not isinstance(v, dict)} for m, r in metrics.items()},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "versions": package_versions(_PACKAGES),
        "argv": sys.argv,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    ev.write_json(out_dir / RUN_RECORD, record)
