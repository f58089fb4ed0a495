"""The CV driver of ``ckpred train``: folds from the config's scheme, every method fitted per
fold, scored on the same test rows, reported, and the run directory written.

:func:`cross_validate` is a plain function of a composed train config and an output folder; it
returns the model's mean per-shape efficiency over the test folds. One seed of a run:

1. loads the canonical table (:func:`ckpred.data.load_table`), the op's validity mask and the
   measured perf (0 for failed rows), and the table the folds test
   (:meth:`~ckpred.cv.schemes.CVScheme.test_data`);
2. plans the folds (:meth:`~ckpred.cv.schemes.CVScheme.plan`); for each fold fits the model
   pipeline and the learned baselines on the training shapes only — ``plain`` LightGBM and the
   ``reference`` replica (its own features/target/model) — and ``best_static`` (a fixed kernel
   preference order), and scores every row of the test shapes (:mod:`ckpred.cv.scoring`), with
   the no-learning ``analytical`` and ``random`` baselines. Early stopping, when on, watches a
   seeded fraction of the *training* shapes. The fits run here, or as tasks on a Dask cluster
   (``model.backend=dask``, :func:`ckpred.scale.fold_fits`);
3. evaluates all methods on the same test shapes (:func:`ckpred.cv.scoring.evaluate`);
4. fits the final pipeline on all data and writes the run directory (:mod:`ckpred.cv.report`)::

       metrics.json            per method: mean, p10, p50, min, top1/3/5/10, efficiency@k,
                               ndcg@10, by_family, by_best_pipeline
       per_shape.csv           one row per test shape: best kernel, each method's pick and efficiency
       oof_predictions.parquet every test row: fold, measured perf, each method's score
       folds.json              train / validation / test shape keys of every fold
       pipeline.joblib         the final Pipeline (features -> model) fitted on all data
       run.json                the run record (:class:`ckpred.runs.RunRecord`)
       efficiency_cdf.png  efficiency_at_k.png  feature_importance.png

A partitioned dataset with ``model.backend=dask`` runs the same steps through LightGBM's Dask
interface (:mod:`ckpred.cv.partitioned`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred import scale, warm_start
from ckpred.cv import partitioned
from ckpred.cv.report import (Report, RunContext, SavedPipeline, finish, run_record, table_record, write_plots,
                              write_tested_rows)
from ckpred.cv.schemes import Fold
from ckpred.cv.scoring import (FoldTest, OutOfFold, Tables, best_kernel_seen, evaluate, fit_times, fold_test,
                               score_analytical, score_applicability, score_best_static, score_method)
from ckpred.data import load_table
from ckpred.data.partitions import is_partitioned
from ckpred.errors import ConfigValueError
from ckpred.fitting import (Applicability, LearnedMethod, Prepared, cv_group_names, fit_applicability, model_method,
                            plain_method, prepare, recipe_config)
from ckpred.kernels.base import OpDefinition
from ckpred.kernels.declared import bind_training_catalogue
from ckpred.kernels.lists import kernel_list, lists_key
from ckpred.runs import RUN_RECORD
from ckpred.schema import ArchConfig, TrainConfig
from ckpred.transfer import Fitted, TransferModel, fit_learned, transfer_method
from ckpred.util import resolve_path

log = logging.getLogger(__name__)

#: ``on_fold(fold_index, mean)``: the model's mean efficiency over the shapes tested so far.
OnFold = Callable[[int, float], None]


class FoldProgress:
    """rich progress over folds (silent when ``progress=false``)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> "FoldProgress":
        if self.enabled:
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

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled:
            self.bar.__exit__(kind, exc, tb)


