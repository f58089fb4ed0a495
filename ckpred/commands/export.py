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
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from sklearn.pipeline import Pipeline

from ckpred.autotune import calibration_from_oof
from ckpred.data import load_table
from ckpred.data.table import content_hash
from ckpred.errors import ConfigValueError, ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export.build import ExportOptions, export_pipeline, node_name
from ckpred.export.strategies import (Strategy, cv_efficiency, fit_reranker, keep_for_table, reranker_size,
                                      strategy_scores)
from ckpred.fitting import fit_final
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.kernels.declared import bind_training_catalogue
from ckpred.runs import RUN_RECORD, load_train_run
from ckpred.schema import ExportConfig, RecipeConfig, saved_recipe
from ckpred.transfer import TransferModel
from ckpred.util import check_replaceable, resolve_path


class Steps:
    """A command's steps as they happen: each is printed with its time once done, the current
    one shown with a spinner (export and plan otherwise work for tens of seconds without a word)."""

    def __init__(self, command: str = "export") -> None:
        self.command = command
        self.bar = Progress(SpinnerColumn(), TextColumn(f"{command}: {{task.description}}"), TimeElapsedColumn(),
                            transient=True)
        self.task = self.bar.add_task("starting", total=None)
        self.current, self.t0 = "", time.perf_counter()

    def __enter__(self) -> "Steps":
        self.bar.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self._done()
        self.bar.__exit__(exc_type, exc, tb)

    def _done(self) -> None:
        if self.current:
            self.bar.console.print(f"{self.command}: {self.current} ({time.perf_counter() - self.t0:.1f} s)")

    def step(self, text: str) -> None:
        """The current step is done (printed with its time); ``text`` starts."""
        self._done()
        self.current, self.t0 = text, time.perf_counter()
        self.bar.update(self.task, description=text)


