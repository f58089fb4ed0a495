"""``model.backend=dask``: partitioned Parquet datasets, LightGBM's Dask interface, CV folds as
tasks, on a tiny two-worker LocalCluster (started once for the module)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred.config import compose
from ckpred.errors import ConfigValueError, InputFileError

# starts Dask clusters: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow

pytest.importorskip("distributed")

from ckpred import scale  # noqa: E402
from ckpred.commands.train import train  # noqa: E402
from ckpred.data.shapes import load_shapes  # noqa: E402
from ckpred.data.simulate import simulate  # noqa: E402
from ckpred.dtypes import load_dtype  # noqa: E402
from ckpred.kernels.base import load_op  # noqa: E402
from ckpred.models import booster  # noqa: E402
from ckpred.schema import arch_config  # noqa: E402
from tests.conftest import reading_files  # noqa: E402

SMALL = ["shapes=tiny", "model.n_estimators=8", "model.num_leaves=7", "model.n_jobs=1",
         "rows.max_per_shape=128", "rows.keep_top=32", "progress=false", "plots=false"]
COMBOS = [("gfx942", "fp16"), ("gfx950", "bf16")]


@pytest.fixture(scope="module")
def client():
    from omegaconf import OmegaConf

    with scale.dask_client(OmegaConf.create({"address": None, "n_workers": 2, "memory_limit": "1GiB"})) as c:
        yield c


def _frames(shapes: pd.DataFrame, per_part: int):
    op = load_op("gemm_universal")
    for arch, dtype in COMBOS:
        for i in range(0, len(shapes), per_part):
            yield simulate(shapes.iloc[i:i + per_part], op, arch_config(arch), load_dtype(dtype),
                           scale.layout_config("rcr"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = compose("train", SMALL)
    out = tmp_path_factory.mktemp("partitioned")
    manifest = scale.write_partitions(_frames(load_shapes(cfg.shapes), 3), out, load_op(cfg.op))
    assert len(manifest["partitions"]) == 8
    return out


def _all_rows(dataset: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in sorted(dataset.glob("part-*.parquet"))], ignore_index=True)


def _cfg(*extra: str):
    small = reading_files(SMALL) if "data=path" in extra else SMALL
    return compose("train", [*small, "arch=gfx942", "dtype=fp16", *extra])


def test_dask_fit_matches_the_in_memory_fit(dataset: Path, client) -> None:
    cfg = _cfg()
    op = load_op(cfg.op)
    test = (0.0, 0.3)
    local, info_l = scale.fit_partitioned(cfg, op, dataset, backend="local", test=test)
    remote, info_d = scale.fit_partitioned(cfg, op, dataset, backend="dask", client=client, test=test)
    # the same training rows reach LightGBM whichever backend reads the partitions
    assert info_l["train_rows"] == info_d["train_rows"] > 0
    assert booster(remote).current_iteration() == 8
    on_l = scale.summary(scale.score_partitioned(local, cfg, op, dataset, test=test))
    on_d = scale.summary(scale.score_partitioned(remote, cfg, op, dataset, test=test, client=client))
    assert on_l["queries"] == on_d["queries"] > 0
    # data-parallel LightGBM finds each feature's bins on one worker's share of the rows (here
    # ~1,000 rows): the trees are close to, not equal with, one process's (a ranker's scores
    # agree less across queries than within one). The bench compares the two on 1.5M rows.
    X = op.encode_frame(_all_rows(dataset))
    assert np.corrcoef(local.predict(X), remote.predict(X))[0, 1] > 0.75
    # scoring on the cluster and here agree for one pipeline
    here = scale.summary(scale.score_partitioned(remote, cfg, op, dataset, test=test))
    assert here == pytest.approx(on_d)


def test_the_pipeline_is_an_ordinary_fitted_pipeline(dataset: Path, client, tmp_path: Path) -> None:
    cfg = _cfg()
    op = load_op(cfg.op)
    pipe, _ = scale.fit_partitioned(cfg, op, dataset, backend="dask", client=client)
    import lightgbm as lgb

    assert type(pipe.named_steps["model"]) is lgb.LGBMRanker
    table = pd.read_parquet(sorted(dataset.glob("part-*.parquet"))[0])
    X = op.encode_frame(table)
    scores = pipe.predict(X)
    Xt = pipe.named_steps["features"].transform(X)
    assert np.array_equal(scores, booster(pipe).predict(Xt))
    assert pipe.ckpred_target_ == "rank"
    # and it exports like a pipeline fitted in one process (ONNX parity on the table's shapes)
    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline

    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=tmp_path / "x",
                          training=mf.training_section(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout),
                          options=ExportOptions(parity_problems=table[list(op.problem_names)].drop_duplicates()))
    assert man["parity"]["checked"] and man["parity"]["top1_agreement"] == 1.0


def test_regressor_backend_dask(dataset: Path, client) -> None:
    cfg = _cfg("model=lgbm_regressor", "target=log1p", "model.n_estimators=8", "model.num_leaves=7",
               "model.n_jobs=1")
    op = load_op(cfg.op)
    local, _ = scale.fit_partitioned(cfg, op, dataset, backend="local", test=(0.0, 0.3))
    remote, _ = scale.fit_partitioned(cfg, op, dataset, backend="dask", client=client, test=(0.0, 0.3))
    X = op.encode_frame(_all_rows(dataset))
    a, b = local.predict(X), remote.predict(X)
    # predictions are TFLOPS again (the transform is inverted once: the local fit's scale), and
    # the two fits agree closely (not exactly: the bins come from each worker's rows)
    assert np.corrcoef(np.log1p(a), np.log1p(b))[0, 1] > 0.95
    assert float(np.median(np.abs(b - a) / a)) < 0.1 and float(np.median(b)) > 1.0


def test_a_query_split_across_partitions_is_refused(tmp_path: Path, client) -> None:
    cfg = _cfg()
    op = load_op(cfg.op)
    table = simulate(load_shapes(cfg.shapes).head(2), op, cfg.arch, cfg.dtype, scale.layout_config("rcr"))
    half = len(table) // 4  # inside the first shape
    scale.write_partitions([table.iloc[:half], table.iloc[half:]], tmp_path, op)
    for backend in ("local", "dask"):
        with pytest.raises(scale.QuerySplitError) as err:
            scale.fit_partitioned(cfg, op, tmp_path, backend=backend, client=client)
        msg = str(err.value)
        assert "gfx942/fp16/rcr/" in msg and "part-00000.parquet" in msg and "part-00001.parquet" in msg


def test_partitions_without_rows_are_skipped_or_refused_by_name(tmp_path: Path) -> None:
    """An empty first part is passed over for the feature step's rows; a dataset whose every
    part is empty is a one-line error naming the manifest (it was a bare StopIteration)."""
    cfg = _cfg()
    op = load_op(cfg.op)
    table = simulate(load_shapes(cfg.shapes).head(2), op, cfg.arch, cfg.dtype, scale.layout_config("rcr"))
    scale.write_partitions([table.iloc[:0], table], tmp_path / "some", op)
    _, info = scale.fit_partitioned(cfg, op, tmp_path / "some", backend="local")
    assert info["train_rows"] > 0
    scale.write_partitions([table.iloc[:0]], tmp_path / "none", op)
    with pytest.raises(InputFileError, match=r"_ckpred_partitions\.json: every partition holds 0 rows"):
        scale.fit_partitioned(cfg, op, tmp_path / "none", backend="local")


def _in_memory_baselines(dataset: Path, op, test: tuple[float, float]) -> pd.DataFrame:
    """``best_static``, ``random`` and ``analytical`` per held-out query, the best-static order
    learned on every training row of the dataset at once (one process, as the in-memory ``train``
    does: :func:`ckpred.evaluate.best_static_scores`); each combo's rows then scored with its
    own validity rules and constants."""
    from ckpred import evaluate as ev
    from ckpred.fitting import prepare

    table = _all_rows(dataset)
    held = scale.PartitionRecipe(op=op, recipe=None, rows=None, seed=0, test_lo=test[0],
                                 test_hi=test[1]).held_out(table)
    train_rows = np.flatnonzero(~held)
    groups = ev.ShapeGroups.from_keys(scale._query_keys(table.iloc[train_rows], op).to_numpy())
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    names = table["kernel_name"].to_numpy(dtype=object)
    out = []
    for _, rows in table[held].groupby(["arch", "dtype", "layout"]):
        rows = rows.reset_index(drop=True)
        combo = scale.combo_config(rows)
        data = prepare(rows, op, combo, arch=combo.arch)
        static, _ = ev.best_static_scores(names[train_rows], perf[train_rows], groups, rows["kernel_name"].to_numpy())
        keys = scale._query_keys(rows.iloc[data.groups.first_rows()], op).to_numpy()
        for method, ps in (
                ("best_static", ev.shape_metrics(data.perf, static, data.groups, data.selectable)),
                ("random", ev.random_shape_metrics(data.perf, data.groups)),
                ("analytical", ev.shape_metrics(data.perf, ev.op_analytical_scores(rows, op, combo.arch, combo.dtype),
                                                data.groups, data.selectable))):
            out.append(pd.DataFrame({"method": method, "query": keys, "efficiency": ps["efficiency"].to_numpy(),
                                     "top1": ps["top1"].to_numpy()}))
    return pd.concat(out, ignore_index=True)


@pytest.mark.parametrize("by", [(), ("m",)])
def test_best_static_order_from_partition_sums_equals_the_one_process_order(dataset: Path, by: tuple) -> None:
    """Per-file sums and counts, added up, give the order learned on all training rows at once
    (here without a cluster: the reduction is the same)."""
    from ckpred import evaluate as ev

    op = load_op("gemm_universal")
    part = scale.PartitionRecipe(op=op, recipe=None, rows=None, seed=0, test_lo=0.25, test_hi=0.75, static_by=by)
    order = scale.best_static_order(part, sorted(str(f) for f in dataset.glob("part-*.parquet")))
    table = _all_rows(dataset)
    train_rows = np.flatnonzero(~part.held_out(table))
    groups = ev.ShapeGroups.from_keys(scale._query_keys(table.iloc[train_rows], op).to_numpy())
    keys = ev.static_keys(table, train_rows, list(by))
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())[train_rows]
    _, ranking = ev.best_static_scores(keys, perf, groups, keys[:1])
    assert len(order) == len(ranking) == len(set(keys)) and order.max() > 0
    assert np.allclose(order[ranking.index].to_numpy(), ranking.to_numpy(), rtol=1e-12, atol=0)
    if by:
        assert all("@" in k for k in order.index)


def test_train_command_on_a_partitioned_dataset(dataset: Path, tmp_path: Path) -> None:
    cfg = _cfg("model.backend=dask", "model.dask.memory_limit=1GiB", "data=path", f"data.path={dataset}",
               "cv=group_kfold", "cv.n_splits=2", "plots=true", f"out_dir={tmp_path}")
    mean = train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    record = json.loads((tmp_path / "run.json").read_text())
    assert metrics["model"]["mean"] == pytest.approx(mean) and 0.5 < mean <= 1.0
    assert record["backend"] == "dask" and record["data"]["partitions"] == 8
    # validity.learned (the default): the simulator's launch failures are random, nothing is kept
    assert record["failure_model"] is False
    assert all(f["failure_model"] is False and f["failed_rows"] > 0
               for f in json.loads((tmp_path / "folds.json").read_text())["folds"])
    assert record["data"]["combos"] == ["gfx942/fp16/rcr", "gfx950/bf16/rcr"]
    assert (tmp_path / "pipeline.joblib").is_file()
    # the baselines on the same held-out queries, reported as the in-memory run reports them
    assert [m for m in metrics if not m.startswith("_")] == ["model", "best_static", "analytical", "random"]
    per_query = pd.read_csv(tmp_path / "per_query.csv")
    for method in ("model", "best_static", "analytical", "random"):
        rep = metrics[method]
        assert {"mean", "p10", "top1", "efficiency@5", "failed_pick", "by_family", "folds"} <= set(rep)
        assert rep["folds"]["n"] == 2 and 0.0 < rep["p10"] <= rep["mean"] <= 1.0
        rows = per_query[per_query["method"] == method]
        assert len(rows) == rep["n_shapes"] + rep["n_shapes_without_valid_kernel"] > 0
        assert rows["efficiency"].mean() == pytest.approx(rep["mean"])
        assert record["metrics"][method]["mean"] == rep["mean"]
    assert metrics["model"]["mean"] > metrics["random"]["mean"]
    # equal to the baselines computed on the whole table in one process, fold by fold
    op = load_op(cfg.op)
    expected = pd.concat([_in_memory_baselines(dataset, op, (i / 2, (i + 1) / 2)) for i in range(2)])
    got = per_query.merge(expected, on=["method", "query"], suffixes=("", "_in_memory"))
    assert len(got) == len(per_query) - (per_query["method"] == "model").sum() == len(expected)
    for col in ("efficiency", "top1"):
        assert np.allclose(got[col], got[f"{col}_in_memory"], rtol=1e-12, atol=0, equal_nan=True), col
    folds = json.loads((tmp_path / "folds.json").read_text())["folds"]
    assert len(folds[0]["best_static"]["top_kernels"]) == 5
    assert [f["seed"] for f in folds] == [0, 1]  # seed + fold, as the in-memory CV seeds its folds
    assert (tmp_path / "efficiency_cdf.png").stat().st_size > 0 and (tmp_path / "efficiency_at_k.png").is_file()


def test_an_ingested_table_directory_trains_on_dask(tmp_path: Path) -> None:
    """``ckpred ingest out=<dir>`` writes whole queries per part and the manifest; the Dask
    backend trains from that directory with no Python step between."""
    from ckpred.data.ingest import ingest_to_parquet
    from ckpred.data.table import write_table

    cfg = _cfg()
    op = load_op(cfg.op)
    table = simulate(load_shapes(cfg.shapes), op, cfg.arch, cfg.dtype, scale.layout_config("rcr"))
    write_table(table, tmp_path / "bench.parquet", op)
    ingest_to_parquet(tmp_path / "bench.parquet", op, tmp_path / "table", tmp_path / "rejects.csv",
                      arch="gfx942", dtype="fp16", layout="rcr", chunk_bytes=64 << 10)
    manifest = json.loads((tmp_path / "table" / "_ckpred_partitions.json").read_text())
    assert len(manifest["partitions"]) > 1 and manifest["rows"] == len(table)
    out = tmp_path / "run"
    mean = train(_cfg("model.backend=dask", "model.dask.memory_limit=1GiB", "data=path",
                      f"data.path={tmp_path / 'table'}", "cv=holdout", "cv.test_fraction=0.3", f"out_dir={out}"))
    record = json.loads((out / "run.json").read_text())
    assert 0.5 < mean <= 1.0 and record["data"]["partitions"] == len(manifest["partitions"])


def test_cv_folds_run_as_tasks_with_the_same_results(tmp_path: Path) -> None:
    common = ["cv.n_splits=2", "baselines.reference.enabled=false", "save_pipeline=false"]
    local = train(compose("train", [*SMALL, *common, f"out_dir={tmp_path / 'local'}"]))
    on_dask = train(compose("train", [*SMALL, *common, "model.backend=dask", "model.dask.n_workers=2",
                                      "model.dask.memory_limit=1GiB", f"out_dir={tmp_path / 'dask'}"]))
    # the same deterministic fits, only elsewhere
    assert on_dask == local
    folds = json.loads((tmp_path / "dask" / "folds.json").read_text())["folds"]
    assert folds[0]["model"]["backend"] == "dask"


@pytest.mark.parametrize(("override", "key"), [
    ("model.backend=spark", "model.backend"),
    ("model.dask.n_workers=0", "model.dask.n_workers"),
    ("model.dask.address=localhost", "model.dask.address"),
])
def test_bad_backend_settings_are_refused(override: str, key: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        compose("train", [override])
    assert err.value.key == key


def test_early_stopping_is_refused_on_a_partitioned_dataset(dataset: Path) -> None:
    cfg = _cfg("model.early_stopping_rounds=5")
    with pytest.raises(ConfigValueError) as err:
        scale.fit_partitioned(cfg, load_op(cfg.op), dataset, backend="local")
    assert err.value.key == "model.early_stopping_rounds"


def test_dask_is_imported_only_when_used() -> None:
    code = ("import sys, ckpred.cli, ckpred.cv, ckpred.scale, ckpred.commands.train; "
            "print([m for m in ('dask', 'distributed') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_worker_gets_files_of_every_combo() -> None:
    combos = ["a"] * 4 + ["b"] * 4 + ["c"]
    where = scale.spread(combos, ["w0", "w1"])
    for w in ("w0", "w1"):
        assert {c for c, x in zip(combos, where) if x == w} >= {"a", "b"}
    assert where.count("w0") + where.count("w1") == len(combos)


# -- the learned failure model (validity.learned) on a partitioned dataset -------------------------
VALIDITY = ["validity.learned=true", "validity.n_estimators=20", "validity.num_leaves=7",
            "validity.min_child_samples=5"]


@pytest.fixture(scope="module")
def failing_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's dataset in four files, where every kernel of the ``compv4`` pipeline (a
    feature) that ran now fails: a failure the features separate."""
    cfg = compose("train", SMALL)
    op = load_op(cfg.op)

    def failing(frames):
        for frame in frames:
            fails = frame["is_valid"].to_numpy() & (frame["pipeline"] == "compv4").to_numpy()
            yield frame.assign(is_valid=frame["is_valid"] & ~fails, tflops=np.where(fails, 0.0, frame["tflops"]))

    out = tmp_path_factory.mktemp("failing")
    scale.write_partitions(failing(_frames(load_shapes(cfg.shapes), 6)), out, op)
    return out


