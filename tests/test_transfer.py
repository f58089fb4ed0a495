"""Zero-shot on a new GPU: rows of several GPUs with their own constants, leave-one-GPU-out, the
transfer recipe (fit, blend, inner split) and its export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred.config import compose
from ckpred.cv.driver import cross_validate
from ckpred.errors import ConfigValueError
from ckpred.schema import arch_config
from ckpred.transfer import UNSEEN, blend, choose_weight, rank_percentile
from tests.transfer_helpers import DEVICES, KEYS, OPS_DIR, export_transfer, train_config, train_logo, write_caches

# trains leave-one-GPU-out runs on six Kernel Tuner caches: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow

_cfg = train_config


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_caches(tmp_path_factory.mktemp("kt"))


@pytest.fixture(scope="module")
def prepared(caches: Path):
    from ckpred.data import load_table
    from ckpred.fitting import prepare
    from ckpred.kernels.base import load_op

    cfg = _cfg(caches)
    op = load_op(cfg.op)
    return cfg, op, prepare(load_table(cfg), op, cfg)


# -- ranks and the blend ------------------------------------------------------------------------------
def test_rank_percentile_averages_ties_within_each_problem_over_the_candidates_only() -> None:
    scores = np.array([3.0, 1.0, 3.0, 2.0, 9.0, 5.0, 5.0])
    codes = np.array([0, 0, 0, 0, 0, 1, 1])
    mask = np.array([True, True, True, True, False, True, True])
    got = rank_percentile(scores, codes, mask)
    # problem 0 ranks 4 candidates (the masked 9.0 does not count): 1.0 -> 1, 2.0 -> 2, the two 3.0 -> 3.5
    np.testing.assert_array_equal(got[:4], [3.5 / 4, 1 / 4, 3.5 / 4, 2 / 4])
    assert np.isnan(got[4])
    np.testing.assert_array_equal(got[5:], [1.5 / 2, 1.5 / 2])


def test_blend_is_the_learner_at_w0_the_static_order_at_w1_and_rank_weighted_between() -> None:
    learner = np.array([10.0, 20.0, 30.0])
    static = np.array([0.9, -np.inf, 0.1])  # the second kernel was never seen in training
    codes, mask = np.zeros(3, dtype=np.int64), np.ones(3, dtype=bool)
    np.testing.assert_array_equal(blend(learner, static, codes, mask, 0.0), learner)
    np.testing.assert_array_equal(blend(learner, static, codes, mask, 1.0), [0.9, UNSEEN, 0.1])
    mid = blend(learner, static, codes, mask, 0.25)
    np.testing.assert_allclose(mid, 0.75 * np.array([1, 2, 3]) / 3 + 0.25 * np.array([3, 1, 2]) / 3)
    assert int(np.argmax(mid)) == 2 and int(np.argmax(blend(learner, static, codes, mask, 0.75))) == 0


def test_choose_weight_takes_the_best_inner_mean_and_the_smaller_w_on_a_tie() -> None:
    assert choose_weight({0.0: 0.5, 0.25: 0.8, 0.5: 0.8, 1.0: 0.7}) == 0.25
    assert choose_weight({0.0: 0.9, 0.5: 0.9}) == 0.0


# -- every row with its own GPU's constants ----------------------------------------------------------
def test_a_table_of_several_gpus_keeps_each_rows_arch(prepared) -> None:
    cfg, op, data = prepared
    assert data.multi_arch and sorted(a.name for a in data.archs) == sorted(DEVICES.values())
    assert data.arch_names() == [a.name for a in data.archs]
    # the run's arch (gfx90a) is the composed config itself, the others are read by name
    assert next(a for a in data.archs if a.name == "gfx90a") is cfg.arch
    assert data.shapes["arch"].tolist() == [data.archs[c].name for c in data.shape_arch]


def test_training_features_carry_each_rows_own_hardware_constants(prepared) -> None:
    from ckpred.fitting import arch_features, fit_method, plain_method
    from ckpred.models import booster
    from ckpred.schema import arch_config

    cfg, op, data = prepared
    method = plain_method(cfg)
    rows = np.arange(len(data.table))
    names = list(fit_method(method, data, np.arange(2), op, cfg, 0)[0].named_steps["features"]
                 .get_feature_names_out())
    features = arch_features(data, rows, method.recipe, op, cfg)
    cus = features[:, names.index("kt__hw_cus")]
    want = [arch_config(a).compute_units for a in data.table["arch"]]
    np.testing.assert_array_equal(cus, want)
    # and the fit sees them: the trees split on hardware constants (a constant column would never be split on)
    pipe, info = fit_method(method, data, np.arange(data.groups.n_shapes), op, cfg, 0)
    gain = dict(zip(names, booster(pipe).feature_importance(importance_type="gain")))
    assert sum(v for k, v in gain.items() if k.startswith("kt__hw_")) > 0
    assert sorted(info["archs"]) == sorted(DEVICES.values())


def test_a_problem_measured_on_several_gpus_is_one_selection_per_gpu(prepared) -> None:
    from ckpred.fitting import prepare

    cfg, op, data = prepared
    table = data.table.assign(gpu="MI250X")  # the op's query key no longer tells the GPUs apart
    again = prepare(table, op, cfg)
    assert again.groups.n_shapes == len(DEVICES)
    assert sorted(k.split("@")[1] for k in again.groups.keys) == sorted(DEVICES.values())


# -- leave one GPU out ----------------------------------------------------------------------------------
def test_leave_one_gpu_out_holds_out_every_row_of_one_gpu_with_its_own_arch(prepared) -> None:
    from ckpred.cv.schemes import make_folds

    cfg, op, data = prepared
    folds = make_folds(cfg.cv, data, 0)
    assert [f.name for f in folds] == [f"without_{a.name}" for a in data.archs]
    for fold, arch in zip(folds, data.archs):
        assert fold.test_arch is arch
        assert set(data.shape_arch[fold.test_shapes]) == {data.archs.index(arch)}
        assert data.archs.index(arch) not in set(data.shape_arch[fold.train_shapes])


def test_leave_one_gpu_out_refuses_a_table_of_one_gpu(tmp_path: Path) -> None:
    from ckpred.data import load_table
    from ckpred.fitting import prepare
    from ckpred.kernels.base import load_op
    from ckpred.cv.schemes import make_folds

    cfg = _cfg(write_caches(tmp_path, ["AMD Instinct MI250X"]))
    op = load_op(cfg.op)
    data = prepare(load_table(cfg), op, cfg)
    with pytest.raises(ConfigValueError, match=r"cv.*leave_one_gpu_out.*at least two GPUs.*\['gfx90a'\]"):
        make_folds(cfg.cv, data, 0)


@pytest.fixture(scope="module")
def logo_run(caches: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_logo(caches, tmp_path_factory.mktemp("logo"))


def test_leave_one_gpu_out_reports_each_gpu_and_their_mean_with_the_transfer_recipe_as_model(logo_run: Path) -> None:
    metrics = json.loads((logo_run / "metrics.json").read_text())
    assert "model = the transfer recipe" in metrics["_heading"]
    for method in ("model", "plain", "best_static", "random"):
        by_arch = metrics[method]["by_arch"]
        assert sorted(by_arch) == sorted(DEVICES.values())
        assert metrics[method]["mean_over_archs"] == pytest.approx(np.mean([r["mean"] for r in by_arch.values()]))
    folds = json.loads((logo_run / "folds.json").read_text())["folds"]
    for fold in folds:
        model = fold["model"]
        held = fold["fold"].removeprefix("without_")
        assert model["recipe"] == "transfer" and held not in model["archs"] and len(model["archs"]) == 4
        # the inner split scored every weight over the four training GPUs and chose the best (smaller on ties)
        inner = {float(w): m for w, m in model["inner"].items()}
        assert set(inner) == {0.0, 0.25, 0.5, 0.75, 1.0} and model["weight"] == choose_weight(inner)
        # plain is the recipe's learner: fitted once, scored as a method of its own
        assert fold["plain"]["fitted_as"] == "the model's transfer learner"
        assert fold["plain"]["trees"] == model["trees"] and "weight" not in fold["plain"]
    record = json.loads((logo_run / "run.json").read_text())
    assert record["model"] == "transfer" and record["cv"] == "leave_one_gpu_out"


def test_the_recipe_equals_plain_when_the_inner_split_picks_w0_and_the_static_order_at_w1(logo_run: Path) -> None:
    oof = pd.read_parquet(logo_run / "oof_predictions.parquet")
    folds = {f["fold"]: f for f in json.loads((logo_run / "folds.json").read_text())["folds"]}
    names = list(folds)
    for i, name in enumerate(names):
        rows = oof[(oof["fold"] == i) & oof["selectable"]]
        w = folds[name]["model"]["weight"]
        if w == 0.0:
            np.testing.assert_array_equal(rows["score_model"], rows["score_plain"])
        elif w == 1.0:
            static = np.where(np.isfinite(rows["score_best_static"]), rows["score_best_static"], UNSEEN)
            np.testing.assert_array_equal(rows["score_model"], static)
        else:
            assert rows["score_model"].between(0, 1).all()


def test_transfer_mode_off_keeps_the_model_recipe(caches: Path, tmp_path: Path) -> None:
    cross_validate(_cfg(caches, "transfer.mode=off", "save_pipeline=false", f"out_dir={tmp_path}"), tmp_path)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["model"] == "lgbm_ranker"
    assert "transfer" not in json.loads((tmp_path / "metrics.json").read_text())["_heading"]


def test_transfer_config_refuses_bad_weights_and_modes(caches: Path) -> None:
    with pytest.raises(ConfigValueError, match="transfer.mode"):
        _cfg(caches, "transfer.mode=maybe")
    with pytest.raises(ConfigValueError, match=r"transfer.weights.*distinct numbers in \[0, 1\]"):
        _cfg(caches, "transfer.weights=[0.5,1.5]")


def test_one_training_gpu_has_no_inner_split_and_blends_nothing(prepared) -> None:
    from ckpred.transfer import TransferModel, fit_learned, transfer_method

    cfg, op, data = prepared
    model, info = fit_learned(transfer_method(cfg), data, np.array([0]), op, cfg, 0)
    assert isinstance(model, TransferModel) and model.weight == 0.0 and model.inner == {}
    assert info["archs"] == [data.archs[data.shape_arch[0]].name]


# -- export --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(logo_run: Path, caches: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_transfer(logo_run, caches, tmp_path_factory.mktemp("ex"))


def test_export_ships_the_recipe_for_a_gpu_it_never_trained_on(exported: Path, logo_run: Path) -> None:
    import joblib

    manifest = json.loads((exported / "manifest.json").read_text())
    model = joblib.load(logo_run / "pipeline.joblib")
    section = manifest["transfer"]
    assert manifest["arch"] == "sm90_h100" and manifest["select"] == "full"
    assert section["weight"] == model.weight and sorted(section["trained_archs"]) == sorted(DEVICES.values())
    assert 0 < model.weight < 1  # the graph blends (this table's inner split says so)
    assert sorted(manifest["training"]["archs"]) == sorted(DEVICES.values())
    names = [row[1] for row in manifest["catalogue"]["rows"]]
    assert section["static_by"] == [] and len(section["static_order"]) == 1
    assert section["static_order"][0] == [round(float(model.static.get(n, UNSEEN)), 9) for n in names]
    assert manifest["parity"]["checked"] and manifest["parity"]["top1_agreement"] == 1.0


def test_the_exported_selector_answers_the_recipes_blend_over_the_catalogue(exported: Path, logo_run: Path,
                                                                            caches: Path) -> None:
    import joblib

    from ckpred.kernels.base import load_op
    from ckpred.runtime import KernelSelector
    from ckpred.schema import arch_config

    model = joblib.load(logo_run / "pipeline.joblib")
    sel = KernelSelector.load(exported, cache_size=0)
    op = load_op(compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "experiment=kernel_tuner_gpus",
                                   f"data.path={caches}/*.json"]).op)
    cat = sel.catalogue
    cfg = _cfg(caches)
    h100 = arch_config("sm90_h100")
    learner = model.learner_pipeline(op, cfg, h100, cat.assign(gpu="H100"))
    for gpu in ("H100", "A100", "W6600"):
        frame = cat.drop(columns=["kernel_id"]).assign(gpu=gpu)
        scores = np.asarray(learner.predict(op.encode_frame(frame)), dtype=np.float64)
        valid, _ = op.validity(frame, frame, arch=h100, dtype=cfg.dtype, layout=cfg.layout)
        want = blend(scores, model.static_scores(frame, np.arange(len(frame))), np.zeros(len(frame), dtype=np.int64),
                     np.asarray(valid, bool), model.weight)
        want = np.where(valid, want, -np.inf)
        order = np.argsort(-want, kind="stable")[:5]
        got = sel.select(gpu=gpu, top_k=5)
        assert list(got.ids) == order.tolist()
        assert list(got.scores) == want[order].tolist()  # the graph's doubles are the reference's


def test_problems_whose_best_kernel_no_training_gpu_ran_are_told_apart(prepared) -> None:
    from ckpred.cv.schemes import make_folds
    from ckpred.cv.scoring import Tables, best_kernel_seen
    from ckpred.fitting import prepare

    cfg, op, data = prepared
    assert best_kernel_seen(Tables(data, data), make_folds(cfg.cv, data, 0)) is None  # every GPU ran every kernel
    best = data.shapes.set_index("gpu")["best_kernel"]
    table = data.table[(data.table["gpu"] == "MI250X") | (data.table["kernel_name"] != best["MI250X"])]
    only_here = prepare(table, op, cfg)
    labels = best_kernel_seen(Tables(only_here, only_here), make_folds(cfg.cv, only_here, 0))
    assert dict(zip(only_here.shapes["gpu"], labels))["MI250X"] == "unseen"
    assert (labels == "unseen").sum() == 1 + sum(best[g] == best["MI250X"] for g in best.index if g != "MI250X")


@pytest.mark.slow
def test_a_sparse_table_of_several_gpus_learns_applicability_on_each_gpus_constants(tmp_path: Path) -> None:
    """A table of several GPUs whose missing rows mean "not applicable": every candidate row, and
    the mask learning which pairs apply, use the row's own GPU. Here the shared-memory
    configurations are absent on the GPUs with 64 KiB of it; held out, such a GPU gets them
    masked from its own constants, and one with more keeps them."""
    caches = write_caches(tmp_path / "caches")
    for path in caches.glob("*.json"):
        doc = json.loads(path.read_text())
        if arch_config(DEVICES[doc["device_name"]]).shared_memory_kib <= 64:
            doc["cache"] = {k: v for k, v in doc["cache"].items() if not v["use_shmem"]}
        path.write_text(json.dumps(doc))
    out = tmp_path / "run"
    out.mkdir()
    cross_validate(train_config(caches, f"out_dir={out}", "op.absence=not_applicable",
                                "applicability.n_estimators=30", "applicability.num_leaves=7",
                                "applicability.min_child_samples=2"), out)
    oof = pd.read_parquet(out / "oof_predictions.parquet")
    gpu = oof["shape"].astype(str)
    shmem = oof["kernel_name"].astype(str).str.strip("()").str.split(",").str[KEYS.index("use_shmem")] == "1"
    assert shmem.any() and set(gpu) == {d.split()[-1] for d in DEVICES}
    # the candidates are the held-out GPU's own: its absent configurations are there, unmeasured
    small = gpu == "W7800"
    assert (small & shmem).any() and not oof.loc[small & shmem, "measured"].any()
    assert not oof.loc[small & shmem, "selectable"].any()  # masked from the W7800's own 64 KiB
    assert oof.loc[(gpu == "A100") & shmem, "selectable"].all()  # 164 KiB: kept
