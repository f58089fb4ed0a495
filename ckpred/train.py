"""``ckpred train``: fit the kernel-selection model with shape-grouped CV and report it honestly.

:func:`train` is a plain function of the composed config (what sweepers and ``tune`` call); it
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
       manifest.json           config, data hash, versions, metrics, feature names, op/arch/...
       efficiency_cdf.png  efficiency_at_k.png  feature_importance.png
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import joblib
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from sklearn.model_selection import GroupKFold, GroupShuffleSplit

from ckpred import evaluate as ev
from ckpred.config import package_versions, run_dir, sha256_file
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.models import booster, build_pipeline, fit_pipeline, target_name, training_target

log = logging.getLogger(__name__)

#: Packages whose versions go into the manifest.
_PACKAGES = ("ckpred", "lightgbm", "scikit-learn", "numpy", "pandas", "pyarrow", "hydra-core",
             "omegaconf", "scipy")


# ---------------------------------------------------------------------------------------------
# The data of one table, prepared once
# ---------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """A canonical table with everything training and evaluation need, row-aligned."""

    table: pd.DataFrame
    X: pd.DataFrame
    perf: np.ndarray
    selectable: np.ndarray
    groups: ev.ShapeGroups
    #: Per shape (index = shape index): problem fields, family, best pipeline.
    shapes: pd.DataFrame = field(repr=False)


def prepare(table: pd.DataFrame, op: OpDefinition, cfg: Any) -> Prepared:
    """Encode the model input, measured perf, validity mask and shape groups of ``table``."""
    if len(table) == 0:
        raise ValueError("the training table is empty: no rows for this op/arch/dtype/layout")
    table = table.reset_index(drop=True)
    X = op.encode_frame(table)
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    problems = table[list(op.problem_names)]
    kernels = table[list(op.kernel_names)]
    selectable, _ = op.validity(problems, kernels, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    groups = ev.ShapeGroups.from_keys(op.shape_keys(table))
    first = groups.first_rows()
    shapes = table.loc[first, list(op.problem_names)].reset_index(drop=True)
    shapes.insert(0, "shape", groups.keys)
    shapes["family"] = op.family(shapes)
    best_row = np.full(groups.n_shapes, -1)
    for s in range(groups.n_shapes):
        rows = groups.rows(s)
        if perf[rows].max() > 0:
            best_row[s] = rows[int(np.argmax(perf[rows]))]
    ok = best_row >= 0
    shapes["best_tflops"] = np.where(ok, perf[np.maximum(best_row, 0)], 0.0)
    shapes["best_kernel"] = np.where(ok, table["kernel_name"].to_numpy()[np.maximum(best_row, 0)], "")
    if "pipeline" in table.columns:
        shapes["best_pipeline"] = np.where(ok, table["pipeline"].to_numpy()[np.maximum(best_row, 0)], "")
    return Prepared(table=table, X=X, perf=perf, selectable=np.asarray(selectable, dtype=bool),
                    groups=groups, shapes=shapes)


def data_hash(table: pd.DataFrame) -> str:
    """sha256 over the table's row hashes (content, column order and row order)."""
    digest = hashlib.sha256(",".join(table.columns).encode())
    digest.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Folds and training rows
# ---------------------------------------------------------------------------------------------
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
    if cv.name == "group_kfold":
        if n < cv.n_splits:
            raise ValueError(f"cv.n_splits={cv.n_splits} needs at least that many shapes; the data has {n}")
        splitter = GroupKFold(n_splits=int(cv.n_splits), shuffle=bool(cv.shuffle),
                              random_state=int(seed) if cv.shuffle else None)
        return [Fold(f"fold{i}", tr, te) for i, (tr, te) in enumerate(splitter.split(idx, groups=idx))]
    if cv.name == "holdout":
        splitter = GroupShuffleSplit(n_splits=1, test_size=float(cv.test_fraction), random_state=int(seed))
        tr, te = next(splitter.split(idx, groups=idx))
        return [Fold("holdout", tr, te)]
    if cv.name == "leave_family_out":
        family = data.shapes["family"].to_numpy()
        folds = [Fold(f"without_{f}", idx[family != f], idx[family == f]) for f in pd.unique(family)]
        folds = [f for f in folds if len(f.train_shapes) and len(f.test_shapes)]
        if not folds:
            raise ValueError("cv=leave_family_out needs shapes of at least two M families")
        return folds
    raise ValueError(f"unknown cv.name {cv.name!r}")


