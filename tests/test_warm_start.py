"""Warm start: continuing a previous run's booster (trees, predictions, lineage) and every refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred import warm_start
from ckpred.config import compose
from ckpred.errors import InputFileError, ModelMismatchError
from ckpred.kernels.base import load_op
from ckpred.models import booster
from ckpred.commands.train import train
from ckpred.runs import load_pipeline
from tests.conftest import reading_files

#: The base's recipe, pinned (the train defaults may change): regressor on log1p.
REG = ["model=lgbm_regressor", "target=log1p"]
SMALL = [*REG, "shapes=tiny", "model.num_leaves=7", "model.n_jobs=1", "rows.max_per_shape=64", "rows.keep_top=16",
         "cv.n_splits=2", "progress=false", "plots=false", "baselines.reference.enabled=false",
         "baselines.analytical=false"]
BASE_TREES, ADDED = 5, 6


def _x_head(cfg: object) -> pd.DataFrame:
    """A few raw model-input rows for ``cfg``'s op (values are irrelevant to feature names)."""
    op = load_op(cfg.op)  # type: ignore[attr-defined]
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).head(4)  # type: ignore[attr-defined]
    return op.encode_frame(cat.assign(**{name: 1 for name in op.problem_names}))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base")
    train(compose("train", [*SMALL, f"model.n_estimators={BASE_TREES}", f"out_dir={out}"]))
    return out


@pytest.fixture(scope="module")
def warm_dir(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("warm")
    train(compose("train", [*SMALL, f"model.n_estimators={ADDED}", f"warm_start={base_dir}", f"out_dir={out}",
                            "model.learning_rate=0.1"]))
    return out


@pytest.mark.slow
def test_continues_boosting_from_the_base_trees(base_dir: Path, warm_dir: Path) -> None:
    base, warm = load_pipeline(base_dir / "pipeline.joblib"), load_pipeline(warm_dir / "pipeline.joblib")
    assert booster(base).current_iteration() == BASE_TREES
    assert booster(warm).current_iteration() == BASE_TREES + ADDED
    # The first trees of the continued model are the base's trees, unchanged ...
    base_trees = booster(base).dump_model()["tree_info"]
    warm_trees = booster(warm).dump_model()["tree_info"][:BASE_TREES]
    assert [t["tree_structure"] for t in warm_trees] == [t["tree_structure"] for t in base_trees]
    # ... so its raw score over the first BASE_TREES iterations is the base's raw score.
    X = _x_head(compose("train", SMALL)).assign(m=128, n=1536, k=7168)
    Xt = warm.named_steps["features"].transform(X)
    np.testing.assert_allclose(booster(warm).predict(Xt, num_iteration=BASE_TREES, raw_score=True),
                               booster(base).predict(base.named_steps["features"].transform(X), raw_score=True))
    # Every CV fold continued from the base too.
    folds = json.loads((warm_dir / "folds.json").read_text())["folds"]
    assert [f["model"]["trees"] for f in folds] == [BASE_TREES + ADDED] * len(folds)


@pytest.mark.slow
def test_ranker_continues_too(tmp_path: Path) -> None:
    ranker = ["model=lgbm_ranker", *[o for o in SMALL if not o.startswith(("model=", "target="))]]  # reads no target
    train(compose("train", [*ranker, "model.n_estimators=3", f"out_dir={tmp_path / 'base'}"]))
    train(compose("train", [*ranker, "model.n_estimators=2", f"warm_start={tmp_path / 'base'}",
                            f"out_dir={tmp_path / 'warm'}"]))
    base, warm = load_pipeline(tmp_path / "base" / "pipeline.joblib"), load_pipeline(tmp_path / "warm" / "pipeline.joblib")
    assert (booster(base).current_iteration(), booster(warm).current_iteration()) == (3, 5)
    assert [t["tree_structure"] for t in booster(warm).dump_model()["tree_info"][:3]] == \
        [t["tree_structure"] for t in booster(base).dump_model()["tree_info"]]
    assert json.loads((tmp_path / "warm" / "run.json").read_text())["warm_start"]["trees_after"] == 5


@pytest.mark.slow
def test_differs_from_a_cold_start_with_as_many_trees(warm_dir: Path, tmp_path: Path) -> None:
    train(compose("train", [*SMALL, f"model.n_estimators={BASE_TREES + ADDED}", "model.learning_rate=0.1",
                            f"out_dir={tmp_path}"]))
    cold, warm = load_pipeline(tmp_path / "pipeline.joblib"), load_pipeline(warm_dir / "pipeline.joblib")
    assert booster(cold).current_iteration() == booster(warm).current_iteration()
    X = _x_head(compose("train", SMALL)).assign(m=128, n=1536, k=7168)
    assert not np.allclose(cold.predict(X), warm.predict(X))
    oof_cold = pd.read_parquet(tmp_path / "oof_predictions.parquet")["score_model"]
    oof_warm = pd.read_parquet(warm_dir / "oof_predictions.parquet")["score_model"]
    assert not np.allclose(oof_cold, oof_warm)


def test_run_record_holds_the_lineage(base_dir: Path, warm_dir: Path) -> None:
    base_m = json.loads((base_dir / "run.json").read_text())
    warm_m = json.loads((warm_dir / "run.json").read_text())
    lin = warm_m["warm_start"]
    assert lin["base_run_dir"] == str(base_dir)
    assert lin["base_pipeline_sha256"] == base_m["pipeline"]["sha256"] != warm_m["pipeline"]["sha256"]
    assert (lin["trees_before"], lin["trees_added"], lin["trees_after"]) == (BASE_TREES, ADDED, BASE_TREES + ADDED)
    assert warm_m["pipeline"]["trees"] == BASE_TREES + ADDED
    assert lin["base_data"] == {k: base_m["data"][k] for k in ("hash", "rows", "shapes")}
    assert lin["data"]["rows"] == 12 * 4608 and lin["same_data"] is True
    assert lin["base_model"]["n_estimators"] == BASE_TREES and lin["base_lineage"] is None
    # Same data: the base trained on every test shape, and the run says so.
    assert lin["cv"] == {**lin["cv"], "test_shapes": 12, "test_shapes_seen_by_base": 12, "leakage": True}


@pytest.mark.slow
def test_no_leakage_when_the_base_never_saw_the_shapes(tmp_path: Path) -> None:
    from ckpred.data import load_table
    from ckpred.data.table import write_table

    op = load_op("gemm_universal")
    table = load_table(compose("train", ["shapes=tiny"]))
    small_m = table["m"] < 256
    write_table(table[small_m], tmp_path / "old.parquet", op)
    write_table(table[~small_m], tmp_path / "new.parquet", op)
    path = ["data=path", "data.cache_dir=" + str(tmp_path / "cache")]
    train(compose("train", [*reading_files(SMALL), *path, f"data.path={tmp_path / 'old.parquet'}",
                            "model.n_estimators=3",
                            f"out_dir={tmp_path / 'base'}"]))
    train(compose("train", [*reading_files(SMALL), *path, f"data.path={tmp_path / 'new.parquet'}",
                            "model.n_estimators=3",
                            f"warm_start={tmp_path / 'base'}", f"out_dir={tmp_path / 'warm'}", "save_pipeline=false"]))
    lin = json.loads((tmp_path / "warm" / "run.json").read_text())["warm_start"]
    assert lin["cv"]["test_shapes_seen_by_base"] == 0 and lin["cv"]["leakage"] is False
    assert lin["same_data"] is False and lin["trees_after"] is None  # no final pipeline saved


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "fields"), [
    (["arch=gfx942"], ["arch"]),
    (["dtype=bf16"], ["dtype"]),
    (["layout=rrr"], ["layout"]),
    (["model=lgbm_ranker"], ["model", "target"]),
    (["target=relative"], ["target"]),
    (["features=minimal"], ["features", "feature_names"]),
    (["op=grouped_conv_fwd", "features=conv_full", "dtype=fp16"], ["op", "dtype", "features", "input_names",
                                                                    "feature_names"]),
])
def test_mismatch_is_refused_naming_each_field(base_dir: Path, overrides: list[str], fields: list[str]) -> None:
    groups = {o.split("=")[0] for o in overrides}
    small = [o for o in SMALL if o.split("=")[0] not in groups]  # the case's group choice replaces the base's
    if "model=lgbm_ranker" in overrides:  # a ranker reads no target (and refuses one)
        small = [o for o in small if not o.startswith("target=")]
    cfg = compose("train", [*small, f"warm_start={base_dir}", *overrides])
    with pytest.raises(ModelMismatchError) as err:
        warm_start.prepare(cfg, load_op(cfg.op), _x_head(cfg))
    assert err.value.fields == fields  # type: ignore[attr-defined]
    base = json.loads((base_dir / "run.json").read_text())
    for field in fields:
        assert f"  {field}: " in str(err.value)
        if field not in ("feature_names", "input_names"):
            assert repr(base[field]) in str(err.value)  # base value and this run's value
    assert str(base_dir) in str(err.value)


