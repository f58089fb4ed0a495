"""Reading a finished ``train`` run directory back (for ``export run_dir=...`` and warm starts).

A train run dir holds ``pipeline.joblib`` (with ``save_pipeline=true``), ``manifest.json``
(the run's config, data hash and the pipeline's sha256) and the CV outputs. Both consumers need
the same guarantees before they trust the pickled pipeline: the files are there, and the
pipeline is the one the manifest describes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import joblib

from ckpred.util import resolve_path, sha256_file
from ckpred.errors import InputFileError, MissingFileError, ModelMismatchError

__all__ = ["TrainRun", "load_train_run"]


@dataclass(frozen=True)
class TrainRun:
    """A loaded train run: its directory, fitted pipeline, manifest (``{}`` if absent) and the
    pipeline file's sha256."""

    path: Path
    pipeline: Any
    sha256: str
    manifest: dict[str, Any] = field(default_factory=dict)


def load_train_run(run_dir: str | Path, *, purpose: str, require_manifest: bool) -> TrainRun:
    """Load and verify a train run directory.

    Parameters
    ----------
    run_dir : str or Path
        The run directory (resolved against the original working directory).
    purpose : str
        Who asks (``"export"``, ``"warm_start"``); starts every error message.
    require_manifest : bool
        Refuse a directory without a ``manifest.json`` written by ``train`` (warm starts need
        its lineage). Without it, a run dir holding only ``pipeline.joblib`` is accepted; a
        manifest that is present is still checked against the pipeline.

    Returns
    -------
    TrainRun

    Raises
    ------
    ckpred.errors.MissingFileError
        When the directory, its pipeline or (``require_manifest``) its manifest is missing.
    ckpred.errors.InputFileError
        When the manifest was not written by ``train``.
    ckpred.errors.ModelMismatchError
        When ``pipeline.joblib`` is not the file the manifest records (replaced or damaged).
    """
    path = resolve_path(run_dir)
    if not path.is_dir():
        raise MissingFileError(str(path), f"{purpose}: no such directory (expected a train run dir, "
                                          "e.g. runs/train/<time>)")
    manifest_file, pipeline_file = path / "manifest.json", path / "pipeline.joblib"
    manifest: dict[str, Any] = {}
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text())
        if require_manifest and manifest.get("command") != "train":
            raise InputFileError(str(manifest_file), f"{purpose}: written by command {manifest.get('command')!r}, "
                                                     "expected a 'train' run dir")
    elif require_manifest:
        raise MissingFileError(str(manifest_file), f"{purpose}: missing; the directory is not a finished train run")
    if not pipeline_file.is_file():
        raise MissingFileError(str(pipeline_file), f"{purpose}: no fitted pipeline in {run_dir} (the run was "
                                                   "trained with save_pipeline=false; rerun it with save_pipeline=true)")
    sha = sha256_file(pipeline_file)
    recorded = (manifest.get("pipeline") or {}).get("sha256")
    if (recorded or require_manifest) and recorded != sha:
        raise ModelMismatchError(f"{purpose}: {pipeline_file}: sha256 {sha} differs from the run manifest's "
                                 f"{recorded} (the pipeline was replaced or damaged after training)")
    return TrainRun(path=path, pipeline=joblib.load(pipeline_file), sha256=sha, manifest=manifest)