def strategy_cv(run_dir: Path, table: pd.DataFrame, op: OpDefinition, cfg: ExportConfig,
                recipe: RecipeConfig, select: str | None = None,
                steps: Steps | None = None) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Per-shape efficiency of the exported strategy under the run's CV, next to the full model's.

    The candidate set (and the reranker) of each fold are learned from its training shapes only
    (:func:`ckpred.export.strategies.strategy_scores`), so the figures say what the selector
    being exported achieves on unseen shapes, not what ``train`` reported for the full model.

    Returns
    -------
    report : dict
        The manifest's ``selection.cv`` (``skipped`` and why, when the run's CV cannot say).
    oof : DataFrame or None
        The run's out-of-fold rows with the strategy's own scores (``score_model`` replaced,
        ``selectable`` restricted to the fold's candidates), for the autotune calibration; None
        when skipped.

    ``select`` is the strategy exported (default ``cfg.select``; ``pruned`` when the training
    data leave nothing to rerank).
    """
    oof = pd.read_parquet(run_dir / "oof_predictions.parquet").reset_index(drop=True)
    tested, trained = set(pd.unique(oof["shape"])), set(pd.unique(np.asarray(op.shape_keys(table))))
    if tested != trained or oof["fold"].nunique() < 2:
        # external / holdout CV: the tested shapes are not the training table's folds, so the
        # candidates and reranker of a fold cannot be relearned from "the other folds".
        return {"skipped": f"the run's CV tested {len(tested)} shapes in {oof['fold'].nunique()} fold(s), "
                           f"its training table has {len(trained)}: a per-fold report needs k-fold CV over "
                           "the training shapes"}, None
    select = select or cfg.select
    kw: dict[str, Any] = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, recipe=recipe, seed=int(cfg.seed))
    reranker = asdict(cfg.reranker) if select == "reranked" else None
    folds = int(oof["fold"].nunique())

    def on_fold(i: int) -> None:
        if steps is not None:
            steps.step(f"the {select} selector under the run's CV, fold {i + 1} of {folds}")

    scored = strategy_scores(oof, table, op, Strategy(top_n=int(cfg.prune_top_n), reranker=reranker, **kw),
                             on_fold=on_fold)
    out: dict[str, Any] = {"folds": int(oof["fold"].nunique())}
    for name, top_n, rr, given in (("full", None, None, None), (select, int(cfg.prune_top_n), reranker, scored)):
        eff = cv_efficiency(oof, table, op, Strategy(top_n=top_n, reranker=rr, **kw),
                            scored=given)["efficiency"].dropna().to_numpy()
        out[name] = {"shapes": int(len(eff)), "mean": float(eff.mean()), "p10": float(np.percentile(eff, 10))}
    scores, allowed, _ = scored
    return out, oof.assign(score_model=scores, selectable=oof["selectable"].to_numpy(bool) & allowed)


def _check_run_matches(cfg: ExportConfig, run_cfg: RecipeConfig, run_dir: Path,
                       keys: tuple[str, ...] = ("op", "arch", "dtype", "layout")) -> None:
    diffs = []
    for key in keys:
        mine, theirs = node_name(getattr(cfg, key)), node_name(getattr(run_cfg, key))
        if mine != theirs:
            diffs.append(f"{key}: run has {theirs!r}, this export config has {mine!r} (pass {key}={theirs})")
    if diffs:
        raise ModelMismatchError(f"{run_dir} was trained for a different target: " + "; ".join(diffs))


@dataclass
class _Source:
    """Where the exported pipeline comes from, and the data it was trained on."""

    pipeline: Pipeline
    #: The training table (for the problem ranges, the parity shapes and the candidates).
    table: pd.DataFrame
    #: The config that loads ``table`` and holds the training recipe (the run's own, for run_dir).
    data_cfg: RecipeConfig
    #: The manifest's ``source`` section.
    record: dict[str, Any]
    metrics: dict[str, Any] | None = None
    #: The train run directory (run_dir=), else None.
    run_dir: Path | None = None
    #: Its run record (``run.json``), else None.
    run_record: dict[str, Any] | None = None

    @property
    def oof_file(self) -> Path | None:
        """The run's out-of-fold predictions, when it has them."""
        path = self.run_dir / "oof_predictions.parquet" if self.run_dir is not None else None
        return path if path is not None and path.is_file() else None


def _from_run_dir(cfg: ExportConfig, op: OpDefinition, steps: Steps) -> _Source:
    """The finished train run ``cfg.run_dir``: its pipeline, checked against its record and config."""
    run = load_train_run(cfg.run_dir, purpose="export", require_record=False)
    run_dir, train_record = run.path, run.record
    # the transfer recipe is made for GPUs it did not train on: any arch
    identity = ("op", "dtype", "layout") if isinstance(run.pipeline, TransferModel) else ("op", "arch", "dtype", "layout")
    for key in identity:
        theirs = train_record.get(key)
        if isinstance(theirs, str) and theirs != node_name(getattr(cfg, key)):
            raise ModelMismatchError(f"{run_dir}/{RUN_RECORD}: {key} is {theirs!r}, this export config "
                                     f"has {node_name(getattr(cfg, key))!r} (pass {key}={theirs})")
    # The run's own config says which data it trained on (for the ranges and the parity shapes).
    run_cfg_path = run_dir / ".hydra" / "config.yaml"
    data_cfg: RecipeConfig = cfg
    if isinstance(train_record.get("config"), dict):
        data_cfg = saved_recipe(train_record["config"])
    elif run_cfg_path.is_file():
        data_cfg = saved_recipe(run_cfg_path)
    if data_cfg is not cfg:
        _check_run_matches(cfg, data_cfg, run_dir, identity)
    steps.step("loading the run's training table")
    table = load_table(data_cfg)
    bind_training_catalogue(op, table, data_cfg)
    trained = train_record.get("data") or {}
    record = {"kind": "run_dir", "run_dir": str(run_dir), "pipeline_sha256": run.sha256,
              "train_data_hash": trained.get("hash"), "train_content_hash": trained.get("content_hash")}
    return _Source(run.pipeline, table, data_cfg, record, metrics=train_record.get("metrics"), run_dir=run_dir,
                   run_record=train_record)


def _fit_here(cfg: ExportConfig, op: OpDefinition, steps: Steps) -> _Source:
    """The config's pipeline, fitted on all rows of its data (:func:`ckpred.fitting.fit_final`)."""
    steps.step("loading the training table")
    table = load_table(cfg)
    _check_trained_arch(cfg, table)
    bind_training_catalogue(op, table, cfg)
    steps.step(f"fitting the model on all {len(table):,} rows")
    t0 = time.perf_counter()
    pipeline = fit_final(cfg, table, op)
    record = {"kind": "fit", "fit_seconds": round(time.perf_counter() - t0, 2),
              "config": asdict(cfg)}
    return _Source(pipeline, table, cfg, record)


def _check_trained_arch(cfg: ExportConfig, table: pd.DataFrame) -> None:
    """Refuse to fit a model here for a GPU the table holds no row of: ``train`` fits the transfer
    recipe for such a GPU and cross-validation scores it, while the model fitted here would be
    the config's own recipe, which no run has scored on a GPU it did not train on."""
    archs = sorted(table["arch"].astype(str).unique()) if "arch" in table else []
    if archs and str(cfg.arch.name) not in archs:
        raise ConfigValueError(
            "arch", cfg.arch.name,
            f"one of the training table's GPUs ({', '.join(archs)}) to fit the model here; for a GPU it did not "
            "train on, export the run of 'python -m ckpred train' (run_dir=<its folder>), whose model is the "
            "transfer recipe its cross-validation scored on GPUs left out (docs/guide.md, 'A new GPU')")


def _parity_problems(cfg: ExportConfig, table: pd.DataFrame, op: OpDefinition) -> pd.DataFrame:
    """The training problems the parity check scores (a seeded sample of ``parity.shapes``)."""
    problems = table[list(op.problem_names)].drop_duplicates()
    if cfg.parity.shapes and len(problems) > cfg.parity.shapes:
        problems = problems.sample(cfg.parity.shapes, random_state=int(cfg.seed))
    return problems


@dataclass
class _Strategy:
    """What the selector graph scores (:mod:`ckpred.export.strategies`)."""

    #: ``full``, ``pruned`` or ``reranked``: ``cfg.select``, or ``pruned`` when nothing is left to rerank.
    select: str
    #: Catalogue ids of the candidates (None for full).
    candidates: np.ndarray | None = None
    #: The manifest's ``selection`` section (None for full).
    selection: dict[str, Any] | None = None
    reranker: Pipeline | None = None
    #: The run's out-of-fold rows scored by the strategy (None when not computed).
    scored: pd.DataFrame | None = None


def _strategy(cfg: ExportConfig, src: _Source, op: OpDefinition, steps: Steps) -> _Strategy:
    """Candidates, ``selection`` section and reranker of ``select=pruned|reranked``, and the
    run's out-of-fold rows scored by the strategy."""
    if isinstance(src.pipeline, TransferModel):
        if cfg.select != "full":
            print(f"select={cfg.select}: the run's model is the transfer recipe, which ranks every catalogue kernel "
                  "(its static order and rank percentiles are over all of them); exporting select=full")
        return _Strategy("full")
    if cfg.select not in ("pruned", "reranked"):
        return _Strategy(cfg.select)
    table, reranker, scored, select = src.table, None, None, cfg.select
    top_n = int(cfg.prune_top_n)
    steps.step("learning the candidate kernels")
    candidates = keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=top_n)
    selection: dict[str, Any] = {"top_n": top_n,
                                 "learned_from_shapes": int(len(table[list(op.problem_names)].drop_duplicates()))}
    if cfg.select == "reranked":
        # The reranker follows the recipe the pipeline was trained with (the run's, for run_dir).
        size = reranker_size(asdict(cfg.reranker), src.data_cfg.model)
        steps.step(f"fitting the reranker ({size['n_estimators']} trees) on the {len(candidates)} candidates")
        reranker = fit_reranker(table, op, candidates, Strategy(cfg.arch, cfg.dtype, cfg.layout, reranker=size,
                                                                recipe=src.data_cfg, seed=int(cfg.seed)))
        if reranker is None:
            select = "pruned"
            print(f"select=reranked: no training shape has two candidate kernels ({len(candidates)} candidates "
                  f"learned from {selection['learned_from_shapes']} shapes), so there is nothing to rerank; "
                  "exporting select=pruned (the candidates scored by the full model)")
        else:
            selection["reranker"] = size
    if cfg.run_dir and src.oof_file is not None:
        assert src.run_dir is not None  # cfg.run_dir and its out-of-fold file
        selection["cv"], scored = strategy_cv(src.run_dir, table, op, cfg, src.data_cfg, select, steps)
    return _Strategy(select, candidates, selection, reranker, scored)


