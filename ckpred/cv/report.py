"""One run's context and its run directory, for both backends.

:class:`RunContext` is what every step of a run needs. ``metrics.json``, ``folds.json``,
``pipeline.joblib``, the plots and ``run.json`` (:class:`ckpred.runs.RunRecord`) are written
here whichever backend ran the folds; the table held in one process adds ``per_shape.csv`` and
``oof_predictions.parquet`` (:func:`write_tested_rows`), a partitioned dataset
``per_query.csv``. :func:`finish` prints the summary.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import joblib
import numpy as np
import pandas as pd

from ckpred import evaluate as ev
from ckpred.cv.schemes import CVScheme, scheme_for
from ckpred.cv.scoring import Evaluation, OutOfFold
from ckpred.data.table import content_hash, data_hash
from ckpred.fitting import Prepared
from ckpred.kernels.base import OpDefinition, load_op
from ckpred.models import booster, failure_model, target_name
from ckpred.runs import DataRecord, RunRecord
from ckpred.transfer import Fitted, TransferModel
from ckpred.schema import TrainConfig
from ckpred.util import sha256_file

log = logging.getLogger(__name__)

#: Fit-info keys kept out of the run record's ``pipeline`` (they are per fold: folds.json).
_PER_FOLD_INFO = ("train_shapes", "validation_shapes", "fit_predict_s", "fit_predict_cpu_s")


class Timings:
    """Seconds per step of one run (``run.json: timings_s``), from its start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def finish(self) -> None:
        self.seconds["total_s"] = time.perf_counter() - self.start

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in self.seconds.items()}


@dataclass
class RunContext:
    """What every step of one seed's run needs: the config, its op and CV scheme, the output
    folder, the seed and the timings."""

    cfg: TrainConfig
    op: OpDefinition
    scheme: CVScheme[Any]
    out_dir: Path
    seed: int
    timings: Timings

    @classmethod
    def start(cls, cfg: TrainConfig, out_dir: Path) -> "RunContext":
        return cls(cfg, load_op(cfg.op), scheme_for(cfg.cv), Path(out_dir), int(cfg.seed), Timings())


@dataclass
class Report:
    """What a run measured: what it held out (``heading``), per method its metrics, and per fold
    its test shapes or hash range and each fit's info."""

    cv: str
    heading: str
    metrics: dict[str, Any]
    folds: list[dict[str, Any]] = field(default_factory=list)

    def write(self, out_dir: Path) -> None:
        """``metrics.json`` (``_heading``: the grouping key and the folds) and ``folds.json``."""
        ev.write_json(out_dir / "metrics.json", {"_heading": self.heading, **self.metrics})
        ev.write_json(out_dir / "folds.json", {"cv": self.cv, "folds": self.folds})

    @property
    def model_mean(self) -> float:
        return float(self.metrics.get("model", {}).get("mean", float("nan")))


@dataclass
class SavedPipeline:
    """The final pipeline as saved in the run directory (none when ``save_pipeline=false``)."""

    pipeline: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    sha256: str | None = None
    feature_names: list[str] = field(default_factory=list)

    @classmethod
    def save(cls, out_dir: Path, pipeline: Fitted | None, info: dict[str, Any]) -> "SavedPipeline":
        """Save ``pipeline`` (a Pipeline, or a :class:`ckpred.transfer.TransferModel` whose
        learner is one) as ``pipeline.joblib``."""
        if pipeline is None:
            return cls()
        joblib.dump(pipeline, out_dir / "pipeline.joblib", compress=3)
        learner = pipeline.learner if isinstance(pipeline, TransferModel) else pipeline
        names = [str(n) for n in learner.named_steps["features"].get_feature_names_out()]
        return cls(pipeline, info, sha256_file(out_dir / "pipeline.joblib"), names)

    def record(self) -> dict[str, Any]:
        """The run record's ``pipeline``: file, sha256 and the final fit's info."""
        return {"file": "pipeline.joblib" if self.pipeline is not None else None, "sha256": self.sha256,
                **{k: v for k, v in self.info.items() if k not in _PER_FOLD_INFO}}