def validation_split(shapes: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split training shape indices into (fit, validation) for early stopping."""
    if len(shapes) < 2:
        raise ValueError("early stopping needs at least 2 training shapes to carve a validation set")
    splitter = GroupShuffleSplit(n_splits=1, test_size=fraction, random_state=seed)
    fit_pos, val_pos = next(splitter.split(shapes, groups=shapes))
    return np.sort(shapes[fit_pos]), np.sort(shapes[val_pos])


def training_rows(data: Prepared, shapes: np.ndarray, rows_cfg: Any, *, max_rows: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Row indices a model trains on, contiguous per shape (in ``shapes`` order).

    Shapes without any valid kernel carry no ranking signal and are skipped. With
    ``rows.drop_rule_invalid`` rows the validity rules reject are dropped (the selector masks
    them). With a row cap, the ``keep_top`` fastest rows of a shape are kept and the rest is a
    seeded uniform sample; evaluation never sees this subsampling.
    """
    cap = int(rows_cfg.max_per_shape) or max_rows
    cap = min(cap, max_rows)
    out = []
    for s in shapes:
        rows = data.groups.rows(int(s))
        if data.perf[rows].max() <= 0:
            continue
        if rows_cfg.drop_rule_invalid:
            rows = rows[data.selectable[rows]]
        if len(rows) > cap:
            top = min(int(rows_cfg.keep_top), cap)
            by_perf = np.argsort(-data.perf[rows], kind="stable")
            keep = by_perf[:top]
            rest = by_perf[top:]
            keep = np.concatenate([keep, rng.choice(rest, size=cap - top, replace=False)])
            rows = rows[np.sort(keep)]
        out.append(rows)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# One learned method on one fold
# ---------------------------------------------------------------------------------------------
@dataclass
class LearnedMethod:
    """A pipeline recipe: what ``model`` and ``reference`` share."""

    name: str
    recipe: DictConfig  # features, model, target, seed, layout
    rows: Any
    #: Warm start (:mod:`ckpred.warm_start`): booster every fit of this method continues from.
    init_model: Any = None


def _recipe(cfg: DictConfig, features: Any, model: Any, target: Any) -> DictConfig:
    return OmegaConf.create({"features": OmegaConf.to_container(features, resolve=True),
                             "model": OmegaConf.to_container(model, resolve=True),
                             "target": OmegaConf.to_container(target, resolve=True),
                             "seed": int(cfg.seed), "layout": OmegaConf.to_container(cfg.layout, resolve=True)})


def fit_method(method: LearnedMethod, data: Prepared, shapes: np.ndarray, op: OpDefinition, cfg: Any,
               seed: int) -> tuple[Any, dict[str, Any]]:
    """Fit ``method`` on the training ``shapes`` of ``data``; returns (pipeline, fit info)."""
    recipe = method.recipe
    rng = np.random.default_rng(seed)
    max_rows = int(recipe.model.max_rows_per_query) if recipe.model.name == "lgbm_ranker" else 2 ** 62
    info: dict[str, Any] = {}
    val_shapes = np.zeros(0, dtype=np.int64)
    fit_shapes = np.asarray(shapes)
    if int(recipe.model.early_stopping_rounds) > 0:
        fit_shapes, val_shapes = validation_split(fit_shapes, float(recipe.model.validation_fraction), seed)
    rows = training_rows(data, fit_shapes, method.rows, max_rows=max_rows, rng=rng)
    codes = data.groups.codes[rows]
    y = training_target(data.perf[rows], codes, recipe.model, recipe.target)
    val_kwargs: dict[str, Any] = {}
    if len(val_shapes):
        vrows = training_rows(data, val_shapes, method.rows, max_rows=max_rows, rng=rng)
        vcodes = data.groups.codes[vrows]
        val_kwargs = dict(X_val=data.X.iloc[vrows], val_codes=vcodes,
                          y_val=training_target(data.perf[vrows], vcodes, recipe.model, recipe.target))
    pipe = build_pipeline(recipe, op, cfg.arch, cfg.dtype)
    fit_pipeline(pipe, data.X.iloc[rows], y, codes, model_cfg=recipe.model,
                 target=target_name(recipe.model, recipe.target), **val_kwargs, init_model=method.init_model)
    info.update(train_rows=int(len(rows)), train_shapes=[str(k) for k in data.groups.keys[fit_shapes]],
                validation_shapes=[str(k) for k in data.groups.keys[val_shapes]],
                trees=int(booster(pipe).current_iteration()))
    best_iter = getattr(pipe.named_steps["model"], "best_iteration_", None)
    if best_iter is None and hasattr(pipe.named_steps["model"], "regressor_"):
        best_iter = getattr(pipe.named_steps["model"].regressor_, "best_iteration_", None)
    if best_iter:
        info["best_iteration"] = int(best_iter)
    return pipe, info


def _rows_of(groups: ev.ShapeGroups, shapes: np.ndarray) -> np.ndarray:
    return np.concatenate([groups.rows(int(s)) for s in shapes]) if len(shapes) else np.zeros(0, dtype=np.int64)


def _predict(pipe: Any, X: pd.DataFrame, batch: int = 200_000) -> np.ndarray:
    # Batches bound the feature matrix held in memory at once.
    return np.concatenate([np.asarray(pipe.predict(X.iloc[i:i + batch]), dtype=np.float64)
                           for i in range(0, len(X), batch)])


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def _run_dir(cfg: Any) -> Path:
    return run_dir(cfg, "train")


def _external_cfg(cfg: DictConfig) -> DictConfig:
    ext = OmegaConf.to_container(cfg, resolve=True)
    merged = OmegaConf.merge(OmegaConf.to_container(cfg.data, resolve=True),
                             OmegaConf.to_container(cfg.cv.data, resolve=True))
    ext["data"] = OmegaConf.to_container(merged)
    return OmegaConf.create(ext)


def _catalogue_hash(op: OpDefinition, cfg: Any) -> str | None:
    try:
        return op.catalogue_hash(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))
    except (ValueError, KeyError, NotImplementedError) as exc:
        log.info("no kernel catalogue for %s/%s/%s: %s", cfg.arch.name, cfg.dtype.name, cfg.layout.name, exc)
        return None