def _calibration(cfg: ExportConfig, src: _Source, op: OpDefinition, strategy: _Strategy) -> dict[str, Any] | None:
    """The confidence budget's calibration, fitted on the out-of-fold scores of the strategy
    being exported (``full``: the run's own; ``pruned``/``reranked``: ``strategy.scored``, the fold's
    candidates and reranker learned on its training shapes), or None (no ``run_dir``, no
    out-of-fold predictions, ``autotune.enabled=false``, or a strategy the run's CV cannot
    score; printed)."""
    if not (cfg.run_dir and src.oof_file is not None and cfg.autotune.enabled):
        return None
    select = strategy.select
    oof = pd.read_parquet(src.oof_file) if select == "full" else strategy.scored
    if oof is None:
        print(f"no autotune calibration: the {select} selector's out-of-fold scores need k-fold CV over the "
              "training shapes (see selection.cv); the Confidence budget is unavailable for this export")
        return None
    options = asdict(cfg.autotune)
    options.pop("enabled")
    kind = options.pop("kind")
    # fitted on GPUs the folds never trained on: a selector on a new GPU is what it measured
    policy = {"fallback_k": options.pop("fallback_k"), "min_problems": options.pop("min_problems"),
              "zero_shot": bool((src.run_record or {}).get("zero_shot", False))}
    ids = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).set_index("kernel_name")["kernel_id"]
    # the logistic model reads the problem's integer fields, as both runtimes pass them
    fields = [f.name for f in op.problem_fields if f.kind == "int"]
    table = src.table
    problems = table[fields].assign(shape=np.asarray(op.shape_keys(table))).drop_duplicates("shape")
    if kind == "table":
        out = calibration_from_oof(oof, ids, **policy, **options)
    elif not set(pd.unique(oof["shape"])) <= set(problems["shape"]):
        # an external test table: its problems' field values are not in the training table
        print("autotune calibration: the run tested problems outside its training table; fitting the score-gap "
              "table (autotune.kind=table) instead of the logistic model")
        out = calibration_from_oof(oof, ids, **policy, **options)
    else:
        out = calibration_from_oof(oof, ids, kind="logistic", problems=problems.set_index("shape")[fields],
                                   within=options["within"], max_k=options["max_k"], **policy)
    if out.get("note"):
        print(f"autotune calibration: {out['note']} (autotune.fallback_k; within "
              f"{', '.join(f'{w:g}' for w in out['uninformative_within'])})")
    return {**out, "select": select}


