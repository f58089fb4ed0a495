"""``ckpred train`` end to end on the tiny shape set, every model/target/cv option, determinism,
early stopping isolation, external test data, the CLI; plus unit tests of models.py pieces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from ckpred.config import compose
from ckpred.errors import ConfigValueError
from ckpred.evaluate import METHODS, ShapeGroups
from ckpred.models import IdentityTarget, Log1pTarget, relative_target, relevance_grades
from ckpred.commands.train import train
from ckpred.runs import load_pipeline
from tests.conftest import reading_files

#: Small, fast, single-threaded settings for every run in this file.
SMALL = ["shapes=tiny", "model.n_estimators=8", "model.num_leaves=7", "model.n_jobs=1",
         "rows.max_per_shape=192", "rows.keep_top=32", "cv.n_splits=3", "progress=false",
         "baselines.plain.model.n_estimators=8", "baselines.plain.model.num_leaves=7"]
REF_SMALL = ["baselines.reference.model.n_estimators=8", "baselines.reference.model.num_leaves=7",
             "baselines.reference.model.max_depth=4", "baselines.reference.model.n_jobs=1",
             "baselines.reference.rows.max_per_shape=192", "baselines.reference.rows.keep_top=32"]
NO_REF = ["baselines.reference.enabled=false"]


def _run(tmp: Path, *overrides: str) -> tuple[float, Path]:
    small = reading_files(SMALL) if "data=path" in overrides else SMALL
    if any(o.startswith("cv=") and o != "cv=group_kfold" for o in overrides):  # n_splits is group_kfold's
        small = [o for o in small if not o.startswith("cv.n_splits=")]
    cfg = compose("train", [*small, f"out_dir={tmp}", *overrides])
    return train(cfg), tmp


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, Path]:
    out = tmp_path_factory.mktemp("train_full")
    return _run(out, *REF_SMALL)


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("model.num_leaves=-3", "model.num_leaves", "[2, 131072]"),
    ("model.learning_rate=0", "model.learning_rate", "(0, 1]"),
    ("model.max_rows_per_query=20000", "model.max_rows_per_query", "10000"),
    ("cv.n_splits=1", "cv.n_splits", ">= 2"),
    ("baselines.reference.model.subsample=1.5", "model.subsample", "(0, 1]"),
])
def test_bad_values_name_key_value_allowed(override: str, key: str, allowed: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        compose("train", [override])
    assert err.value.key == key
    assert allowed in str(err.value) and override.split("=")[1] in str(err.value)


@pytest.mark.slow
def test_experiment_reference_is_the_published_recipe() -> None:
    cfg = compose("train", ["experiment=reference"])
    assert cfg.features.name == "anchor55" and cfg.target.name == "log1p" and cfg.model.name == "lgbm_regressor"
    m = cfg.model
    assert (m.n_estimators, m.num_leaves, m.max_depth, m.learning_rate, m.min_child_samples) == (2000, 255, 15, 0.02, 10)
    ref = compose("train").baselines.reference
    assert ref.features.name == "anchor55" and ref.target.name == "log1p"
    # the baseline in the default run: the reference's earlier published recipe (README "Training")
    assert (ref.model.n_estimators, ref.model.num_leaves, ref.model.max_depth, ref.model.learning_rate,
            ref.model.min_child_samples) == (500, 127, 12, 0.05, 10)


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_outputs_exist_and_are_sane(full_run: tuple[float, Path]) -> None:
    mean, out = full_run
    for name in ["metrics.json", "per_shape.csv", "oof_predictions.parquet", "pipeline.joblib", "run.json",
                 "folds.json", "efficiency_cdf.png", "efficiency_at_k.png", "feature_importance.png"]:
        assert (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    # the heading names what is held out: the op's grouping key and the folds
    assert metrics.pop("_heading") == "unseen (m, n, k, split_k) shapes, 3 folds"
    assert list(metrics) == list(METHODS)
    assert mean == metrics["model"]["mean"]
    for method, rep in metrics.items():
        assert rep["n_shapes"] == 12, method
        for key in ["mean", "p10", "p50", "min", "top1", "top5", "efficiency@1", "efficiency@2", "efficiency@5",
                    "efficiency@10", "efficiency@20", "ndcg@10"]:
            assert 0.0 <= rep[key] <= 1.0, (method, key)
        assert rep["min"] <= rep["p10"] <= rep["p50"] and rep["min"] <= rep["mean"]
        assert rep["efficiency@1"] == pytest.approx(rep["mean"])
        ks = [rep[f"efficiency@{k}"] for k in (1, 2, 5, 10, 20)]
        assert ks == sorted(ks), method  # a bigger budget never finds a slower best
        assert set(rep["by_family"]) == {"tiny", "small", "medium", "large"}
        assert sum(f["n_shapes"] for f in rep["by_family"].values()) == 12
        assert 0.0 <= rep["failed_pick"] <= 1.0 and rep["failed_picks"] == pytest.approx(12 * rep["failed_pick"])
        assert rep["fallback_efficiency"] >= rep["mean"] - 1e-12
        # the spread over folds: each fold's test shapes summarised alone
        assert rep["folds"]["n"] == 3 and len(rep["folds"]["mean"]["values"]) == 3
        assert min(rep["folds"]["mean"]["values"]) <= rep["mean"] <= max(rep["folds"]["mean"]["values"])
    per_shape = pd.read_csv(out / "per_shape.csv")
    oof = pd.read_parquet(out / "oof_predictions.parquet")
    assert len(per_shape) == 12 and per_shape["fold"].between(0, 2).all()
    assert len(oof) == 12 * 4608 and oof["fold"].between(0, 2).all()
    # Independent recomputation from the out-of-fold file: random = mean(perf / best) per shape.
    best = oof.groupby("shape")["perf"].transform("max")
    random_mean = (oof["perf"] / best).groupby(oof["shape"]).mean().mean()
    assert metrics["random"]["mean"] == pytest.approx(random_mean)
    # ... and the model's pick: highest score among selectable rows, first in row order on ties.
    sel = oof[oof["selectable"]]
    pick = sel.loc[sel.groupby("shape", sort=False)["score_model"].idxmax()]
    eff = (pick["perf"].to_numpy() / best.loc[pick.index].to_numpy()).mean()
    assert metrics["model"]["mean"] == pytest.approx(eff)
    chosen = per_shape.set_index("shape")["model_kernel"]
    assert (chosen.loc[pick["shape"]].to_numpy() == pick["kernel_name"].to_numpy()).all()
    # failed-pick rate: the picked row's measured perf is 0 (failed or invalid)
    assert metrics["model"]["failed_pick"] == pytest.approx(float((pick["perf"] <= 0).mean()))


@pytest.mark.slow  # reads the whole train run of full_run
def test_manifest_and_pipeline(full_run: tuple[float, Path]) -> None:
    _, out = full_run
    manifest = json.loads((out / "run.json").read_text())
    assert (manifest["op"], manifest["arch"], manifest["dtype"], manifest["layout"]) == \
        ("gemm_universal", "gfx950", "fp8", "rcr")
    assert len(manifest["data"]["hash"]) == 64 and len(manifest["catalogue_hash"]) == 64
    assert manifest["data"]["rows"] == 12 * 4608 and manifest["data"]["shapes"] == 12
    assert manifest["versions"]["lightgbm"] and manifest["config"]["model"]["n_estimators"] == 8
    assert manifest["metrics"]["model"]["mean"] == json.loads((out / "metrics.json").read_text())["model"]["mean"]
    pipe = load_pipeline(out / "pipeline.joblib")
    assert [name for name, _ in pipe.steps] == ["features", "model"]
    assert pipe.ckpred_target_ == manifest["target"] == "rank"  # default model: the ranker
    assert list(pipe.named_steps["features"].get_feature_names_out()) == manifest["feature_names"]
    from ckpred.kernels.base import load_op

    op = load_op("gemm_universal")
    cat = op.catalogue("gfx950", "fp8", "rcr").head(50)
    frame = cat.assign(m=128, n=1536, k=7168, split_k=1)
    scores = pipe.predict(op.encode_frame(frame))
    assert scores.shape == (50,) and np.isfinite(scores).all()


@pytest.mark.slow  # reads the whole train run of full_run
def test_folds_cover_every_shape_once(full_run: tuple[float, Path]) -> None:
    _, out = full_run
    folds = json.loads((out / "folds.json").read_text())["folds"]
    tested = [s for f in folds for s in f["test_shapes"]]
    assert len(tested) == len(set(tested)) == 12
    for f in folds:
        for method in ("model", "reference"):
            assert not set(f[method]["train_shapes"]) & set(f["test_shapes"])


#: Every model/target pair under the default CV, and every other CV with one of the pairs (so
#: each option of each group runs at least once without running the whole product).
COMBOS = [("lgbm_regressor", "log1p", "group_kfold"), ("lgbm_regressor", "raw", "group_kfold"),
          ("lgbm_regressor", "relative", "group_kfold"), ("lgbm_ranker", "log1p", "group_kfold"),
          ("lgbm_ranker", "log1p", "holdout"), ("lgbm_regressor", "relative", "leave_family_out"),
          ("lgbm_regressor", "raw", "external")]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "target", "cv"), COMBOS)
def test_every_model_target_cv(tmp_path: Path, model: str, target: str, cv: str) -> None:
    target_choice = [f"target={target}"] if model == "lgbm_regressor" else []  # a ranker reads no target
    mean, out = _run(tmp_path, f"model={model}", *target_choice, f"cv={cv}", *NO_REF,
                     "model.n_estimators=4", "model.n_jobs=1", "plots=false", "save_pipeline=false",
                     "baselines.analytical=false")
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"_heading", "model", "plain", "best_static", "random"}
    assert "(m, n, k, split_k) shapes" in metrics["_heading"]
    assert 0.0 < mean <= 1.0
    n_tested = {"group_kfold": 12, "leave_family_out": 12, "holdout": 3, "external": 12}[cv]
    assert metrics["model"]["n_shapes"] == n_tested
    n_folds = {"group_kfold": 3, "leave_family_out": 4, "holdout": 1, "external": 1}[cv]
    assert len(json.loads((out / "folds.json").read_text())["folds"]) == n_folds


@pytest.mark.slow
def test_early_stopping_never_sees_test_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckpred.fitting as tr

    seen: list[set[str]] = []
    real_fit = tr.fit_pipeline

    def spy(pipe, rows, **kwargs):  # type: ignore[no-untyped-def]
        X_val = kwargs["val"].X
        seen.append(set(X_val[["m", "n", "k", "split_k"]].astype(str).agg("x".join, axis=1)))
        assert not seen[-1] & set(rows.X[["m", "n", "k", "split_k"]].astype(str).agg("x".join, axis=1))
        return real_fit(pipe, rows, **kwargs)

    monkeypatch.setattr(tr, "fit_pipeline", spy)
    _run(tmp_path, *NO_REF, "baselines.plain.enabled=false", "model.n_estimators=200", "model.early_stopping_rounds=2",
         "model.validation_fraction=0.25", "model.learning_rate=0.3", "plots=false")
    folds = json.loads((tmp_path / "folds.json").read_text())["folds"]
    assert len(seen) == len(folds) + 1  # one fit per fold, then the final fit
    for val, fold in zip(seen, folds):
        assert val and val == set(fold["model"]["validation_shapes"])
        assert not val & set(fold["test_shapes"])
        assert not set(fold["model"]["train_shapes"]) & set(fold["test_shapes"])
        assert len(fold["model"]["train_shapes"]) + len(val) + len(fold["test_shapes"]) == 12
        assert fold["model"]["best_iteration"] < 200


@pytest.mark.slow
def test_external_test_table_with_kernels_never_seen(tmp_path: Path) -> None:
    """Protocol A: train on one table, select among another table's kernels."""
    from ckpred.data import load_table
    from ckpred.data.table import write_table
    from ckpred.kernels.base import load_op

    op = load_op("gemm_universal")
    cfg = compose("train", ["shapes=tiny"])
    table = load_table(cfg)
    # Training table without any compv4 kernel; the test table (other noise seed) has them all.
    write_table(table[table["pipeline"] != "compv4"], tmp_path / "train.parquet", op)
    other = load_table(compose("train", ["shapes=tiny", "data.seed=1"]))
    write_table(other, tmp_path / "test.parquet", op)
    mean, out = _run(tmp_path / "run", "data=path", f"data.path={tmp_path / 'train.parquet'}", "cv=external",
                     "cv.data.source=path", f"cv.data.path={tmp_path / 'test.parquet'}", *NO_REF, "plots=false")
    oof = pd.read_parquet(out / "oof_predictions.parquet")
    assert len(oof) == len(other)
    unseen = oof["kernel_name"].str.contains("_compv4_")
    assert unseen.any() and np.isfinite(oof.loc[unseen, "score_model"]).all()
    assert (oof.loc[unseen, "score_best_static"] == -np.inf).all()
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["test_data"]["hash"] != manifest["data"]["hash"]
    assert manifest["test_data"]["rows"] == len(other) and 0 < mean <= 1


