"""The CV driver on a partitioned dataset with ``model.backend=dask`` (:mod:`ckpred.scale`).

Folds hold out queries by a stable hash of their key (the scheme's
:meth:`~ckpred.cv.schemes.CVScheme.hash_ranges`: ``group_kfold`` gives ``cv.n_splits`` equal
ranges, ``holdout`` the first ``cv.test_fraction`` of the range). Each fold trains on the
cluster and scores its held-out queries there, with the no-learning baselines of
``cfg.baselines`` on the same queries: ``random`` (analytic, per query), ``best_static`` (the
per-kernel sums and counts of the fold's training queries, computed per partition and added up
on the client: :func:`ckpred.scale.best_static_order`, equal to the in-memory order on the same
training queries) and ``analytical`` (with each partition's own arch and dtype constants;
skipped, with the reason, when any partition lacks what it needs). The final model trains on
every query.

With ``validity.learned`` every fit also learns the failure model on its training rows
(:func:`ckpred.scale.fit_partitioned`, on the cluster); the model is then scored on the
rule-valid kernels its failure model predicts to run (as in the in-memory CV), each fold's
entry in ``folds.json`` says whether a failure model was kept and how many training rows
failed, and the run record's ``failure_model`` says whether the saved pipeline carries one.

The run directory holds what the in-memory run writes (:mod:`ckpred.cv.report`), with
``per_query.csv`` (one row per held-out query and method: ``method`` column) in place of
``per_shape.csv``. Not computed, as they need the table in one process or more fits: the
out-of-fold row scores (``oof_predictions.parquet``), the learned baselines ``plain`` and
``reference`` and breakdowns by categorical problem fields.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ckpred import evaluate as ev
from ckpred import scale
from ckpred.cv.report import Report, RunContext, SavedPipeline, finish, run_record, write_plots
from ckpred.cv.schemes import CVScheme, registered_schemes
from ckpred.data.partitions import COMBO_COLUMNS, read_manifest
from ckpred.errors import ConfigValueError
from ckpred.fitting import model_method
from ckpred.runs import DataRecord

if TYPE_CHECKING:  # the optional dask extra
    from distributed import Client

log = logging.getLogger(__name__)


@dataclass
class Dataset:
    """A partitioned dataset on the cluster: its folder, manifest, and its files with each file's worker."""

    path: Path
    manifest: dict[str, Any]
    placed: scale.Placed

    def record(self) -> DataRecord:
        parts = self.manifest["partitions"]
        return DataRecord(partitioned=str(self.path), rows=self.manifest["rows"], partitions=len(parts),
                          combos=sorted({"/".join(p[c] for c in COMBO_COLUMNS) for p in parts}))


def _hash_ranges(run: RunContext) -> list[tuple[float, float]]:
    ranges = run.scheme.hash_ranges()
    if ranges is None:
        able = [n for n, cls in registered_schemes().items() if cls.hash_ranges is not CVScheme.hash_ranges]
        raise ConfigValueError("cv", run.cfg.cv.name, f"{' or '.join(able)} with a partitioned dataset "
                               "(model.backend=dask): folds hold out queries by a hash of their key")
    return ranges