# -- seeds ------------------------------------------------------------------------------------------
def cross_validate(cfg: TrainConfig, out_dir: Path, on_fold: OnFold | None = None) -> float:
    """Cross-validate the model against the baselines and write the run directory ``out_dir``.

    With ``seeds`` (several), the whole CV runs once per seed into ``out_dir/seed<s>/`` (the
    final pipeline is fitted for the first seed only) and ``out_dir/metrics.json`` holds each
    method's spread over seeds (``over_seeds``) beside the first seed's metrics.

    Parameters
    ----------
    cfg : TrainConfig
        A composed ``train`` config (:func:`ckpred.config.compose`).
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
    seeds = [int(x) for x in cfg.seeds]
    if len(seeds) <= 1:
        if seeds:
            cfg = _with(cfg, seed=seeds[0], seeds=[])
        return cross_validate_one(cfg, out_dir, on_fold)
    return cross_validate_seeds(cfg, out_dir, seeds, on_fold)


def _with(cfg: TrainConfig, **values: Any) -> TrainConfig:
    """A copy of ``cfg`` with top-level keys replaced (checked again by the schema)."""
    return dataclasses.replace(cfg, **values)


def cross_validate_seeds(cfg: TrainConfig, out_dir: Path, seeds: list[int], on_fold: OnFold | None = None) -> float:
    """:func:`cross_validate` once per seed, then the spread of every method over the seeds."""
    per_seed: dict[int, dict[str, Any]] = {}
    for i, seed in enumerate(seeds):
        sub = out_dir / f"seed{seed}"
        sub.mkdir(parents=True, exist_ok=True)
        one = _with(cfg, seed=seed, seeds=[], progress=False, save_pipeline=bool(cfg.save_pipeline) and i == 0,
                    plots=bool(cfg.plots) and i == 0)
        cross_validate_one(one, sub, on_fold if i == 0 else None)
        per_seed[seed] = json.loads((sub / "metrics.json").read_text())
    heading = per_seed[seeds[0]].get("_heading", "")
    first = {m: r for m, r in per_seed[seeds[0]].items() if isinstance(r, dict)}
    over = {m: ev.spread([per_seed[s][m] for s in seeds if m in per_seed[s]]) for m in first if "mean" in first[m]}
    records = {s: json.loads((out_dir / f"seed{s}" / RUN_RECORD).read_text()) for s in seeds}
    # the first seed's metrics as in a one-seed run, plus the spread of each method over the seeds
    payload = {"_heading": f"{heading}, seeds {seeds}", **first, "seeds": seeds, "over_seeds": over,
               "timings_s": {str(s): records[s]["timings_s"] for s in seeds}}
    ev.write_json(out_dir / "metrics.json", payload)
    if cfg.progress:
        record = records[seeds[0]]
        ev.print_summary(first, tuple(record.get("families", ())), out_dir, record["timings_s"],
                         heading=f"{heading}, seed {seeds[0]}", over_seeds=over)
    mean = over.get("model", {}).get("mean", {}).get("mean", float("nan"))
    log.info("model mean efficiency over seeds %s: %.4f -> %s", seeds, mean, out_dir)
    return float(mean)


# -- one seed ---------------------------------------------------------------------------------------
def cross_validate_one(cfg: TrainConfig, out_dir: Path, on_fold: OnFold | None = None) -> float:
    """One seed of :func:`cross_validate`: a table in this process, or a partitioned dataset
    with ``model.backend=dask`` (:func:`ckpred.cv.partitioned.cross_validate`)."""
    run = RunContext.start(cfg, out_dir)
    path = _partitioned_path(cfg)
    if path is not None:
        return partitioned.cross_validate(run, path)
    tables = load_tables(run)
    folds = run.scheme.plan(tables.train, tables.test, run.seed)
    unlisted = unlisted_new_gpus(run.op, tables, folds)
    if unlisted:
        print(f"note: zero-shot onto {', '.join(unlisted)} with no kernel list ({lists_key(run.op)}): every "
              f"rule-valid kernel of the training catalogue is ranked there through the training GPUs' "
              "applicability mask, and a kernel that GPU's library lacks can be picked (it scores 0); "
              "declare the new GPU's list (docs/ops.md, \"Hardware\")")
    methods, base = learned_methods(run, tables, folds)
    oof, final = run_folds(run, tables, folds, methods, on_fold)
    note = None
    if cfg.baselines.analytical and type(run.op).gemm_view is not OpDefinition.gemm_view:
        note = score_analytical([fold_test(tables.candidates, f) for f in folds], tables.candidates, run.op,
                                cfg.dtype, oof)
        if note:
            log.warning("analytical baseline %s", note)
    # zero-shot: the problems whose best kernel no training row has, apart (a new GPU's own kernels)
    seen = best_kernel_seen(tables, folds) if zero_shot(tables, folds) else None
    evaluation = evaluate(tables.candidates, oof, run.op, len(folds), bool(cfg.baselines.random),
                          labels=None if seen is None else {"best_kernel": seen})
    heading = run.scheme.heading(cv_group_names(run.op), len(folds))
    if methods[0].transfer is not None:
        heading += "; model = the transfer recipe"
    report = Report(cfg.cv.name, heading, evaluation.metrics, oof.log)
    if note:
        report.metrics["analytical"] = {"skipped": note}
    saved = final_pipeline(run, tables, methods[0], final)
    run.timings.finish()
    report.write(run.out_dir)
    write_tested_rows(run.out_dir, tables.candidates, oof, evaluation)
    if cfg.plots:
        write_plots(run.out_dir, evaluation.per_shape, evaluation.shapes["family"].to_numpy(), run.op.families,
                    report.metrics, saved)
    test_data = None if tables.test is tables.train else table_record(tables.test, run.op)
    record = run_record(cfg, run.op, table_record(tables.train, run.op), test_data, report, saved, run.timings)
    if methods[0].transfer is not None:
        record.model = "transfer"
    record.zero_shot = zero_shot(tables, folds)
    if base is not None:  # lineage into the run record (ckpred.warm_start)
        record.warm_start = warm_start.lineage(base, cfg, record, oof.log)
    if tables.coverage is not None:
        record.candidates = {"absence": getattr(run.op, "absence", "unknown"), **dataclasses.asdict(tables.coverage)}
    record.write(run.out_dir)
    return finish(run, report)


def _partitioned_path(cfg: TrainConfig) -> Path | None:
    """``data.path`` when it is a partitioned dataset trained with ``model.backend=dask``."""
    if cfg.model.backend != "dask" or cfg.data.source != "path" or not isinstance(cfg.data.path, str):
        return None
    path = resolve_path(cfg.data.path)
    return path if is_partitioned(path) else None


def load_tables(run: RunContext) -> Tables:
    """The prepared training table (its catalogue bound for a declared op) and the test table."""
    t = time.perf_counter()
    table = load_table(run.cfg)
    bind_training_catalogue(run.op, table, run.cfg)
    data = prepare(table, run.op, run.cfg)
    test = run.scheme.test_data(run.cfg, run.op, data)
    tables = Tables.of(data, test, run.op, run.cfg)
    run.timings.add("load_s", time.perf_counter() - t)
    log.info("data: %d rows, %d shapes (test table: %d rows, %d shapes; %d candidate rows)", len(data.table),
             data.groups.n_shapes, len(test.table), test.groups.n_shapes, len(tables.candidates.table))
    return tables


def zero_shot(tables: Tables, folds: list[Fold]) -> bool:
    """Whether every fold tests GPUs (arch names) that none of its training rows come from."""
    for fold in folds:
        trained = set(tables.train.arch_names(fold.train_shapes))
        tested = {str(fold.test_arch.name)} if fold.test_arch is not None else \
            set(tables.test.arch_names(fold.test_shapes))
        if not tested or trained & tested:
            return False
    return bool(folds)


def unlisted_new_gpus(op: OpDefinition, tables: Tables, folds: list[Fold]) -> list[str]:
    """The held-out GPUs (arch names) of a zero-shot run that list no kernels for ``op``, when the
    op's missing rows mean "not applicable" (none otherwise): the training GPUs' mask cannot know
    which of their kernels a new GPU's library lacks, only its list can."""
    if getattr(op, "absence", "unknown") != "not_applicable" or not zero_shot(tables, folds):
        return []
    test = tables.test
    archs: dict[str, ArchConfig] = {}
    for fold in folds:
        names = set(test.arch_names(fold.test_shapes))
        held = [fold.test_arch] if fold.test_arch is not None else \
            [a for a in (test.archs or (test.arch,)) if a is not None and str(a.name) in names]
        archs.update({str(a.name): a for a in held})
    return [name for name, arch in archs.items() if kernel_list(arch, op) is None]


