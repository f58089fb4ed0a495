"""Reading a finished ``train`` run directory back (for ``export run_dir=...`` and warm starts).

A train run dir holds ``pipeline.joblib`` (with ``save_pipeline=true``), the run record
``run.json`` (:data:`RUN_RECORD`: the run's config, data hash, versions, metrics and the
pipeline's sha256) and the CV outputs. Both consumers need the same guarantees before they
trust the pickled pipeline: the files are there, and the pipeline is the one the record
describes. (An export directory's ``manifest.json`` is a different file: :mod:`ckpred.export.manifest`.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import joblib

from ckpred.util import resolve_path, sha256_file
from ckpred.errors import InputFileError, MissingFileError, ModelMismatchError

__all__ = ["RUN_RECORD", "TrainRun", "load_train_run", "run_record_path"]

#: The record ``train`` writes into its run directory.
RUN_RECORD = "run.json"
#: The same record's name in runs written before it was renamed; still read.
LEGACY_RUN_RECORD = "manifest.json"


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