@pytest.mark.slow
def test_train_refuses_before_fitting(base_dir: Path, tmp_path: Path) -> None:
    small = [o for o in SMALL if not o.startswith("target=")]
    with pytest.raises(ModelMismatchError, match="target: base 'log1p', this run 'relative'"):
        train(compose("train", [*small, f"warm_start={base_dir}", "target=relative", f"out_dir={tmp_path}"]))
    assert not (tmp_path / "run.json").exists()


def test_feature_order_difference_is_named(base_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "base"
    shutil.copytree(base_dir, copy)
    manifest = json.loads((copy / "run.json").read_text())
    names = manifest["feature_names"]
    manifest["feature_names"] = [names[1], names[0], *names[2:]]
    (copy / "run.json").write_text(json.dumps(manifest))
    cfg = compose("train", [*SMALL, f"warm_start={copy}"])
    with pytest.raises(ModelMismatchError, match="different order, first at position 0") as err:
        warm_start.prepare(cfg, load_op(cfg.op), _x_head(cfg))
    assert err.value.fields == ["feature_names"]  # type: ignore[attr-defined]
    assert repr(names[1]) in str(err.value) and repr(names[0]) in str(err.value)


def test_damaged_or_missing_base_is_refused(base_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "base"
    shutil.copytree(base_dir, copy)
    with open(copy / "pipeline.joblib", "ab") as fh:
        fh.write(b"x")
    with pytest.raises(ModelMismatchError, match="sha256"):
        warm_start.load_base(copy)
    (copy / "pipeline.joblib").unlink()
    with pytest.raises(InputFileError, match="save_pipeline=false"):
        warm_start.load_base(copy)
    with pytest.raises(InputFileError, match="no such directory"):
        warm_start.load_base(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputFileError, match="not a finished train run"):
        warm_start.load_base(tmp_path / "empty")