def learned_methods(run: RunContext, tables: Tables, folds: list[Fold]) -> tuple[list[LearnedMethod], Any]:
    """The model and the enabled learned baselines (``plain``, ``reference``), and the warm
    start's base run (None for a cold start): the model, never the reference, continues from it.

    The model is the transfer recipe (:func:`ckpred.transfer.transfer_method`) with
    ``transfer.mode=on``, and with ``auto`` when every fold tests GPUs it does not train on
    (:func:`zero_shot`); else the config's model recipe."""
    cfg = run.cfg
    mode = str(cfg.transfer.mode)
    transfer = mode == "on" or (mode == "auto" and zero_shot(tables, folds))
    if transfer and cfg.warm_start:
        raise ConfigValueError("warm_start", cfg.warm_start,
                               "empty with the transfer recipe (warm starts continue the model recipe's booster; "
                               f"transfer.mode={mode} makes the model the transfer recipe here: set transfer.mode=off)")
    learned = [transfer_method(cfg) if transfer else model_method(cfg)]
    if cfg.baselines.plain.enabled:
        learned.append(plain_method(cfg))
    ref = cfg.baselines.reference
    if ref.enabled and ref.features is None:
        print(f"baseline reference skipped: op {run.op.name!r} has no features/reference_{run.op.name} set "
              "(name one with features@baselines.reference.features=<set>)")
    elif ref.enabled and ref.features is not None:
        learned.append(LearnedMethod("reference", recipe_config(cfg, ref.features, ref.model, ref.target), ref.rows))
    base = None
    if cfg.warm_start:
        base = warm_start.prepare(cfg, run.op, tables.train.X.head(8))
        learned[0].init_model = base.booster
    return learned, base