def _report(select: str, manifest: dict[str, Any], target: Path) -> None:
    """Print the parity figures, the strategy's CV figures and the file sizes."""
    par = manifest["parity"]
    if par.get("checked"):
        print(f"parity on {par['shapes']} shapes x {manifest['catalogue']['count']} kernels: top-1 agreement "
              f"{par['top1_agreement']:.2%}, top-{par['top_k']} {par['topk_agreement']:.2%}, max |diff| scorer "
              f"{par['max_abs_diff_scorer']:.3g}, selector {par['max_abs_diff_selector']:.3g}")
    cv = (manifest["selection"] or {}).get("cv")
    if cv and "skipped" in cv:
        print(f"no CV report of the {select} selector: {cv['skipped']}")
    elif cv:
        print(f"under the run's {cv['folds']}-fold CV: {select} selector mean efficiency "
              f"{cv[select]['mean']:.2%}, P10 {cv[select]['p10']:.2%} (full model {cv['full']['mean']:.2%}, "
              f"P10 {cv['full']['p10']:.2%}) on {cv['full']['shapes']} shapes")
    sizes = ", ".join(f"{k} {v['bytes'] / 1e6:.2f} MB" for k, v in manifest["files"].items())
    print(f"exported {target} ({sizes})")


def export_command(cfg: ExportConfig) -> str:
    """Task function of ``python -m ckpred export``; returns the export directory."""
    op = load_op(cfg.op)
    target = resolve_path(cfg.out_dir) / mf.export_name(op.name, node_name(cfg.arch), node_name(cfg.dtype),
                                                        node_name(cfg.layout))
    check_replaceable("out_dir", target, mf.EXPORT_DIR)  # before fitting: never replaces what ckpred did not write
    with Steps() as steps:
        src = _from_run_dir(cfg, op, steps) if cfg.run_dir else _fit_here(cfg, op, steps)
        manifest, strategy = _export(cfg, op, src, target, steps)
    _report(strategy.select, manifest, target)
    return str(target)


