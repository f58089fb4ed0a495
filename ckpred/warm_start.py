"""Warm start: ``ckpred train warm_start=<train run dir> model.n_estimators=N`` continues boosting.

The base is a finished ``train`` run directory (its ``pipeline.joblib`` and run record ``run.json``).
Every model this run fits — each CV fold's and the final one — starts from the base model's
booster (LightGBM ``init_model``) and *adds* ``model.n_estimators`` trees, trained on this run's
data; the other hyperparameters (learning rate, leaves, ...) may differ from the base's and apply
to the new trees only. The fitted pipeline has the same two steps as a cold one (``features ->
TransformedTargetRegressor`` or ``LGBMRanker``), so export reads it unchanged.

Refusals (:class:`ckpred.errors.ModelMismatchError`, naming every field that differs with both
values): op, arch, dtype, layout, model kind, target, feature set name, model input columns and
the feature names and their order; a ``pipeline.joblib`` whose sha256 is not the one in the
base's run record.

What CV means with warm start
-----------------------------
The folds continue from the *base's final model*, which was fitted on all of the base run's
shapes. When the base saw a shape that is now in a test fold, that fold's score is optimistic
(the base's trees have learned that shape's kernels). The run records exactly how many test
shapes the base trained on (``run.json: warm_start.cv.test_shapes_seen_by_base``) and
warns. The leak-free protocol: warm-start on data whose shapes the base never saw (e.g. a base
trained on an older sweep, continued on newly measured shapes) — then the count is 0 and CV is
as honest as a cold run. Continuing on the *same* data is useful to add trees to a final model,
but its CV numbers measure memorisation and are flagged ``cv.leakage: true``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import pandas as pd
from sklearn.pipeline import Pipeline

from ckpred.errors import ModelMismatchError
from ckpred.kernels.base import OpDefinition
from ckpred.models import booster, build_pipeline, target_name
from ckpred.runs import RunRecord, load_train_run
from ckpred.schema import RecipeConfig, TrainConfig

log = logging.getLogger(__name__)

#: Manifest fields that must be equal between the base and this run, in the order reported.
CHECKED_FIELDS: tuple[str, ...] = ("op", "arch", "dtype", "layout", "model", "target", "features",
                                   "input_names", "feature_names")


@dataclass
class BaseModel:
    """A previous train run to continue from."""

    run_dir: Path
    pipeline: Pipeline
    record: dict[str, Any]
    sha256: str
    #: Shape keys (as strings) the base's final model was fitted on.
    trained_shapes: frozenset[str]

    @property
    def booster(self) -> lgb.Booster:
        return booster(self.pipeline)

    @property
    def trees(self) -> int:
        return int(self.booster.current_iteration())


def load_base(run_dir: str | Path) -> BaseModel:
    """Load and verify a train run directory (files present, pipeline sha256 = the run record's).

    Raises
    ------
    ckpred.errors.InputFileError
        When the directory, its run record or its pipeline is missing.
    ckpred.errors.ModelMismatchError
        When ``pipeline.joblib`` is not the file the run record names.
    """
    run = load_train_run(run_dir, purpose="warm_start", require_record=True)
    path, pipe, record, sha = run.path, run.pipeline, run.record, run.sha256
    folds_file = path / "folds.json"
    trained: set[str] = set()
    if folds_file.exists():
        folds = json.loads(folds_file.read_text())
        for fold in folds.get("folds", []):
            info = fold.get("model", {})
            trained.update(info.get("train_shapes", []), info.get("validation_shapes", []))
            if folds.get("cv") != "external":  # the final fit used every shape, test folds included
                trained.update(fold.get("test_shapes", []))
    return BaseModel(run_dir=path, pipeline=pipe, record=record, sha256=sha, trained_shapes=frozenset(trained))


def _describe_feature_difference(base: list[str], new: list[str]) -> str:
    missing = [n for n in base if n not in new]
    extra = [n for n in new if n not in base]
    parts = [f"base has {len(base)} features, this run {len(new)}"]
    if missing:
        parts.append(f"missing here: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if extra:
        parts.append(f"new here: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if not missing and not extra:
        pos = next((i for i, (a, b) in enumerate(zip(base, new)) if a != b), None)
        if pos is None:  # same prefix, repeated names
            parts.append("the same names, repeated a different number of times")
        else:
            parts.append(f"same names in a different order, first at position {pos}: base {base[pos]!r}, "
                         f"this run {new[pos]!r}")
    return "; ".join(parts)


def expected_fields(cfg: RecipeConfig, op: OpDefinition, feature_names: list[str]) -> dict[str, Any]:
    """The values of :data:`CHECKED_FIELDS` for this run's config."""
    return {"op": op.name, "arch": str(cfg.arch.name), "dtype": str(cfg.dtype.name), "layout": str(cfg.layout.name),
            "model": str(cfg.model.name), "target": target_name(cfg.model, cfg.target),
            "features": str(cfg.features.name), "input_names": list(op.input_names),
            "feature_names": list(feature_names)}


def check_compatible(base: BaseModel, expected: dict[str, Any]) -> None:
    """Refuse a base whose run record differs from ``expected`` in any of :data:`CHECKED_FIELDS`.

    Raises
    ------
    ckpred.errors.ModelMismatchError
        Naming every differing field with the base's and this run's value; ``err.fields``
        lists the field names.
    """
    diffs: dict[str, str] = {}
    for key in CHECKED_FIELDS:
        have, want = base.record.get(key), expected[key]
        if have == want:
            continue
        if key == "feature_names" and isinstance(have, list):
            diffs[key] = _describe_feature_difference(have, want)
        else:
            diffs[key] = f"base {have!r}, this run {want!r}"
    # The record is checked above; this guards against a record that lies about the pipeline.
    n_in = int(base.booster.num_feature())
    if "feature_names" not in diffs and n_in != len(expected["feature_names"]):
        diffs["feature_names"] = f"base booster takes {n_in} features, this run builds {len(expected['feature_names'])}"
    if diffs:
        lines = "\n".join(f"  {k}: {v}" for k, v in diffs.items())
        err = ModelMismatchError(f"warm_start={base.run_dir} cannot be continued by this run; differs in "
                                 f"{', '.join(diffs)}:\n{lines}")
        err.fields = list(diffs)  # type: ignore[attr-defined]
        raise err


def feature_names_of(cfg: RecipeConfig, op: OpDefinition, X_head: pd.DataFrame) -> list[str]:
    """Output feature names of this config's feature step (fitted on a few rows; it is stateless)."""
    pipe = build_pipeline(cfg, op, cfg.arch, cfg.dtype)
    features = pipe.named_steps["features"].fit(X_head)
    return [str(n) for n in features.get_feature_names_out()]


def prepare(cfg: TrainConfig, op: OpDefinition, X_head: pd.DataFrame) -> BaseModel:
    """Load ``cfg.warm_start`` and check it against this run; the entry point ``train`` calls."""
    base = load_base(str(cfg.warm_start))
    check_compatible(base, expected_fields(cfg, op, feature_names_of(cfg, op, X_head)))
    log.info("warm start from %s: %d trees, +%d per fit", base.run_dir, base.trees, int(cfg.model.n_estimators))
    return base


def lineage(base: BaseModel, cfg: TrainConfig, record: RunRecord, fold_log: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``warm_start`` entry of this run's record (base identity, trees, data, CV leakage);
    warns when CV leaked.

    ``record`` is this run's record (its data and final pipeline), ``fold_log`` the run's
    ``folds.json`` content (test shapes and per-fold tree counts).
    """
    test_shape_keys = [str(s) for f in fold_log for s in f["test_shapes"]]
    fold_trees = [int(f["model"]["trees"]) for f in fold_log if "model" in f and "trees" in f["model"]]
    seen = sorted(set(test_shape_keys) & base.trained_shapes)
    bm = base.record
    base_model_cfg = (bm.get("config") or {}).get("model", {})
    data = record.data.to_json()
    out = {
        "base_run_dir": str(base.run_dir),
        "base_pipeline_sha256": base.sha256,
        "base_data": {k: (bm.get("data") or {}).get(k) for k in ("hash", "rows", "shapes")},
        "base_model": {k: base_model_cfg.get(k) for k in ("n_estimators", "learning_rate", "num_leaves")},
        "trees_before": base.trees,
        "trees_added": int(cfg.model.n_estimators),
        "trees_after": record.pipeline.get("trees"),
        "fold_trees_after": fold_trees,
        "data": {k: data.get(k) for k in ("hash", "rows", "shapes")},
        "same_data": bm.get("data", {}).get("hash") == data.get("hash"),
        "cv": {"folds": "every fold continues from the base's final model",
               "test_shapes": len(test_shape_keys), "test_shapes_seen_by_base": len(seen),
               "leakage": bool(seen), "seen_examples": seen[:10]},
        # A chain of warm starts keeps its history.
        "base_lineage": bm.get("warm_start"),
    }
    if seen:
        log.warning("warm start: the base model was trained on %d of the %d test shapes, so the CV "
                    "efficiencies of this run are optimistic (see run.json warm_start.cv)",
                    len(seen), len(test_shape_keys))
    return out
