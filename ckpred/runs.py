"""Reading a finished ``train`` run directory back (for ``export run_dir=...`` and warm starts).

A train run dir holds ``pipeline.joblib`` (with ``save_pipeline=true``), the run record
``run.json`` (:data:`RUN_RECORD`: the run's config, data hash, versions, metrics and the
pipeline's sha256) and the CV outputs. Both consumers need the same guarantees before they
trust the pickled pipeline: the files are there, and the pipeline is the one the record
describes. (An export directory's ``manifest.json`` is a different file: :mod:`ckpred.export.manifest`.)
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import joblib

from ckpred.evaluate import write_json
from ckpred.util import package_versions, resolve_path, sha256_file
from ckpred.errors import InputFileError, MissingFileError, ModelMismatchError

__all__ = ["RUN_RECORD", "DataRecord", "RunRecord", "TrainRun", "load_train_run", "run_record_path"]

#: The record ``train`` writes into its run directory.
RUN_RECORD = "run.json"
#: The same record's name in runs written before it was renamed; still read.
LEGACY_RUN_RECORD = "manifest.json"


#: Packages whose versions go into the run record.
RECORD_PACKAGES: tuple[str, ...] = ("ckpred", "lightgbm", "scikit-learn", "numpy", "pandas", "pyarrow", "hydra-core",
                                    "omegaconf", "scipy", "dask", "distributed")


@dataclass(kw_only=True)
class DataRecord:
    """What a run trained on: a table in one process (its hash, rows, shapes, valid rows and the
    range of each problem field) or a partitioned dataset (its folder, rows, partitions and
    arch/dtype/layout combos). Fields that do not apply are left out of ``run.json``."""

    rows: int
    hash: str | None = None
    shapes: int | None = None
    valid_rows: int | None = None
    shape_ranges: dict[str, list[Any]] | None = None
    partitioned: str | None = None
    partitions: int | None = None
    combos: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        order = ("hash", "rows", "shapes", "valid_rows", "shape_ranges", "partitioned", "partitions", "combos")
        values = asdict(self)
        return {k: values[k] for k in order if values[k] is not None}


@dataclass(kw_only=True)
class RunRecord:
    """The record ``train`` writes into its run directory (:data:`RUN_RECORD`), whichever backend
    ran it. Readers (``export run_dir=``, warm starts, replay, ``sweep-report``) take it as JSON."""

    op: str
    arch: str
    dtype: str
    layout: str
    model: str
    target: str
    features: str
    #: Output names of the saved pipeline's feature step (empty without a saved pipeline).
    feature_names: list[str]
    input_names: list[str]
    #: The op's kernel catalogue hash for (arch, dtype, layout); None when it has none there.
    catalogue_hash: str | None
    data: DataRecord
    #: The table the folds tested when it is not the training table (``cv=external``).
    test_data: DataRecord | None
    cv: str
    n_folds: int
    seed: int
    #: ``local`` or ``dask`` (``model.backend``).
    backend: str
    heading: str
    families: list[str]
    #: Whether the saved pipeline carries a learned failure model (each fold's: folds.json).
    failure_model: bool
    #: ``file`` and ``sha256`` of the saved pipeline (null without one) and its fit info.
    pipeline: dict[str, Any]
    #: Per method its headline metrics (metrics.json holds the breakdowns).
    metrics: dict[str, dict[str, Any]]
    timings_s: dict[str, float]
    config: dict[str, Any]
    #: The warm start's lineage (:func:`ckpred.warm_start.lineage`); None for a cold start.
    warm_start: dict[str, Any] | None = None
    #: The candidate set the folds ranked: the op's ``absence``, the tested problems, their
    #: rule-valid (problem, catalogue kernel) pairs and how many had no row
    #: (:class:`ckpred.fitting.Coverage`); None when not looked at (a partitioned dataset).
    candidates: dict[str, Any] | None = None
    command: str = "train"
    created: str = field(default_factory=lambda: datetime.now().astimezone().isoformat(timespec="seconds"))
    versions: dict[str, str] = field(default_factory=lambda: package_versions(RECORD_PACKAGES))
    argv: list[str] = field(default_factory=lambda: list(sys.argv))

    def to_json(self) -> dict[str, Any]:
        """The record as ``run.json`` holds it (``warm_start`` only for a warm start)."""
        out = {f: getattr(self, f) for f in ("command", "created", "op", "arch", "dtype", "layout", "model", "target",
                                             "features", "feature_names", "input_names", "catalogue_hash")}
        out["data"] = self.data.to_json()
        out["test_data"] = self.test_data.to_json() if self.test_data is not None else None
        out.update({f: getattr(self, f) for f in ("cv", "n_folds", "seed", "backend", "heading",
                                                  "families", "failure_model", "pipeline", "metrics", "timings_s",
                                                  "versions", "argv", "config")})
        if self.warm_start is not None:
            out["warm_start"] = self.warm_start
        if self.candidates is not None:
            out["candidates"] = self.candidates
        return out

    def write(self, run_dir: Path) -> Path:
        """Write the record into ``run_dir`` (NaN as null); returns its path."""
        return write_json(Path(run_dir) / RUN_RECORD, self.to_json())


def run_record_path(run_dir: str | Path) -> Path:
    """The run record of a train run directory: ``run.json``, or the ``manifest.json`` of a run
    written before the rename when only that exists."""
    run_dir = Path(run_dir)
    path, legacy = run_dir / RUN_RECORD, run_dir / LEGACY_RUN_RECORD
    return legacy if not path.is_file() and legacy.is_file() else path


@dataclass(frozen=True)
class TrainRun:
    """A loaded train run: its directory, fitted pipeline, run record (``{}`` if absent) and the
    pipeline file's sha256."""

    path: Path
    pipeline: Any
    sha256: str
    record: dict[str, Any] = field(default_factory=dict)


