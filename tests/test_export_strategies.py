"""Selection strategies (export.select): pruned candidate sets, their graph parity, CV honesty."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ckpred.config import compose
from ckpred.export import manifest as mf
from ckpred.export import onnx as xo
from ckpred.export import strategies as st
from ckpred.export.build import ExportOptions, export_pipeline
from ckpred.runtime import KernelSelector
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table


@pytest.fixture(scope="module")
def setup():
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    return op, cfg, table


def test_learn_keep_takes_top_n_per_shape_and_a_fallback() -> None:
    # 2 shapes x 4 kernels; kernel 3 is never fast but valid everywhere (the fallback).
    kid = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    perf = np.array([9.0, 8.0, 1.0, 0.5, 1.0, 2.0, 7.0, 0.5])
    sel = np.array([True, True, True, True, True, False, True, True])
    codes = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert st.learn_keep(kid, perf, sel, codes, 4, top_n=1).tolist() == [0, 2]
    # kernel 1 is fastest-but-one of shape 1 only when rule-invalid rows count: they do not
    assert st.learn_keep(kid, perf, sel, codes, 4, top_n=2).tolist() == [0, 1, 2]
    probes = np.array([[True, False, True, True], [False, True, False, True]])
    assert st.learn_keep(kid, perf, sel, codes, 4, top_n=1, fallback_valid=probes).tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="top_n"):
        st.learn_keep(kid, perf, sel, codes, 4, top_n=0)


def test_keep_is_learned_from_the_given_shapes_only(setup) -> None:
    op, cfg, table = setup
    keys = np.asarray(op.shape_keys(table))
    shapes = pd.unique(keys)
    held_out = shapes[-1]
    train_keys = shapes[:-1]
    # the held-out shape's own winner becomes its winner alone: make it a kernel nobody else likes
    t = table.copy()
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    rows = np.flatnonzero((keys == held_out) & t["is_valid"].to_numpy())
    loser = t["kernel_name"].to_numpy()[rows[0]]
    t.loc[rows[0], "tflops"] = 1e9
    t.loc[(keys != held_out) & (t["kernel_name"] == loser).to_numpy(), "tflops"] = 0.0
    loser_id = int(cat.set_index("kernel_name").loc[loser, "kernel_id"])
    kw = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=1)
    assert loser_id in st.keep_for_table(t, op, **kw)
    assert loser_id not in st.keep_for_table(t, op, shapes=train_keys, **kw)


@pytest.fixture(scope="module")
def pruned(setup, tmp_path_factory):
    op, cfg, table = setup
    pipe = fit_pipeline(op, cfg, table, model="ranker", target="rank")
    keep = st.keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=2)
    probs = pd.DataFrame(EDGE_SHAPES + TRAIN_SHAPES, columns=["m", "n", "k"]).assign(split_k=1)
    d = tmp_path_factory.mktemp("pruned") / "gemm_universal_gfx950_fp8_rcr"
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op),
                          options=ExportOptions(parity_problems=probs, select="pruned", candidates=keep,
                                                selection={"top_n": 2}))
    return pipe, keep, d, man


@pytest.mark.slow
def test_pruned_export_records_strategy_and_meets_parity(setup, pruned) -> None:
    op, cfg, _ = setup
    _, keep, _, man = pruned
    C = len(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))
    assert man["select"] == "pruned"
    assert man["selection"]["strategy"] == "pruned" and man["selection"]["top_n"] == 2
    assert man["selection"]["candidate_ids"] == keep.tolist() and 0 < len(keep) < C
    assert man["parity"]["checked"] and man["parity"]["top1_agreement"] == 1.0
    assert max(man["parity"]["max_abs_diff_scorer"], man["parity"]["max_abs_diff_selector"]) <= 1e-6


#: Recipe of the reranker tests: the export defaults (full features, lambdarank), one thread.
RERANKER = {"n_estimators": 20, "num_leaves": 7}


@pytest.fixture(scope="module")
def reranked(setup, tmp_path_factory):
    op, cfg, table = setup
    recipe = compose("export", ["features=minimal", "model.n_jobs=1"])
    pipe = fit_pipeline(op, cfg, table, model="ranker", target="rank")
    keep = st.keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=2)
    reranker = st.fit_reranker(table, op, keep, st.Strategy(cfg.arch, cfg.dtype, cfg.layout, reranker=RERANKER,
                                                            recipe=recipe))
    probs = pd.DataFrame(EDGE_SHAPES + TRAIN_SHAPES, columns=["m", "n", "k"]).assign(split_k=1)
    d = tmp_path_factory.mktemp("reranked") / "gemm_universal_gfx950_fp8_rcr"
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op),
                          options=ExportOptions(parity_problems=probs, select="reranked", candidates=keep,
                                                selection={"top_n": 2, "reranker": RERANKER}, reranker=reranker))
    return reranker, keep, d, man


@pytest.mark.slow
def test_reranker_is_the_recipe_sized_down_and_fitted_on_candidate_rows_only(setup, reranked, monkeypatch) -> None:
    op, cfg, table = setup
    reranker, keep, _, man = reranked
    model = reranker.named_steps["model"]
    assert (model.n_estimators, model.num_leaves, model.n_jobs) == (20, 7, 1)
    assert model.objective == "lambdarank" and reranker.ckpred_target_ == "rank"
    assert list(reranker[:-1].get_feature_names_out()) == man["features"]  # the recipe's features
    rows = st.candidate_rows(table, op, keep, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    assert 0 < rows.sum() < len(table)
    assert model.booster_.num_trees() == 20
    fitted_on = []
    real = st.fit_pipeline
    monkeypatch.setattr(st, "fit_pipeline",
                        lambda pipe, rows, *a, **kw: fitted_on.append(rows.X) or real(pipe, rows, *a, **kw))
    st.fit_reranker(table, op, keep, st.Strategy(cfg.arch, cfg.dtype, cfg.layout, reranker=RERANKER,
                                                 recipe=compose("export", ["features=minimal"])))
    X = fitted_on[0]
    kernels = list(op.kernel_names)
    candidates = op.encode_frame(op.catalogue(cfg.arch, cfg.dtype, cfg.layout).iloc[keep], tuple(kernels))
    assert len(X) == rows.sum()
    assert set(map(tuple, X[kernels].to_numpy())) <= set(map(tuple, candidates.to_numpy()))


def test_reranker_trees_scale_with_the_recipes_learning_rate() -> None:
    """A null ``n_estimators`` keeps trees x learning rate fixed (a smaller rate under-fits with
    the same trees); a configured size is used as given; the config refuses a size below 1."""
    from ckpred.errors import ConfigValueError
    from ckpred.export.strategies import reranker_size
    from ckpred.schema import ExportRerankerConfig, ModelConfig

    default = {"n_estimators": None, "num_leaves": 31}
    rate = lambda r: ModelConfig(name="lgbm_regressor", learning_rate=r)  # noqa: E731
    assert reranker_size(default, rate(0.1)) == {"n_estimators": 70, "num_leaves": 31}
    assert reranker_size(default, rate(0.05)) == {"n_estimators": 140, "num_leaves": 31}
    assert reranker_size({"n_estimators": 100, "num_leaves": 15}, rate(0.05)) == \
        {"n_estimators": 100, "num_leaves": 15}
    assert ExportRerankerConfig().n_estimators is None
    with pytest.raises(ConfigValueError, match="reranker.n_estimators"):
        ExportRerankerConfig(n_estimators=0)


def test_reranked_export_records_both_models_and_meets_parity(setup, reranked) -> None:
    _, keep, _, man = reranked
    assert man["select"] == "reranked" and man["selection"]["reranker"] == RERANKER
    assert man["selection"]["candidate_ids"] == keep.tolist()
    assert man["selector_model"]["n_trees"] == 20 and man["selector_model"]["params"]["num_leaves"] == 7
    assert man["model"]["n_trees"] == 40  # the scorer keeps the full model
    assert man["parity"]["checked"] and man["parity"]["top1_agreement"] == 1.0
    assert max(man["parity"]["max_abs_diff_scorer"], man["parity"]["max_abs_diff_selector"]) <= 1e-6


def test_reranked_export_needs_its_reranker(setup, tmp_path) -> None:
    op, cfg, table = setup
    pipe = fit_pipeline(op, cfg, table, model="ranker", target="rank", n_estimators=5)
    with pytest.raises(ValueError, match="reranked.*reranker"):
        export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=tmp_path / "x",
                        training={}, options=ExportOptions(select="reranked", candidates=np.array([0, 1])))


@pytest.mark.parametrize("strategy", ["pruned", "reranked"])
def test_selector_equals_its_pipeline_on_the_candidates(setup, strategy, request) -> None:
    op, cfg, _ = setup
    pipe, keep, d, _ = request.getfixturevalue(strategy)
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    sess = xo.session(open(d / mf.SELECTOR_FILE, "rb").read())
    sub = cat.iloc[keep].reset_index(drop=True)
    for m, n, k in EDGE_SHAPES[:6] + TRAIN_SHAPES[:4]:
        rows = sub.assign(m=m, n=n, k=k, split_k=1)
        ref = np.asarray(pipe.predict(op.encode_frame(rows)), dtype=float)
        valid, _ = op.validity(rows, rows, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        ids, scores, nvalid = sess.run(None, {"problem": np.array([[m, n, k, 1]]), "top_k": np.array([3])})
        assert int(nvalid[0]) == int(valid.sum())
        n_real = min(3, int(valid.sum()))
        order = np.argsort(-np.where(valid, ref, -np.inf), kind="stable")[:n_real]
        assert ids[0, :n_real].tolist() == keep[order].tolist()
        assert np.max(np.abs(scores[0, :n_real] - ref[order]), initial=0.0) <= 1e-6


def test_runtime_answers_from_a_pruned_export_within_candidates(pruned) -> None:
    _, keep, d, _ = pruned
    sel = KernelSelector.load(d, cache_size=2)
    got = sel.select(1024, 7168, 2304, top_k=3)
    assert got.ok and set(got.ids) <= set(keep.tolist())


def test_cv_efficiency_learns_each_folds_candidates_from_its_training_shapes(setup) -> None:
    op, cfg, table = setup
    t = table.reset_index(drop=True).copy()
    keys = np.asarray(op.shape_keys(t))
    shapes = pd.unique(keys)
    # shape 0's fastest kernel is fast nowhere else: a candidate set learned without shape 0 misses it
    rows0 = np.flatnonzero((keys == shapes[0]) & t["is_valid"].to_numpy())
    special = t["kernel_name"].to_numpy()[rows0[0]]
    t.loc[rows0[0], "tflops"] = t["tflops"].to_numpy()[rows0].max() * 2
    t.loc[(keys != shapes[0]) & (t["kernel_name"] == special).to_numpy(), "tflops"] = 0.0
    valid, _ = op.validity(t, t, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    perf = np.where(t["is_valid"].to_numpy(), t["tflops"].to_numpy(), 0.0)
    fold = pd.Series(keys).map({k: i % 2 for i, k in enumerate(shapes)}).to_numpy()
    oof = pd.DataFrame({"shape": keys, "fold": fold, "kernel_name": t["kernel_name"], "perf": perf,
                        "selectable": valid, "score_model": perf})  # oracle scores: full picks the best
    kw = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    full = st.cv_efficiency(oof, t, op, st.Strategy(top_n=None, **kw))
    pruned = st.cv_efficiency(oof, t, op, st.Strategy(top_n=1, **kw))
    assert np.allclose(full["efficiency"].dropna(), 1.0)
    first = full.index[0]  # shape 0 is tested in fold 0, whose candidates come from fold 1's shapes only
    assert pruned.loc[first, "efficiency"] <= 0.5 + 1e-9
    assert (pruned["candidates"] < len(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))).all()


def _slowest_first(op, cfg, table: pd.DataFrame, fold) -> pd.DataFrame:
    """Out-of-fold rows of ``table`` whose scores pick each shape's slowest candidate."""
    valid, _ = op.validity(table, table, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    perf = np.where(table["is_valid"].to_numpy(), table["tflops"].to_numpy(), 0.0)
    return pd.DataFrame({"shape": np.asarray(op.shape_keys(table)), "fold": fold, "kernel_name": table["kernel_name"],
                         "perf": perf, "selectable": valid, "score_model": -perf})


def _reranker_shapes(op, monkeypatch) -> list[set]:
    """The shapes each reranker fit sees, in order (``fit_reranker`` spied on)."""
    seen: list[set] = []
    real = st.fit_reranker

    def spy(tab, *a, **kw):
        seen.append(set(op.shape_keys(tab)))
        return real(tab, *a, **kw)

    monkeypatch.setattr(st, "fit_reranker", spy)
    return seen


@pytest.mark.slow
def test_cv_reranker_of_each_fold_sees_its_training_shapes_only(setup, monkeypatch) -> None:
    op, cfg, table = setup
    t = table.reset_index(drop=True)
    keys = np.asarray(op.shape_keys(t))
    shapes = pd.unique(keys)
    fold = pd.Series(keys).map({k: i % 3 for i, k in enumerate(shapes)}).to_numpy()
    oof = _slowest_first(op, cfg, t, fold)
    seen = _reranker_shapes(op, monkeypatch)
    kw = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    out = st.cv_efficiency(oof, t, op, st.Strategy(top_n=2, reranker=RERANKER,
                                                   recipe=compose("export", ["model.n_jobs=1"]), **kw))
    assert len(seen) == 3
    for f, train_shapes in enumerate(seen):
        assert train_shapes == set(shapes[[i % 3 != f for i in range(len(shapes))]])
    # the reranker's scores replaced the out-of-fold ones, which pick the slowest candidate
    assert out["efficiency"].mean() > st.cv_efficiency(oof, t, op, st.Strategy(top_n=2, **kw))["efficiency"].mean()
    with pytest.raises(ValueError, match="top_n"):
        st.cv_efficiency(oof, t, op, st.Strategy(top_n=None, reranker=RERANKER, recipe=compose("export"), **kw))


def test_cv_of_an_external_test_run_learns_from_the_training_table(setup, monkeypatch) -> None:
    """cv=external: one fold, the tested shapes are another table's; candidates and reranker
    come from every shape of the training table and none of the tested one."""
    op, cfg, table = setup
    t = table.reset_index(drop=True)
    keys = np.asarray(op.shape_keys(t))
    shapes = pd.unique(keys)
    trained = np.isin(keys, shapes[: len(shapes) // 2])
    train, test = t[trained].reset_index(drop=True), t[~trained].reset_index(drop=True)
    oof = _slowest_first(op, cfg, test, "external")
    seen = _reranker_shapes(op, monkeypatch)
    kw = dict(arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=2)
    out = st.cv_efficiency(oof, test, op, st.Strategy(reranker=RERANKER, recipe=compose("export", ["model.n_jobs=1"]),
                                                      **kw), train_table=train)
    assert seen == [set(shapes[: len(shapes) // 2])]
    assert out["candidates"].eq(len(st.keep_for_table(train, op, arch=cfg.arch, dtype=cfg.dtype,
                                                      layout=cfg.layout, top_n=2))).all()
    assert out["efficiency"].mean() > st.cv_efficiency(oof, test, op, st.Strategy(**kw),
                                                       train_table=train)["efficiency"].mean()
    # without the training table the one fold has no other folds to learn from
    with pytest.raises(ValueError, match="no training rows"):
        st.cv_efficiency(oof, test, op, st.Strategy(**kw))


@pytest.mark.parametrize("keep", [[], [0, 0], [-1], [10**6]])
def test_selector_refuses_a_bad_candidate_set(setup, pruned, keep) -> None:
    from ckpred.export.validity import bound_mask, mask_builder_for

    op, cfg, _ = setup
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    with pytest.raises(ValueError, match=rf"keep must be distinct catalogue ids in \[0, {len(cat)}\), got {len(keep)} ids"):
        mask = bound_mask(mask_builder_for(op), op, cfg.arch, cfg.dtype, cfg.layout)
        xo.build_selector(pruned[0], op, cat, mask=mask, keep=np.array(keep, dtype=np.int64))