def write_plots(out_dir: Path, per_shape: dict[str, pd.DataFrame], family: np.ndarray,
                families: tuple[str, ...], metrics: dict[str, Any], saved: SavedPipeline) -> None:
    """The efficiency CDF per method, efficiency@k, and the final model's feature importance."""
    plot_efficiency_cdf(per_shape, family, families, out_dir / "efficiency_cdf.png")
    plot_efficiency_at_k({m: r for m, r in metrics.items() if "mean" in r}, out_dir / "efficiency_at_k.png")
    if saved.pipeline is not None:
        plot_feature_importance(saved.feature_names,
                                booster(getattr(saved.pipeline, "learner", saved.pipeline))
                                .feature_importance(importance_type="gain"),
                                out_dir / "feature_importance.png")


def plot_efficiency_cdf(per_shape: Mapping[str, pd.DataFrame], family: np.ndarray,
                        families: Sequence[str], path: Path) -> Path:
    """Empirical CDF of per-shape efficiency, one panel per M family, a line per method."""
    plt = ev.pyplot()
    present = [f for f in families if np.any(family == f)]
    fig, axes = plt.subplots(1, max(len(present), 1), figsize=(4 * max(len(present), 1), 3.4), squeeze=False)
    for ax, fam in zip(axes[0], present):
        for method, frame in per_shape.items():
            eff = np.sort(frame.loc[family == fam, "efficiency"].dropna().to_numpy())
            if len(eff):
                ax.step(eff, np.arange(1, len(eff) + 1) / len(eff), where="post", label=method)
        ax.set_title(f"{fam} (n={int(np.sum(family == fam))})")
        ax.set_xlabel("efficiency (chosen / best)")
        ax.set_xlim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of shapes")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_efficiency_at_k(reports: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Mean efficiency@k for k in :data:`ev.EFFICIENCY_KS`, a line per method."""
    plt = ev.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method, rep in reports.items():
        ys = [rep.get(f"efficiency@{k}", np.nan) for k in ev.EFFICIENCY_KS]
        ax.plot(ev.EFFICIENCY_KS, ys, marker="o", label=method)
    ax.set_xscale("log")
    ax.set_xticks(ev.EFFICIENCY_KS, [str(k) for k in ev.EFFICIENCY_KS])
    ax.set_xlabel("k (top-k kernels benchmarked, best kept)")
    ax.set_ylabel("mean efficiency@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_feature_importance(names: Sequence[str], gains: np.ndarray, path: Path, top: int = 30) -> Path:
    """Horizontal bar chart of the ``top`` features by total split gain."""
    plt = ev.pyplot()
    gains = np.asarray(gains, dtype=np.float64)
    total = gains.sum() or 1.0
    idx = np.argsort(-gains, kind="stable")[:top][::-1]
    fig, ax = plt.subplots(figsize=(6, 0.22 * len(idx) + 1.2))
    ax.barh([names[i] for i in idx], gains[idx] / total)
    ax.set_xlabel("share of total split gain")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_tested_rows(out_dir: Path, test: Prepared, oof: OutOfFold, evaluation: Evaluation) -> None:
    """``per_shape.csv`` (one row per tested shape: its best kernel, each method's pick and
    efficiency) and ``oof_predictions.parquet`` (every tested candidate row: fold, measured
    perf, ``selectable`` = the rules narrowed by the applicability mask, each method's score; and
    ``measured`` when some candidate has no measurement)."""
    tested, groups = evaluation.tested, evaluation.groups
    kernel_names = test.table["kernel_name"].to_numpy()[tested]
    frame = evaluation.shapes.copy()
    frame.insert(1, "fold", oof.fold_of_row[np.flatnonzero(tested)[groups.first_rows()]])
    frame["n_candidates"] = next(iter(evaluation.per_shape.values()))["n_candidates"].to_numpy()
    for name, ps in evaluation.per_shape.items():
        frame[f"{name}_efficiency"] = ps["efficiency"].to_numpy()
        frame[f"{name}_efficiency@5"] = ps["efficiency@5"].to_numpy()
        frame[f"{name}_top1"] = ps["top1"].to_numpy()
        if name != "random":
            chosen = ps["chosen_row"].to_numpy()
            frame[f"{name}_kernel"] = np.where(chosen >= 0, kernel_names[np.maximum(chosen, 0)], "")
    frame.to_csv(out_dir / "per_shape.csv", index=False)
    rows = pd.DataFrame({"shape": test.groups.keys[test.groups.codes[tested]],
                         "fold": oof.fold_of_row[tested], "kernel_name": kernel_names,
                         "tflops": test.table["tflops"].to_numpy()[tested], "perf": test.perf[tested],
                         "is_valid": test.table["is_valid"].to_numpy()[tested],
                         "selectable": oof.candidate_mask(tested, groups)[0]})
    measured = test.measured[tested]
    if not measured.all():  # candidates the table has no row for (a table that measures all has no column)
        rows["measured"] = measured
    for name, scores in oof.scores.items():
        rows[f"score_{name}"] = scores[tested]
    rows.to_parquet(out_dir / "oof_predictions.parquet", index=False)


def table_record(data: Prepared, op: OpDefinition) -> DataRecord:
    """The run record's ``data`` for a table held in one process."""
    return DataRecord(hash=data_hash(data.table), content_hash=content_hash(data.table), rows=int(len(data.table)),
                      shapes=int(data.groups.n_shapes),
                      valid_rows=int(data.table["is_valid"].sum()),
                      shape_ranges={c: _field_range(data.table[c]) for c in op.problem_names})


def _field_range(column: pd.Series) -> list[Any]:
    """A problem field's range in the run record: [min, max] of a number, the sorted values of a category."""
    if pd.api.types.is_numeric_dtype(column):
        return [int(column.min()), int(column.max())]
    return sorted(str(v) for v in column.unique())


def _catalogue_hash(op: OpDefinition, cfg: TrainConfig) -> str | None:
    try:
        return op.catalogue_hash(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))
    except (ValueError, KeyError, NotImplementedError) as exc:
        log.info("no kernel catalogue for %s/%s/%s: %s", cfg.arch.name, cfg.dtype.name, cfg.layout.name, exc)
        return None