def _export(cfg: ExportConfig, op: OpDefinition, src: _Source, target: Path,
            steps: Steps) -> tuple[dict[str, Any], _Strategy]:
    """The strategy, the graphs, the parity check and the manifest of ``src``'s pipeline."""
    training = mf.training_section(src.table, op, source=str(src.data_cfg.data.source))
    # the content hash when the run recorded one: the files' names in ``source`` follow the
    # working directory, which may differ between train and export
    key, loaded = (("train_content_hash", content_hash(src.table.reset_index(drop=True)))
                   if src.record.get("train_content_hash") else ("train_data_hash", training["data_hash"]))
    if src.record.get(key) and src.record[key] != loaded:
        raise ModelMismatchError(
            f"the data this config loads (hash {loaded[:12]}) is not the data run_dir={cfg.run_dir} "
            f"was trained on (hash {src.record[key][:12]}): training ranges and parity would be wrong; "
            "export with the run's data settings")
    problems = _parity_problems(cfg, src.table, op)
    strategy = _strategy(cfg, src, op, steps)
    calibration = None
    if cfg.run_dir and src.oof_file is not None and cfg.autotune.enabled:
        steps.step("fitting the confidence budget's calibration")
        calibration = _calibration(cfg, src, op, strategy)
    steps.step(f"compiling the ONNX graphs, checking parity on {len(problems):,} shapes" if cfg.parity.check
               else "compiling the ONNX graphs")
    pipeline, transfer = src.pipeline, None
    if isinstance(pipeline, TransferModel):  # the learner's features with the exported arch's constants
        transfer = pipeline
        pipeline = transfer.learner_pipeline(op, src.data_cfg, cfg.arch, src.table)
        print(f"the transfer recipe trained on {', '.join(transfer.archs)}: static order weight "
              f"{transfer.weight:g}" + ("" if str(cfg.arch.name) in transfer.archs else
                                        f"; {cfg.arch.name} is a GPU it never trained on"))
    manifest = export_pipeline(pipeline, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=target,
                               training=training,
                               options=ExportOptions(parity_problems=problems if cfg.parity.check else None,
                                                     metrics=src.metrics, select=strategy.select,
                                                     max_abs_diff=cfg.parity.max_abs_diff, source=src.record,
                                                     candidates=strategy.candidates, selection=strategy.selection,
                                                     reranker=strategy.reranker, autotune=calibration,
                                                     transfer=transfer))
    return manifest, strategy