def test_dask_failure_model_flags_the_failing_kernels_like_the_in_memory_fit(failing_dataset: Path, client,
                                                                            tmp_path: Path) -> None:
    from ckpred.models import failure_model, predicted_ok

    cfg = _cfg(*VALIDITY)
    op = load_op(cfg.op)
    test = (0.0, 0.3)
    # backend=local fits ckpred.models.fit_failure_model in this process on the same training rows
    local, info_l = scale.fit_partitioned(cfg, op, failing_dataset, backend="local", test=test)
    remote, info_d = scale.fit_partitioned(cfg, op, failing_dataset, backend="dask", client=client, test=test)
    assert info_l["failure_model"] and info_d["failure_model"]
    assert info_d["failed_rows"] == info_l["failed_rows"] > 0 and info_d["train_rows"] == info_l["train_rows"]
    model = failure_model(remote)
    assert type(model).__name__ == "LGBMRegressor" and remote.ckpred_failure_threshold_ == 0.5
    table = _all_rows(failing_dataset)
    X = op.encode_frame(table)
    compv4 = (table["pipeline"] == "compv4").to_numpy()
    ran = table["is_valid"].to_numpy()
    ok = predicted_ok(remote, X)
    # every compv4 kernel is masked (held-out queries too); nearly every kernel that ran is not
    assert not ok[compv4].any() and ok[ran].mean() > 0.95
    # the same rows flagged as by the in-memory fit (one feature separates the failures: both
    # estimates lie far from the threshold), and estimates close to its own but not equal:
    # data-parallel LightGBM finds each feature's bins on one worker's rows, and which worker
    # that is changes with the cluster, so on a few rows the estimates differ by up to ~0.1
    assert np.array_equal(ok, predicted_ok(local, X))
    Xt = remote.named_steps["features"].transform(X)
    assert np.abs(model.predict(Xt) - failure_model(local).predict(Xt)).max() < 0.2
    # the export reads it as it reads an in-memory fit's (parity includes the learned mask)
    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline

    part = pd.read_parquet(sorted(failing_dataset.glob("part-*.parquet"))[0])
    assert (part["arch"] == "gfx942").all()
    man = export_pipeline(remote, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=tmp_path / "x",
                          training=mf.training_section(part, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout),
                          options=ExportOptions(parity_problems=part[list(op.problem_names)].drop_duplicates()))
    assert man["failure_model"]["threshold"] == 0.5 and man["parity"]["top1_agreement"] == 1.0