def run_record(cfg: TrainConfig, op: OpDefinition, data: DataRecord, test_data: DataRecord | None, report: Report,
               saved: SavedPipeline, timings: Timings) -> RunRecord:
    """The run record of a finished run (either backend)."""
    return RunRecord(
        op=op.name, arch=cfg.arch.name, dtype=cfg.dtype.name, layout=cfg.layout.name, model=cfg.model.name,
        target=target_name(cfg.model, cfg.target), features=cfg.features.name,
        feature_names=saved.feature_names, input_names=list(op.input_names),
        catalogue_hash=_catalogue_hash(op, cfg), data=data, test_data=test_data,
        cv=cfg.cv.name, n_folds=len(report.folds), seed=int(cfg.seed), backend=str(cfg.model.backend),
        heading=report.heading, families=list(op.families),
        failure_model=saved.pipeline is not None and failure_model(saved.pipeline) is not None,
        pipeline=saved.record(),
        metrics={m: {k: v for k, v in r.items() if not isinstance(v, dict)} for m, r in report.metrics.items()},
        timings_s=timings.rounded(), config=asdict(cfg))


def finish(run: RunContext, report: Report, heading: str | None = None) -> float:
    """Print the summary (``progress``; under ``heading``, default the report's) and return the
    model's mean efficiency."""
    if run.cfg.progress:
        ev.print_summary(report.metrics, run.op.families, run.out_dir, run.timings.seconds,
                         heading=heading or report.heading)
    log.info("model mean efficiency %.4f (%s) in %.1fs -> %s", report.model_mean, run.cfg.cv.name,
             run.timings.seconds["total_s"], run.out_dir)
    return report.model_mean