def load_train_run(run_dir: str | Path, *, purpose: str, require_record: bool) -> TrainRun:
    """Load and verify a train run directory.

    Parameters
    ----------
    run_dir : str or Path
        The run directory (resolved against the original working directory).
    purpose : str
        Who asks (``"export"``, ``"warm_start"``); starts every error message.
    require_record : bool
        Refuse a directory without a run record written by ``train`` (warm starts need its
        lineage). Without it, a run dir holding only ``pipeline.joblib`` is accepted; a record
        that is present is still checked against the pipeline.

    Returns
    -------
    TrainRun

    Raises
    ------
    ckpred.errors.MissingFileError
        When the directory, its pipeline or (``require_record``) its run record is missing.
    ckpred.errors.InputFileError
        When the run record was not written by ``train``.
    ckpred.errors.ModelMismatchError
        When ``pipeline.joblib`` is not the file the run record names (replaced or damaged).
    """
    path = resolve_path(run_dir)
    if not path.is_dir():
        raise MissingFileError(str(path), f"{purpose}: no such directory (expected a train run dir, "
                                          "e.g. runs/train/<time>)")
    record_file, pipeline_file = run_record_path(path), path / "pipeline.joblib"
    record: dict[str, Any] = {}
    if record_file.is_file():
        record = json.loads(record_file.read_text())
        if require_record and record.get("command") != "train":
            raise InputFileError(str(record_file), f"{purpose}: written by command {record.get('command')!r}, "
                                                   "expected a 'train' run dir")
    elif require_record:
        raise MissingFileError(str(record_file), f"{purpose}: missing; the directory is not a finished train run")
    if not pipeline_file.is_file():
        if record.get("command") == "train" or (path / "metrics.json").is_file():
            why = "the run was trained with save_pipeline=false; rerun it with save_pipeline=true"
        else:  # e.g. the folder Hydra made for a run that failed before writing anything
            logs = sorted(p.name for p in path.glob("*.log"))
            why = (f"{run_dir} is not a finished train run: it holds no run record, metrics or pipeline (the run "
                   f"failed or is still running{'; see ' + logs[0] if logs else ''})")
        raise MissingFileError(str(pipeline_file), f"{purpose}: no fitted pipeline in {run_dir} ({why})")
    sha = sha256_file(pipeline_file)
    recorded = (record.get("pipeline") or {}).get("sha256")
    if (recorded or require_record) and recorded != sha:
        raise ModelMismatchError(f"{purpose}: {pipeline_file}: sha256 {sha} differs from the run record's "
                                 f"{recorded} (the pipeline was replaced or damaged after training)")
    return TrainRun(path=path, pipeline=joblib.load(pipeline_file), sha256=sha, record=record)