@dataclass
class Fit:
    """One (fold, method) fit: the fitted pipeline and its fit info (and, for the model of an op
    whose table lists only the applicable kernels, the fold's applicability mask)."""

    pipeline: Fitted
    info: dict[str, Any]
    applicability: Applicability | None = None


def fold_fits(run: RunContext, data: Prepared, jobs: list[tuple[LearnedMethod, np.ndarray, int]]) -> Iterator[Fit]:
    """Every ``(method, train_shapes, seed)`` job fitted, in order: here, or as tasks on a Dask
    cluster (``model.backend=dask``)."""
    if run.cfg.model.backend == "dask":  # Dask itself is imported only when the cluster starts
        fits = scale.fold_fits(run.cfg, data, run.op, jobs)
    else:
        fits = (fit_learned(method, data, shapes, run.op, run.cfg, s) for method, shapes, s in jobs)
    return (Fit(pipe, info) for pipe, info in fits)


def run_folds(run: RunContext, tables: Tables, folds: list[Fold], methods: list[LearnedMethod],
              on_fold: OnFold | None) -> tuple[OutOfFold, Fit | None]:
    """Fit every method on every fold's training shapes and score the fold's test rows.

    Returns the scores and, when a fold's model is the final fit itself (every training shape,
    the run's seed: ``external``), that fit.
    """
    cfg, data = run.cfg, tables.train
    oof = OutOfFold.start(tables.candidates, methods, bool(cfg.baselines.best_static))
    static_by = ev.best_static_by(cfg.baselines, run.op)
    shared = _learner_of_model(run, methods)
    jobs = [(method, fold.train_shapes, run.seed + i) for i, fold in enumerate(folds) for method in methods
            if method is not shared]
    fits = fold_fits(run, data, jobs)
    final = None
    with FoldProgress(bool(cfg.progress), len(folds) * len(methods)) as progress:
        for i, fold in enumerate(folds):
            side = fold_test(tables.candidates, fold)
            oof.begin_fold(i, side, tables, run.op, cfg)
            entry: dict[str, Any] = {"fold": fold.name,
                                     "test_shapes": [str(k) for k in tables.test.groups.keys[fold.test_shapes]]}
            model_fit: Fit | None = None
            for method in methods:
                progress.describe(f"{fold.name}: {method.name}")
                t, cpu = time.perf_counter(), time.process_time()
                # the transfer recipe's learner is the model's fit
                fit = _learner_fit(model_fit) if method is shared and model_fit is not None else next(fits)
                if method is methods[0] and tables.train_candidates is not None:
                    # the applicability mask every method's selection goes through, learned here (before
                    # the model is scored: the transfer recipe's learner scores with it); its seconds
                    # are its own, not the model's
                    progress.describe(f"{fold.name}: applicability mask")
                    mask = entry["applicability"] = _fit_applicability(run, tables, fold, i, method, fit, side, oof)
                    t, cpu = t + mask["fit_predict_s"], cpu + mask["fit_predict_cpu_s"]
                score_method(method, fit.pipeline, side, tables, run.op, cfg, oof)
                fit_times(fit.info, t, cpu, run.timings.seconds, method.name)
                if method is methods[0]:
                    model_fit = fit
                entry[method.name] = fit.info
                if method is methods[0] and _is_final_fit(fold, run.seed + i, data, run.seed):
                    final = fit
                progress.advance()
            if on_fold is not None:
                on_fold(i, oof.running_mean(tables.candidates))
            if cfg.baselines.best_static:
                entry["best_static"] = score_best_static(fold, side, tables, static_by, oof)
            oof.log.append(entry)
    return oof, final