def test_no_failure_model_on_a_partitioned_dataset_with_random_failures(dataset: Path, client) -> None:
    from ckpred.models import failure_model, predicted_ok

    cfg = _cfg("validity.learned=true")
    op = load_op(cfg.op)
    pipe, info = scale.fit_partitioned(cfg, op, dataset, backend="dask", client=client)
    # the simulator's few launch failures among rule-valid kernels are random: nothing to learn
    assert info["failed_rows"] > 0 and info["failure_model"] is False
    assert failure_model(pipe) is None and predicted_ok(pipe, op.encode_frame(_all_rows(dataset))).all()


def _prefers_failures(failures):
    """A fitted ranking model that puts the kernels ``failures`` expects to fail first."""
    from sklearn.base import BaseEstimator

    class PrefersFailures(BaseEstimator):
        def __init__(self, failures=None) -> None:
            self.failures = failures

        def fit(self, X, y=None):
            self.failures_ = self.failures
            return self

        def predict(self, X) -> np.ndarray:
            return self.failures_.predict(X)

    return PrefersFailures(failures).fit(None)


def test_held_out_queries_are_scored_with_the_learned_mask(failing_dataset: Path, client) -> None:
    from copy import deepcopy

    from ckpred.models import failure_model

    cfg = _cfg(*VALIDITY)
    op = load_op(cfg.op)
    test = (0.0, 0.5)
    pipe, _ = scale.fit_partitioned(cfg, op, failing_dataset, backend="dask", client=client, test=test)
    adversarial = deepcopy(pipe)
    adversarial.steps[-1] = ("model", _prefers_failures(failure_model(pipe)))
    masked = scale.summary(scale.score_partitioned(adversarial, cfg, op, failing_dataset, test=test))
    adversarial.ckpred_failure_model_ = None
    per_query = scale.score_partitioned(adversarial, cfg, op, failing_dataset, test=test)
    rules = scale.summary(per_query)
    # the rules alone pick a failing compv4 kernel on every held-out query; the learned mask
    # (ckpred.evaluate.learned_selection_mask) leaves only kernels predicted to run
    assert masked["queries"] == rules["queries"] > 0
    assert (per_query["failed_pick"] == 1).all() and rules["mean"] == 0.0 and masked["mean"] > 0.5


