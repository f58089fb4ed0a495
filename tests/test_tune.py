"""``ckpred tune``: optuna over train's CV mean efficiency; outputs, determinism, config refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ckpred.config import compose
from ckpred.errors import ConfigValueError
from ckpred.commands.tune import search_space, trial_config, tune

# runs Optuna trials of whole trainings: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow

#: Tiny data, tiny models, a small space: a trial is one 2-fold CV of a few trees.
SMALL = ["shapes=tiny", "model.n_jobs=1", "rows.max_per_shape=32", "rows.keep_top=8", "cv.n_splits=2",
         "baselines.analytical=false", "baselines.best_static=false",
         "tune.space.num_leaves.low=3", "tune.space.num_leaves.high=7",
         "tune.space.n_estimators.low=2", "tune.space.n_estimators.high=6", "tune.space.n_estimators.step=2",
         "tune.space.min_child_samples.high=40", "tune.n_startup_trials=1"]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, str]:
    out = tmp_path_factory.mktemp("tune")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        best = tune(compose("tune", [*SMALL, "tune.n_trials=2", f"out_dir={out}"]))
    return out, best, buf.getvalue()


def test_trials_run_train_with_the_sampled_params(study_dir: tuple[Path, float, str]) -> None:
    out, best, printed = study_dir
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 2 and (trials["state"] == "COMPLETE").all()
    space = compose("tune").tune.space
    for row in trials.itertuples():
        trial_dir = out / "trials" / f"{row.number:03d}"
        manifest = json.loads((trial_dir / "run.json").read_text())
        model = manifest["config"]["model"]
        # the value optuna recorded is train's mean efficiency of a run with exactly these params
        assert row.value == pytest.approx(json.loads((trial_dir / "metrics.json").read_text())["model"]["mean"])
        assert model["num_leaves"] == row.params_num_leaves and 3 <= model["num_leaves"] <= 7
        assert model["n_estimators"] == row.params_n_estimators and model["n_estimators"] in (2, 4, 6)
        assert model["learning_rate"] == pytest.approx(row.params_learning_rate)
        assert space["learning_rate"].low <= model["learning_rate"] <= space["learning_rate"].high
        assert model["reg_lambda"] == 0.0  # disabled in the space: the config's value
        assert not (trial_dir / "pipeline.joblib").exists()  # trial_outputs=false
        assert f"model.num_leaves={row.params_num_leaves}" in yaml.safe_load((trial_dir / "overrides.yaml").read_text())
    result = json.loads((out / "best_params.json").read_text())
    assert best == result["mean_efficiency"] == pytest.approx(trials["value"].max())
    assert result["best_trial"] == int(trials.loc[trials["value"].idxmax(), "number"])
    assert result["command"].startswith("python -m ckpred train") and \
        f"model.num_leaves={result['params']['num_leaves']}" in result["overrides"]
    assert f"best trial {result['best_trial']}" in printed and "tune: 2 of 2 trials finished" in printed


def test_same_seed_same_trials(study_dir: tuple[Path, float, str], tmp_path: Path) -> None:
    out, _, _ = study_dir
    tune(compose("tune", [*SMALL, "tune.n_trials=2", f"out_dir={tmp_path}", "progress=false"]))
    first = pd.read_csv(out / "trials.csv").head(2)
    again = pd.read_csv(tmp_path / "trials.csv")
    cols = [c for c in first.columns if c.startswith("params_")] + ["value"]
    pd.testing.assert_frame_equal(first[cols], again[cols])


def test_other_seed_other_params() -> None:
    import optuna

    from ckpred.commands.tune import suggest

    cfg = compose("tune", SMALL)
    space = search_space(cfg)

    def first_params(seed: int) -> dict[str, object]:
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        trial = study.ask()
        return {name: suggest(trial, name, p) for name, p in space.items()}

    assert first_params(0) == first_params(0) != first_params(1)


@pytest.mark.parametrize(("overrides", "key"), [
    (["tune.space.num_leaves.enabled=false", "tune.space.learning_rate.enabled=false",
      "tune.space.n_estimators.enabled=false", "tune.space.min_child_samples.enabled=false",
      "tune.space.colsample_bytree.enabled=false"], "tune.space"),
    (["tune.space.learning_rate.low=0"], "tune.space.learning_rate.low"),
    (["tune.space.num_leaves.high=2"], "tune.space.num_leaves.high"),
    (["tune.space.num_leaves.low=2.5", "tune.space.num_leaves.log=false"], "tune.space.num_leaves.low"),
    (["tune.space.learning_rate.kind=gauss"], "tune.space.learning_rate.kind"),
    (["tune.n_trials=0"], "tune.n_trials"),
    (["tune.space.max_depth.enabled=true", "tune.space.max_depth.high=4"], "tune.space.max_depth.high"),
])
def test_bad_search_space_is_refused_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        search_space(compose("tune", [*SMALL, *overrides]))
    assert err.value.key == key


def test_unknown_parameter_or_wrong_type_is_refused() -> None:
    from hydra.errors import ConfigCompositionException

    from ckpred.schema import tune_param

    with pytest.raises(ConfigValueError) as err:
        tune_param("max_leaves", {"kind": "int", "low": 2, "high": 8})
    assert err.value.key == "tune.space.max_leaves" and "num_leaves" in err.value.allowed
    with pytest.raises(ConfigValueError) as err:
        tune_param("num_leaves", {"kind": "int", "low": 2, "hi": 8})
    assert err.value.key == "tune.space.num_leaves.hi"
    with pytest.raises(ConfigCompositionException, match="tune.space.num_leaves.low"):
        compose("tune", ["tune.space.num_leaves.low=abc"])


def test_every_tunable_parameter_is_declared_and_can_be_switched_on() -> None:
    from ckpred.schema import TUNABLE

    cfg = compose("tune", SMALL)
    assert sorted(cfg.tune.space) == sorted(TUNABLE)
    assert set(search_space(cfg)) == {"num_leaves", "learning_rate", "n_estimators", "min_child_samples",
                                      "colsample_bytree"}
    space = search_space(compose("tune", [*SMALL, "tune.space.max_depth.enabled=true", "tune.space.max_depth.high=12"]))
    assert space["max_depth"] == {"kind": "int", "low": 4, "high": 12, "log": False, "step": 0.0, "choices": [],
                                  "enabled": True}


def test_sampled_value_outside_the_model_schema_names_the_model_key(tmp_path: Path) -> None:
    cfg = compose("tune", SMALL)
    with pytest.raises(ConfigValueError) as err:
        trial_config(cfg, {"num_leaves": 1}, tmp_path, keep_outputs=False)
    assert err.value.key == "model.num_leaves"
    ok = trial_config(cfg, {"num_leaves": 5, "learning_rate": 0.1}, tmp_path, keep_outputs=False)
    assert (ok.model.num_leaves, ok.model.learning_rate, ok.out_dir, ok.save_pipeline) == (5, 0.1, str(tmp_path), False)
    assert cfg.model.num_leaves != 5 or cfg.model.learning_rate != 0.1  # the study's config is untouched


def test_train_reports_the_running_mean_after_each_fold(tmp_path: Path) -> None:
    from ckpred.commands.train import train

    seen: list[tuple[int, float]] = []
    cfg = compose("train", [*SMALL[:5], "cv.n_splits=3", "model.n_estimators=4", "baselines.reference.enabled=false",
                            "progress=false", "plots=false", "save_pipeline=false", f"out_dir={tmp_path}"])
    value = train(cfg, on_fold=lambda i, mean: seen.append((i, mean)))
    assert [i for i, _ in seen] == [0, 1, 2]
    assert seen[-1][1] == pytest.approx(value, abs=1e-12)  # after the last fold: the reported mean


def test_median_pruner_stops_trials_below_the_median_and_they_write_nothing(tmp_path: Path, monkeypatch) -> None:
    import numpy as np
    import optuna

    studies: list[optuna.Study] = []
    real = optuna.create_study
    monkeypatch.setattr(optuna, "create_study", lambda **kw: studies.append(real(**kw)) or studies[-1])
    out = tmp_path / "study"
    tune(compose("tune", [*SMALL, "cv.n_splits=3", "tune.n_trials=8", "tune.pruner_startup_trials=1",
                          "tune.pruner_warmup_folds=0", f"out_dir={out}"]))
    trials = studies[0].trials
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert pruned and complete  # fixed sampler seed: the same trials every run
    for t in pruned:
        step = max(t.intermediate_values)
        earlier = [c.intermediate_values[step] for c in complete if c.number < t.number]
        assert t.intermediate_values[step] < np.median(earlier)  # below the median at that fold
        assert not (out / "trials" / f"{t.number:03d}" / "metrics.json").exists()
    for t in complete:  # one report per fold, the last one is the trial's value
        assert sorted(t.intermediate_values) == [0, 1, 2]
        assert t.intermediate_values[2] == pytest.approx(t.value, abs=1e-12)
    assert set(pd.read_csv(out / "trials.csv")["state"]) == {"COMPLETE", "PRUNED"}


def test_pruner_option_is_checked() -> None:
    with pytest.raises(ConfigValueError, match="tune.pruner"):
        compose("tune", ["tune.pruner=hyperband"])