def _learner_of_model(run: RunContext, methods: list[LearnedMethod]) -> LearnedMethod | None:
    """The learned baseline whose fit the model's transfer recipe makes anyway (``plain``: the
    recipe's learner is ``baselines.plain`` on the same rows, fitted with the same seed), so it is
    fitted once; None when there is none (or the fits run on a Dask cluster)."""
    if methods[0].transfer is None or run.cfg.model.backend == "dask":
        return None
    return next((m for m in methods[1:] if m.name == "plain" and m.recipe == methods[0].recipe
                 and m.rows == methods[0].rows and m.validity is None and m.init_model is None), None)


def _learner_fit(model_fit: Fit) -> Fit:
    """The transfer recipe's learner as a fit of its own (its fit info without the recipe's)."""
    info = {k: v for k, v in model_fit.info.items()
            if k not in ("recipe", "weight", "inner", "fit_predict_s", "fit_predict_cpu_s")}
    return Fit(model_fit.pipeline.learner, {**info, "fitted_as": "the model's transfer learner"})


def _fit_applicability(run: RunContext, tables: Tables, fold: Fold, i: int, method: LearnedMethod, fit: Fit,
                       side: FoldTest, oof: OutOfFold) -> dict[str, Any]:
    """Fit the fold's applicability mask on the model's features, mark the fold's test rows it
    keeps, and attach it to a transfer recipe's learner (whose scores then weigh it:
    :func:`ckpred.models.expected_throughput`); returns the fold's entry."""
    assert tables.train_candidates is not None
    t, cpu = time.perf_counter(), time.process_time()
    fit.applicability = fit_applicability(tables.train_candidates, fold.train_shapes, tables.train, run.op, run.cfg,
                                          run.seed + i, _ranking_pipeline(fit.pipeline), method)
    if isinstance(fit.pipeline, TransferModel):
        fit.applicability.attach(fit.pipeline.learner)
    entry = score_applicability(fit.applicability, method, fit.pipeline, side, tables, run.op, run.cfg, oof)
    fit_times(entry, t, cpu, run.timings.seconds, "applicability")
    return entry


def _is_final_fit(fold: Fold, fold_seed: int, data: Prepared, seed: int) -> bool:
    """Whether the fold's model fit is the final fit: every training shape, the run's seed."""
    shapes = np.asarray(fold.train_shapes)
    return fold_seed == seed and len(shapes) == data.groups.n_shapes and \
        np.array_equal(np.sort(shapes), np.arange(data.groups.n_shapes))


def _ranking_pipeline(pipe: Fitted) -> Pipeline:
    """The features -> model pipeline of a fit: the transfer recipe's learner, or ``pipe``."""
    return pipe.learner if isinstance(pipe, TransferModel) else pipe


def final_pipeline(run: RunContext, tables: Tables, model: LearnedMethod, fold_fit: Fit | None) -> SavedPipeline:
    """The final pipeline saved in the run directory (``save_pipeline``): a fold's model when it
    is the final fit already, else the model fitted on every shape; with its applicability mask
    for an op whose table lists only the applicable kernels."""
    if not run.cfg.save_pipeline:
        return SavedPipeline()
    data = tables.train
    if fold_fit is None:
        t = time.perf_counter()
        shapes = np.arange(data.groups.n_shapes)
        pipe, info = fit_learned(model, data, shapes, run.op, run.cfg, run.seed)
        fold_fit = Fit(pipe, info)
        if tables.train_candidates is not None:
            fold_fit.applicability = fit_applicability(tables.train_candidates, shapes, data, run.op, run.cfg,
                                                       run.seed, _ranking_pipeline(pipe), model)
        run.timings.add("final_fit_s", time.perf_counter() - t)
    if fold_fit.applicability is not None:
        fold_fit.applicability.attach(_ranking_pipeline(fold_fit.pipeline))
        fold_fit.info["applicability_threshold"] = fold_fit.applicability.threshold
    return SavedPipeline.save(run.out_dir, fold_fit.pipeline, fold_fit.info)