def cross_validate(run: RunContext, path: Path) -> float:
    """``train`` on a partitioned dataset with ``model.backend=dask``; returns the mean efficiency."""
    cfg = run.cfg
    if cfg.warm_start:
        raise ConfigValueError("warm_start", cfg.warm_start, "empty with a partitioned dataset (model.backend=dask)")
    if getattr(run.op, "absence", "unknown") != "unknown":
        # the applicability mask learns on every candidate pair of the training problems, in one process
        raise ConfigValueError("op.absence", run.op.absence, "unknown with a partitioned dataset "
                               "(model.backend=dask): a table that lists only the applicable kernels trains in one process")
    ranges = _hash_ranges(run)
    baselines, static_by = scale.baselines_of(cfg, run.op)
    scale.check_recipe(model_method(cfg).recipe)  # config and manifest are refused before a cluster starts
    manifest = read_manifest(path, run.op)
    files = scale.partition_files(path, run.op, manifest)
    with scale.dask_client(cfg.model.dask) as client:
        # the files and workers are the same for every fit
        data = Dataset(path, manifest, scale.Placed(files, scale.placement(client, files, run.op, str(path))))
        per_query, folds, notes = [], [], set()
        for i, test in enumerate(ranges):
            scored, entry, skipped = _fold(run, data, client, i, test, (baselines, static_by))
            per_query.append(scored.assign(fold=i))
            folds.append(entry)
            notes.update(skipped)
        t = time.perf_counter()
        final, final_info = scale.fit_partitioned(cfg, run.op, path, backend="dask", client=client,
                                                  placed=data.placed) if cfg.save_pipeline else (None, {})
        run.timings.add("final_fit_s", time.perf_counter() - t)
    report, per_shape, table = _report(run, pd.concat(per_query, ignore_index=True), folds, sorted(notes), len(ranges))
    saved = SavedPipeline.save(run.out_dir, final, final_info)
    run.timings.finish()
    report.write(run.out_dir)
    first = ["fold", "method", "query", "family"]
    table[first + [c for c in table.columns if c not in first]].to_csv(run.out_dir / "per_query.csv", index=False)
    if cfg.plots and per_shape:
        write_plots(run.out_dir, per_shape, per_shape["model"]["family"].to_numpy(), run.op.families,
                    report.metrics, saved)
    run_record(cfg, run.op, data.record(), None, report, saved, run.timings).write(run.out_dir)
    return finish(run, report, heading=f"{report.heading}, {manifest['rows']:,} rows")


def _fold(run: RunContext, data: Dataset, client: Client, i: int, test: tuple[float, float],
          baselines: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[pd.DataFrame, dict[str, Any], list[str]]:
    """Fit fold ``i`` (queries whose key hash is in ``test`` held out) on the cluster and score its
    held-out queries with the model and the baselines; returns the per-query rows, the fold's
    entry in ``folds.json`` and why the analytical baseline was skipped on some partitions."""
    cfg, seed = run.cfg, run.seed + i  # seeded per fold as the in-memory CV seeds its folds
    t = time.perf_counter()
    pipe, info = scale.fit_partitioned(cfg, run.op, data.path, backend="dask", client=client, test=test,
                                       placed=data.placed, seed=seed)
    entry = {"fold": f"fold{i}", "seed": seed, "test_hash_range": list(test), **info,
             "fit_score_s": round(time.perf_counter() - t, 2)}
    run.timings.add("model_s", entry["fit_score_s"])
    part = scale.scoring_recipe(cfg, run.op, test, *baselines)
    static = None
    if "best_static" in baselines[0]:
        t = time.perf_counter()
        static = scale.best_static_order(part, data.placed.files, client)
        entry["best_static"] = {"top_kernels": static.sort_values(ascending=False, kind="stable")
                                .head(5).round(4).to_dict()}
        run.timings.add("best_static_s", time.perf_counter() - t)
    scored, skipped = scale.score_all(pipe, part, data.placed.files, client, static)
    return scored, entry, skipped


def _report(run: RunContext, table: pd.DataFrame, folds: list[dict[str, Any]], notes: list[str],
            n_folds: int) -> tuple[Report, dict[str, pd.DataFrame], pd.DataFrame]:
    """The report of every method from the per-query rows of every fold (the analytical
    baseline dropped when some partitions could not score it: not comparable with the others)."""
    if notes:
        table = table[table["method"] != "analytical"]
        log.warning("analytical baseline %s", "; ".join(notes))
    # one frame per method, its queries in one order (each method scores every held-out query)
    per_shape = {m: table[table["method"] == m].sort_values(["fold", "query"], kind="stable").reset_index(drop=True)
                 for m in ev.METHODS if (table["method"] == m).any()}
    metrics: dict[str, Any] = {
        m: ev.method_report(ps, ps["family"].to_numpy(), run.op.families,
                            ps["best_pipeline"].to_numpy() if "best_pipeline" in ps else None,
                            fold=ps["fold"].to_numpy() if n_folds > 1 else None)
        for m, ps in per_shape.items()}
    if notes:
        metrics["analytical"] = {"skipped": "; ".join(notes)}
    heading = f"queries held out by key hash, {run.cfg.cv.name} ({n_folds} folds), Dask"
    return Report(run.cfg.cv.name, heading, metrics, folds), per_shape, table