class _Progress:
    """rich progress over folds (silent when ``progress=false``)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> "_Progress":
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


def train(cfg: DictConfig, on_fold: Callable[[int, float], None] | None = None) -> float:
    """Train, cross-validate and evaluate against the baselines; write the run directory.

    Parameters
    ----------
    cfg : DictConfig
        A composed ``train`` config (``conf/train.yaml``).
    on_fold : callable, optional
        Called after each fold as ``on_fold(fold_index, mean)`` with the model's mean per-shape
        efficiency over the shapes tested so far (``ckpred tune`` prunes trials with it). An
        exception it raises stops the run before anything is written.

    Returns
    -------
    float
        The model's mean per-shape efficiency over the test shapes (what sweeps maximise).
    """
    t_start = time.perf_counter()
    out_dir = _run_dir(cfg)
    seed = int(cfg.seed)
    op = load_op(cfg.op)
    from ckpred.data import load_table

    timings: dict[str, float] = {}
    t = time.perf_counter()
    data = prepare(load_table(cfg), op, cfg)
    test = data
    if cfg.cv.name == "external":
        test = prepare(load_table(_external_cfg(cfg)), op, cfg)
    timings["load_s"] = time.perf_counter() - t
    log.info("data: %d rows, %d shapes (test table: %d rows, %d shapes)", len(data.table),
             data.groups.n_shapes, len(test.table), test.groups.n_shapes)

    learned = [LearnedMethod("model", _recipe(cfg, cfg.features, cfg.model, cfg.target), cfg.rows)]
    ref = cfg.baselines.reference
    if ref.enabled:
        learned.append(LearnedMethod("reference", _recipe(cfg, ref.features, ref.model, ref.target), ref.rows))
    # Warm start (ckpred.warm_start): the model (never the reference) continues from a previous run.
    base = None
    if cfg.get("warm_start"):
        from ckpred import warm_start

        base = warm_start.prepare(cfg, op, data.X.head(8))
        learned[0].init_model = base.booster

    folds = make_folds(cfg.cv, data, seed, test)
    n_test = len(test.table)
    scores: dict[str, np.ndarray] = {m.name: np.full(n_test, np.nan) for m in learned}
    if cfg.baselines.best_static:
        scores["best_static"] = np.full(n_test, np.nan)
    fold_of_row = np.full(n_test, -1, dtype=np.int64)
    fold_log: list[dict[str, Any]] = []
    fitted_external: Any = None

    with _Progress(bool(cfg.progress), len(folds) * len(learned)) as progress:
        for i, fold in enumerate(folds):
            test_rows = _rows_of(test.groups, fold.test_shapes)
            fold_of_row[test_rows] = i
            entry: dict[str, Any] = {"fold": fold.name,
                                     "test_shapes": [str(k) for k in test.groups.keys[fold.test_shapes]]}
            for method in learned:
                progress.describe(f"{fold.name}: {method.name}")
                t = time.perf_counter()
                pipe, info = fit_method(method, data, fold.train_shapes, op, cfg, seed + i)
                scores[method.name][test_rows] = _predict(pipe, test.X.iloc[test_rows])
                info["fit_predict_s"] = round(time.perf_counter() - t, 2)
                timings[f"{method.name}_s"] = timings.get(f"{method.name}_s", 0.0) + info["fit_predict_s"]
                entry[method.name] = info
                if cfg.cv.name == "external" and method.name == "model":
                    fitted_external = pipe
                progress.advance()
            if on_fold is not None:
                so_far = fold_of_row >= 0
                running = ev.shape_metrics(test.perf[so_far], scores["model"][so_far],
                                           ev.ShapeGroups.from_keys(test.groups.codes[so_far]),
                                           test.selectable[so_far])["efficiency"].mean()
                on_fold(i, float(running))
            if cfg.baselines.best_static:
                train_rows = _rows_of(data.groups, fold.train_shapes)
                sub = ev.ShapeGroups.from_keys(data.groups.codes[train_rows])
                s, ranking = ev.best_static_scores(data.table["kernel_name"].to_numpy()[train_rows],
                                                   data.perf[train_rows], sub,
                                                   test.table["kernel_name"].to_numpy()[test_rows])
                scores["best_static"][test_rows] = s
                entry["best_static"] = {"top_kernels": ranking.head(5).round(4).to_dict()}
            fold_log.append(entry)

    analytical_note = None
    if cfg.baselines.analytical:
        try:
            # The heuristic reasons about the GEMM the kernel tiles: the op's GEMM view.
            m, n, k = op.gemm_view(test.table)
            gemm = test.table.assign(m=m, n=n, k=k)
            scores["analytical"] = ev.analytical_scores(
                gemm, cus=int(cfg.arch.cus), peak_tflops=float(cfg.arch.peak_tflops[cfg.dtype.name]),
                bandwidth_gbs=float(cfg.arch.memory_bandwidth_gbs),
                bytes_per_element=int(cfg.dtype.bytes_per_element),
                c_bytes={"fp8": 1, "bf8": 1, "fp16": 2, "bf16": 2, "fp32": 4}[cfg.dtype.c_dtype])
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
        per_shape[name] = ev.shape_metrics(perf, s[tested], eval_groups, selectable)
    if cfg.baselines.random:
        per_shape["random"] = ev.random_shape_metrics(perf, eval_groups)
    per_shape = {m: per_shape[m] for m in ev.METHODS if m in per_shape}
    family = shapes["family"].to_numpy()
    best_pipeline = shapes["best_pipeline"].to_numpy() if "best_pipeline" in shapes else None
    metrics: dict[str, Any] = {m: ev.method_report(ps, family, op.families, best_pipeline)
                               for m, ps in per_shape.items()}
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

    _write_outputs(out_dir, cfg, op, data, test, tested, scores, fold_of_row, shapes, per_shape, eval_groups,
                   metrics, fold_log, final, final_info, timings)
    if base is not None:  # lineage into manifest.json (ckpred.warm_start)
        warm_start.record_lineage(out_dir, base, cfg, fold_log)
    if cfg.progress:
        print_summary(metrics, op.families, out_dir, timings)
    mean = metrics["model"].get("mean", float("nan"))
    log.info("model mean efficiency %.4f (%s) in %.1fs -> %s", mean, cfg.cv.name, timings["total_s"], out_dir)
    return float(mean)


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------
def _write_outputs(out_dir: Path, cfg: DictConfig, op: OpDefinition, data: Prepared, test: Prepared,
                   tested: np.ndarray, scores: dict[str, np.ndarray], fold_of_row: np.ndarray,
                   shapes: pd.DataFrame, per_shape: dict[str, pd.DataFrame], eval_groups: ev.ShapeGroups,
                   metrics: dict[str, Any], fold_log: list[dict[str, Any]], final: Any,
                   final_info: dict[str, Any], timings: dict[str, float]) -> None:
    ev.write_json(out_dir / "metrics.json", metrics)
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
    manifest = {
        "command": "train",
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "op": op.name, "arch": cfg.arch.name, "dtype": cfg.dtype.name, "layout": cfg.layout.name,
        "model": cfg.model.name, "target": target_name(cfg.model, cfg.target), "features": cfg.features.name,
        "feature_names": feature_names, "input_names": list(op.input_names),
        "catalogue_hash": _catalogue_hash(op, cfg),
        "data": {"hash": data_hash(data.table), "rows": int(len(data.table)), "shapes": int(data.groups.n_shapes),
                 "valid_rows": int(data.table["is_valid"].sum()),
                 "shape_ranges": {c: [int(data.table[c].min()), int(data.table[c].max())]
                                  for c in op.problem_names}},
        "test_data": None if test is data else {"hash": data_hash(test.table), "rows": int(len(test.table)),
                                                 "shapes": int(test.groups.n_shapes)},
        "cv": cfg.cv.name, "n_folds": len(fold_log), "seed": int(cfg.seed),
        "pipeline": {"file": "pipeline.joblib" if final is not None else None, "sha256": pipeline_sha,
                     **({k: v for k, v in final_info.items() if k not in ("train_shapes", "validation_shapes")})},
        "metrics": {m: {k: v for k, v in r.items() if not isinstance(v, dict)} for m, r in metrics.items()},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "versions": package_versions(_PACKAGES),
        "argv": sys.argv,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    ev.write_json(out_dir / "manifest.json", manifest)


def print_summary(metrics: dict[str, Any], families: tuple[str, ...], out_dir: Path,
                  timings: dict[str, float]) -> None:
    """Rich tables: every method side by side, overall and by M family (percent)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    cols = [("mean", "mean"), ("p10", "P10"), ("p50", "P50"), ("min", "min"), ("top1", "top1"),
            ("top5", "top5"), ("efficiency@5", "eff@5"), ("efficiency@20", "eff@20"), ("ndcg@10", "ndcg@10")]
    table = Table(title="efficiency on unseen shapes, % (chosen kernel / best kernel)")
    table.add_column("method")
    for _, title in cols:
        table.add_column(title, justify="right")
    scored = {m: r for m, r in metrics.items() if "mean" in r}
    for method, rep in metrics.items():
        if method in scored:
            table.add_row(method, *[f"{100 * rep[key]:.2f}" for key, _ in cols])
        else:
            table.add_row(method, rep.get("skipped", ""))
    console.print(table)
    present = [f for f in families if any(f in r["by_family"] for r in scored.values())]
    if present:
        fam = Table(title="mean / P10 efficiency by M family, %")
        fam.add_column("method")
        for f in present:
            n = next(r["by_family"][f]["n_shapes"] for r in scored.values() if f in r["by_family"])
            fam.add_column(f"{f} (n={n})", justify="right")
        for method, rep in scored.items():
            fam.add_row(method, *[f"{100 * rep['by_family'][f]['mean']:.2f} / {100 * rep['by_family'][f]['p10']:.2f}"
                                  if f in rep["by_family"] else "-" for f in present])
        console.print(fam)
    n = metrics["model"].get("n_shapes", 0)
    console.print(f"{n} test shapes; wall time {timings.get('total_s', 0):.1f}s; outputs in {out_dir}")