@pytest.mark.slow
def test_cli_subprocess_reproduces_the_same_seed_run(full_run: tuple[float, Path], tmp_path: Path) -> None:
    """The CLI as a user runs it, with the fixture's overrides: same seed -> identical results."""
    _, first = full_run
    out = tmp_path / "run"  # beside Hydra's folder: a run writes only into a folder of its own
    proc = subprocess.run([sys.executable, "-m", "ckpred", "train", *SMALL, *REF_SMALL, "progress=true",
                           f"hydra.run.dir={tmp_path / 'hydra'}", f"out_dir={out}"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "efficiency on unseen (m, n, k, split_k) shapes, 3 folds" in proc.stdout and "best_static" in proc.stdout
    assert "model / plain" in proc.stdout  # the fit times of the model and of plain LightGBM, side by side
    assert json.loads((out / "metrics.json").read_text()) == json.loads((first / "metrics.json").read_text())
    pd.testing.assert_frame_equal(pd.read_parquet(out / "oof_predictions.parquet"),
                                  pd.read_parquet(first / "oof_predictions.parquet"))
    assert (out / "per_shape.csv").read_text() == (first / "per_shape.csv").read_text()


# ---------------------------------------------------------------------------------------------
# model pieces
# ---------------------------------------------------------------------------------------------
@parametrize_with_checks([Log1pTarget(), IdentityTarget()])
def test_target_transformers_follow_sklearn_contract(estimator, check) -> None:  # type: ignore[no-untyped-def]
    check(estimator)


def test_target_transforms_round_trip() -> None:
    y = np.array([[0.0], [1.5], [2000.0]])
    t = Log1pTarget().fit(y)
    assert t.transform(y) == pytest.approx(np.log1p(y))
    assert t.inverse_transform(t.transform(y)) == pytest.approx(y)
    assert IdentityTarget().fit(y).inverse_transform(y) == pytest.approx(y)


def test_relative_target_and_relevance_grades() -> None:
    perf = np.array([10.0, 5.0, 0.0, 2.0, 1.0])
    codes = np.array([0, 0, 0, 1, 1])
    rel = relative_target(perf, codes, floor=1e-3)
    assert rel == pytest.approx([0.0, np.log(0.5), np.log(1e-3), 0.0, np.log(0.5)])
    grades = relevance_grades(perf, codes, n_grades=31, exponent=3.0)
    assert grades.tolist() == [30, round(30 * 0.125), 0, 30, round(30 * 0.125)]
    assert grades.dtype.kind == "i" and grades.max() <= 30


def test_training_rows_cap_keeps_the_fastest() -> None:
    from types import SimpleNamespace

    from ckpred.fitting import Prepared, training_rows

    perf = np.array([1.0, 9.0, 3.0, 8.0, 0.0, 2.0, 0.0, 0.0])
    codes = ["a"] * 6 + ["b"] * 2  # shape b has no valid kernel: skipped
    data = Prepared(table=pd.DataFrame(), X=pd.DataFrame(), perf=perf,
                    selectable=np.array([True, True, True, True, False, True, True, True]),
                    groups=ShapeGroups.from_keys(codes), shapes=pd.DataFrame())
    rows_cfg = SimpleNamespace(drop_rule_invalid=True, max_per_shape=3, keep_top=2)
    rows = training_rows(data, np.array([0, 1]), rows_cfg, max_rows=10_000, rng=np.random.default_rng(0))
    assert len(rows) == 3 and {1, 3} <= set(rows.tolist()) and 4 not in rows
    assert rows.tolist() == sorted(rows.tolist())
    # the ranker's per-query limit wins over a larger (or unset) cap
    rows_cfg = SimpleNamespace(drop_rule_invalid=False, max_per_shape=0, keep_top=1)
    rows = training_rows(data, np.array([0]), rows_cfg, max_rows=2, rng=np.random.default_rng(0))
    assert len(rows) == 2 and 1 in rows


@pytest.mark.slow
def test_seeds_report_the_spread_over_seeds(tmp_path: Path) -> None:
    mean, out = _run(tmp_path, *NO_REF, "seeds=[0,1]", "baselines.best_static=false", "baselines.analytical=false",
                     "plots=false")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["seeds"] == [0, 1]
    assert metrics["_heading"] == "unseen (m, n, k, split_k) shapes, 3 folds, seeds [0, 1]"
    per_seed = [json.loads((out / f"seed{s}" / "metrics.json").read_text())["model"]["mean"] for s in (0, 1)]
    assert per_seed[0] != per_seed[1]  # another seed: other folds, other rows, other trees
    spread = metrics["over_seeds"]["model"]["mean"]
    assert spread["values"] == pytest.approx(per_seed)
    assert spread["mean"] == pytest.approx(np.mean(per_seed)) and spread["std"] == pytest.approx(np.std(per_seed))
    assert mean == pytest.approx(np.mean(per_seed))
    assert set(metrics["over_seeds"]) == {"model", "plain", "random"}
    # the final pipeline is fitted once, for the first seed
    assert (out / "seed0" / "pipeline.joblib").exists() and not (out / "seed1" / "pipeline.joblib").exists()