def test_train_command_masks_the_learned_failures_on_a_partitioned_dataset(failing_dataset: Path,
                                                                           tmp_path: Path) -> None:
    from ckpred.models import failure_model
    from ckpred.runs import load_pipeline

    train(_cfg(*VALIDITY, "model.backend=dask", "model.dask.memory_limit=1GiB", "data=path",
               f"data.path={failing_dataset}", "cv=holdout", "cv.test_fraction=0.5", f"out_dir={tmp_path}"))
    record = json.loads((tmp_path / "run.json").read_text())
    folds = json.loads((tmp_path / "folds.json").read_text())["folds"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert record["failure_model"] is True and folds[0]["failure_model"] and folds[0]["failed_rows"] > 0
    assert metrics["model"]["failed_pick"] == 0
    # the saved pipeline carries the failure model where the export reads it
    assert failure_model(load_pipeline(tmp_path / "pipeline.joblib")) is not None


@pytest.mark.parametrize("limit", ["lots", "4 GB!"])
def test_a_bad_worker_memory_limit_is_refused_by_name_before_a_cluster_starts(limit: str) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"address": None, "n_workers": 1, "memory_limit": limit})
    with pytest.raises(ConfigValueError, match="model.dask.memory_limit.*4GiB"):
        with scale.dask_client(cfg):
            pass
