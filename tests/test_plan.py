"""``ckpred plan``: measurement plans for a new GPU, the plan file and its round trip through ingest."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred import plan as pl
from ckpred.config import compose
from ckpred.cv.driver import cross_validate
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.schema import PlanBudgetConfig
from tests.conftest import REPO
from tests.test_yaml_ops_train import write_find_db

OPS_DIR = REPO / "tests" / "ops"
SEARCH = f"hydra.searchpath=[file://{OPS_DIR}]"
SMALL = ["model.n_estimators=20", "model.n_jobs=1", "baselines.plain.model.n_estimators=5", "plots=false",
         "progress=false", "cv.n_splits=3"]
#: Kernel Tuner device names (the reader maps them to arch configs) -> the best block_size_x there.
KT_GPUS = {"AMD Instinct MI250X": 16, "AMD Radeon PRO W6600": 32, "AMD Radeon PRO W7800": 128,
           "NVIDIA A100-PCIE-40GB": 128}
KT_PARAMS = ("block_size_x", "block_size_y", "tile_size_x", "tile_size_y", "read_only", "use_padding", "use_shmem",
             "use_cmem", "filter_height", "filter_width")


def kt_time(device: str, bx: int, by: int, tx: int, ty: int, shmem: int) -> float:
    """A made-up time (ms): each GPU prefers its own block width; the two AMD GPUs of one kind
    avoid shared memory and square tiles, the W7800 and the A100 prefer them."""
    best = KT_GPUS[device]
    kind = 0 if device.split()[-1] in ("MI250X", "W6600") else 1
    switches = 0.5 * (shmem != kind) + 0.3 * ((tx == ty) != kind)
    return 1.0 + abs(np.log2(bx / best)) + 0.3 * abs(by - 2) + switches


def write_kt_cache(path: Path, device: str) -> Path:
    template = json.loads((REPO / "tests" / "fixtures" / "kernel_tuner_small.json").read_text())
    values = {"block_size_x": [16, 32, 64, 128, 256], "block_size_y": [1, 2, 4], "tile_size_x": [1, 2],
              "tile_size_y": [1, 2], "read_only": [0], "use_padding": [0], "use_shmem": [0, 1], "use_cmem": [1],
              "filter_height": [15], "filter_width": [15]}
    cache = {}
    for bx in values["block_size_x"]:
        for by in values["block_size_y"]:
            for tx in values["tile_size_x"]:
                for ty in values["tile_size_y"]:
                    for shmem in values["use_shmem"]:
                        params = dict(zip(KT_PARAMS, (bx, by, tx, ty, 0, 0, shmem, 1, 15, 15)))
                        t = kt_time(device, bx, by, tx, ty, shmem)
                        key = ",".join(str(params[k]) for k in KT_PARAMS)
                        cache[key] = {**params, "time": t, "times": [t, t]}
    doc = {**template, "device_name": device, "tune_params": values, "cache": cache}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def kt_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A train run on three AMD GPUs' caches (the regressor itself: ``transfer.mode=off``), and
    the A100's cache (the new GPU's truth)."""
    tmp = tmp_path_factory.mktemp("kt")
    files = [write_kt_cache(tmp / f"{d.split()[-1]}.json", d) for d in list(KT_GPUS)[:3]]
    (tmp / "new").mkdir()
    new = write_kt_cache(tmp / "new" / "A100.json", "NVIDIA A100-PCIE-40GB")
    cfg = compose("train", [SEARCH, "experiment=kernel_tuner_amd", f"data.path=[{','.join(map(str, files))}]",
                            "model=lgbm_regressor", "target=log1p", "rows.max_per_shape=0", "transfer.mode=off",
                            f"out_dir={tmp / 'run'}",
                            *SMALL])
    (tmp / "run").mkdir()
    cross_validate(cfg, tmp / "run")
    return {"run": tmp / "run", "new": new, "tmp": tmp}


def _plan(run: Path, out: Path, *overrides: str) -> Path:
    from ckpred.commands.plan import plan_command

    cfg = compose("plan", [SEARCH, f"run_dir={run}", f"out={out}", *overrides])
    return Path(plan_command(cfg))


def _truth(path: Path, arch: str) -> pd.DataFrame:
    from ckpred.data.ingest import read_files
    from ckpred.kernels.base import load_op

    op = load_op(compose("ingest", [SEARCH, "op=kernel_tuner_conv", "data.path=x"]).op)
    return read_files([str(path)], op, arch=arch, dtype="fp32", layout="rcr").table


def _fill(plan_csv: Path, truth: pd.DataFrame, out: Path) -> Path:
    """What the harness does: the measured time and status of every planned row."""
    plan = pd.read_csv(plan_csv)
    times = truth.set_index("kernel_name")["latency_ms"]
    plan["time"] = plan["kernel_name"].map(times)
    plan["status"] = "ok"
    plan.to_csv(out, index=False)
    return out


@pytest.mark.slow
def test_a_kernel_tuner_plan_is_the_models_top_kernels_kept_apart(kt_run: dict[str, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    out = _plan(kt_run["run"], tmp_path / "plan.csv", "arch=sm80_a100", f"problems={problems}", "budget.total=4")
    frame = pd.read_csv(out)
    # the documented columns, in order: problem fields, kernel fields, the plan's, then the harness's
    assert list(frame.columns) == ["gpu", *KT_PARAMS, "kernel_name", "arch", "plan_rank", "plan_score", "time", "status"]
    assert len(frame) == 4 and frame["kernel_name"].is_unique and (frame["plan_rank"] == [1, 2, 3, 4]).all()
    assert (frame["gpu"] == "A100").all() and (frame["arch"] == "sm80_a100").all()
    assert frame["time"].isna().all() and frame["status"].isna().all()
    # the first is the model's best-scored candidate; every later one is >= 1 standardised unit
    # from the ones before it (72 candidates leave room)
    source = pl.load_source(kt_run["run"])
    from ckpred.schema import arch_config

    arch = arch_config("sm80_a100")
    pairs = pl.candidates(source, arch, pd.DataFrame({"gpu": ["A100"]}))
    scores = pl.model_scores(source, pairs, arch)
    assert frame["kernel_name"].iloc[0] == pairs["kernel_name"].iloc[int(np.argmax(scores))]
    z = pl.kernel_coordinates(source.op, pairs)
    pos = [int(np.flatnonzero(pairs["kernel_name"] == k)[0]) for k in frame["kernel_name"]]
    for i in range(1, 4):
        assert np.sqrt(((z[pos[:i]] - z[pos[i]]) ** 2).sum(1)).min() >= 1.0
    printed = capsys.readouterr().out
    assert "python -m ckpred ingest" in printed and "op.input.format=csv" in printed and "arch=sm80_a100" in printed
    # each step is named with its time as it finishes
    for step in ("loading the run and its training table", "scoring 120 candidate pairs on sm80_a100", "choosing"):
        assert re.search(rf"^plan: {re.escape(step)} \(\d+\.\d s\)$", printed, re.M), (step, printed)


@pytest.mark.slow
def test_a_plan_for_a_gpu_with_a_kernel_list_plans_listed_kernels_only(kt_run: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """The new GPU's arch config lists the kernels its build has (``arch.kernel_lists``): the plan
    measures only those, the ones the model scores best among them."""
    source = pl.load_source(kt_run["run"])
    from ckpred.schema import arch_config

    every = pl.candidates(source, arch_config("sm80_a100"), pd.DataFrame({"gpu": ["A100"]}))
    scores = pl.model_scores(source, every, arch_config("sm80_a100"))
    best = set(every["kernel_name"].iloc[np.argsort(-scores)[:10]])
    kept = sorted(set(every["kernel_name"]) - best)[:20]
    (tmp_path / "a100_kernels.txt").write_text("# the A100 build\n" + "\n".join(kept) + "\n")
    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    out = _plan(kt_run["run"], tmp_path / "plan.csv", "arch=sm80_a100", f"problems={problems}", "budget.total=4",
                f"+arch.kernel_lists.kernel_tuner_conv={tmp_path / 'a100_kernels.txt'}")
    frame = pd.read_csv(out)
    assert len(frame) == 4 and set(frame["kernel_name"]) <= set(kept)
    listed = every[every["kernel_name"].isin(kept)]
    top = listed["kernel_name"].iloc[int(np.argmax(scores[every["kernel_name"].isin(kept).to_numpy()]))]
    assert frame["kernel_name"].iloc[0] == top


@pytest.mark.slow
def test_the_filled_plan_round_trips_through_ingest_and_steers_the_next_round(kt_run: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    from ckpred.commands.ingest import ingest_command

    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    first = _plan(kt_run["run"], tmp_path / "round1.csv", "arch=sm80_a100", f"problems={problems}", "budget.total=5")
    truth = _truth(kt_run["new"], "sm80_a100")
    filled = _fill(first, truth, tmp_path / "round1_filled.csv")
    # ingest reads the filled plan back: one row per planned pair, the harness's times, the new arch
    cfg = compose("ingest", [SEARCH, "op=kernel_tuner_conv", "arch=sm80_a100", "dtype=fp32", "op.input.format=csv",
                             f"data.path={filled}", f"out={tmp_path / 'measured.parquet'}"])
    assert ingest_command(cfg) == 5
    table = pd.read_parquet(tmp_path / "measured.parquet")
    planned = pd.read_csv(filled)
    merged = table.merge(planned, on="kernel_name")
    assert len(merged) == 5 and (table["arch"] == "sm80_a100").all() and table["is_valid"].all()
    assert np.allclose(merged["latency_ms"], merged["time"])
    # round 2: nothing planned twice; with three source GPUs the similarity order ranks the kernels,
    # weighting the source whose order agrees with the A100's measurements (W7800) the most
    second = _plan(kt_run["run"], tmp_path / "round2.csv", "arch=sm80_a100", f"problems={problems}",
                   "budget.total=3", f"measured=[{filled},{tmp_path / 'measured.parquet'}]")
    again = pd.read_csv(second)
    assert len(again) == 3 and not set(again["kernel_name"]) & set(planned["kernel_name"])
    source = pl.load_source(kt_run["run"])
    measured = pl.read_measured([str(filled)], source, _arch("sm80_a100"))
    weights = pl.similarity_weights(pl.source_orders(source), measured, source)
    assert max(weights, key=weights.get) == "gfx1100"  # the W7800
    plan = pl.make_plan(source, pl.candidates(source, _arch("sm80_a100"), pd.DataFrame({"gpu": ["A100"]})),
                        _arch("sm80_a100"), PlanBudgetConfig(total=3), measured=measured)
    assert plan.kernel_order == "similarity" and list(plan.rows["kernel_name"]) == list(again["kernel_name"])


def _arch(name: str):  # noqa: ANN202
    from ckpred.schema import arch_config

    return arch_config(name)


@pytest.fixture(scope="module")
def miopen_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A gfx942 run on a made-up find-db, and a gfx90a find-db with its problem list."""
    tmp = tmp_path_factory.mktemp("miopen")
    src = write_find_db(tmp / "gfx942.fdb.txt", n_convs=12, seed=0)
    new = write_find_db(tmp / "gfx90a.fdb.txt", n_convs=20, seed=1)
    cfg = compose("train", [SEARCH, "experiment=miopen_gfx942", f"data.path={src}", f"out_dir={tmp / 'run'}", *SMALL])
    (tmp / "run").mkdir()
    cross_validate(cfg, tmp / "run")
    truth = compose("ingest", [SEARCH, "experiment=miopen_gfx942", "arch=gfx90a_mi210", f"data.path={new}"])
    from ckpred.data import load_table
    from ckpred.kernels.base import load_op

    table = load_table(truth)
    problems = tmp / "problems.csv"  # the new GPU's problems and the solvers each lists, unmeasured
    table[[*load_op(truth.op).problem_names, "solver"]].to_csv(problems, index=False)
    table.to_parquet(tmp / "truth.parquet")
    return {"run": tmp / "run", "problems": problems, "truth": tmp / "truth.parquet", "tmp": tmp}


@pytest.mark.slow
def test_a_miopen_plan_measures_whole_problems_stratified(miopen_run: dict[str, Path], tmp_path: Path) -> None:
    out = _plan(miopen_run["run"], tmp_path / "plan.csv", "arch=gfx90a_mi210", f"problems={miopen_run['problems']}",
                "budget.problems=0.25", "seed=3")
    frame = pd.read_csv(out)
    truth = pd.read_parquet(miopen_run["truth"])
    key = ["n", "c", "hi", "wi", "k", "ho", "wo", "y", "x", "dtype", "direction"]
    planned = frame.groupby(key).size()
    # 120 problems (20 convolutions x 2 dtypes x 3 directions), a quarter of them, each with every
    # solver it lists; each (dtype, direction) stratum of 20 problems gives 5
    assert len(planned) == 30 and (planned == truth.groupby(key).size().loc[planned.index]).all()
    assert (frame.drop_duplicates(key).groupby(["dtype", "direction"]).size() == 5).all()
    assert list(frame.columns[-1:]) == ["time_ms"]


@pytest.mark.slow
def test_a_run_retrained_on_the_new_gpu_plans_its_most_uncertain_problems_next(miopen_run: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    first = _plan(miopen_run["run"], tmp_path / "r1.csv", "arch=gfx90a_mi210", f"problems={miopen_run['problems']}",
                  "budget.problems=0.5")
    truth = pd.read_parquet(miopen_run["truth"])
    plan = pd.read_csv(first)
    key = [c for c in plan.columns if c not in ("kernel_name", "arch", "plan_rank", "plan_score", "time_ms")]
    plan = plan.drop(columns="time_ms").merge(truth[[*key, "latency_ms"]], on=key).rename(
        columns={"latency_ms": "time_ms"})
    plan.to_csv(tmp_path / "r1_filled.csv", index=False)
    cfg = compose("train", [SEARCH, "experiment=miopen_gfx942", "arch=gfx90a_mi210", "op.input.format=csv",
                            f"data.path={tmp_path / 'r1_filled.csv'}", f"out_dir={tmp_path / 'retrained'}", *SMALL])
    (tmp_path / "retrained").mkdir()
    cross_validate(cfg, tmp_path / "retrained")
    source = pl.load_source(tmp_path / "retrained")
    arch = _arch("gfx90a_mi210")
    pairs = pl.candidates(source, arch, pl.read_problems(miopen_run["problems"], source.op))
    plan2 = pl.make_plan(source, pairs, arch, PlanBudgetConfig(problems=0.25))
    assert plan2.problem_order == "uncertainty"
    shapes1 = set(source.op.shape_keys(plan))
    shapes2 = pd.unique(source.op.shape_keys(plan2.rows))
    assert len(shapes2) == 30 and not shapes1 & set(shapes2)
    # within each stratum, the problems come smallest score gap first
    scores = pl.model_scores(source, pairs, arch)
    groups = pl.ev.ShapeGroups.from_keys(source.op.shape_keys(pairs).to_numpy())
    gap = pd.Series(pl.score_gaps(groups, scores), index=groups.keys)
    strata = pd.Series(pl.problem_strata(source.op, pairs, groups), index=groups.keys)
    for _, members in pd.Series(shapes2).groupby(strata[shapes2].to_numpy()):
        planned_gaps = gap[members.to_numpy()].to_numpy()
        assert (np.diff(planned_gaps) >= 0).all()
        rest = gap[strata[strata == strata[members.iloc[0]]].index.difference(list(shapes1) + list(members))]
        assert not len(rest) or planned_gaps.max() <= rest.min()


def test_stratified_order_samples_every_prefix_in_proportion() -> None:
    rng = np.random.default_rng(0)
    strata = np.array(["a"] * 60 + ["b"] * 30 + ["c"] * 10)
    order = pl.stratified_order(strata, np.zeros(100), rng)
    assert sorted(order) == list(range(100))
    for n in (10, 20, 50):
        counts = pd.Series(strata[order[:n]]).value_counts()
        for s, size in (("a", 60), ("b", 30), ("c", 10)):
            assert abs(counts.get(s, 0) - n * size / 100) <= 1
    # with a `within` order, each stratum is taken in it
    within = rng.random(100)
    order = pl.stratified_order(strata, within, rng)
    for s in "abc":
        taken = [i for i in order if strata[i] == s]
        assert (np.diff(within[taken]) > 0).all()


def test_score_gaps_are_the_best_minus_the_second_per_problem() -> None:
    groups = pl.ev.ShapeGroups.from_keys(np.array(["p", "p", "p", "q", "r", "r"]))
    gaps = pl.score_gaps(groups, np.array([0.5, 2.0, 1.5, 9.0, -1.0, -4.0]))
    assert gaps[0] == pytest.approx(0.5) and gaps[1] == np.inf and gaps[2] == pytest.approx(3.0)


def test_the_budget_and_orders_are_checked_naming_the_key(kt_run: dict[str, Path], tmp_path: Path) -> None:
    base = [SEARCH, f"run_dir={kt_run['run']}", "arch=sm80_a100"]
    with pytest.raises(ConfigValueError, match="'budget'.*at least one of budget.total"):
        compose("plan", base)
    with pytest.raises(ConfigValueError, match="budget.problems.*1.5.*a fraction of the problems in \\(0, 1\\)"):
        compose("plan", [*base, "budget.problems=1.5"])
    with pytest.raises(ConfigValueError, match="budget.total.*-1.*an integer >= 0"):
        compose("plan", [*base, "budget.total=-1"])
    with pytest.raises(ConfigValueError, match="problem_order.*'random'.*one of"):
        compose("plan", [*base, "budget.total=3", "problem_order=random"])


@pytest.mark.slow
def test_a_plan_never_overwrites_measurements(kt_run: dict[str, Path], tmp_path: Path) -> None:
    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    args = ["arch=sm80_a100", f"problems={problems}", "budget.total=2"]
    out = _plan(kt_run["run"], tmp_path / "plan.csv", *args)
    _plan(kt_run["run"], out, *args)  # an unfilled plan is replaced
    filled = _fill(out, _truth(kt_run["new"], "sm80_a100"), out)
    before = filled.read_bytes()
    with pytest.raises(ConfigValueError, match="'out'.*not an unfilled measurement plan"):
        _plan(kt_run["run"], filled, *args)
    assert filled.read_bytes() == before
    other = tmp_path / "notes.csv"
    other.write_text("my,own\n1,2\n")
    with pytest.raises(ConfigValueError, match="'out'"):
        _plan(kt_run["run"], other, *args)
    assert other.read_text() == "my,own\n1,2\n"


def test_bad_problem_files_are_refused_naming_line_and_value(kt_run: dict[str, Path], tmp_path: Path) -> None:
    source = pl.load_source(kt_run["run"])
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu\nA100\nB200\n")
    with pytest.raises(InputFileError, match=r"bad.csv:3.*'gpu' has 'B200'.*one of \['MI250X'"):
        pl.read_problems(bad, source.op)
    bad.write_text("device\nA100\n")
    with pytest.raises(InputFileError, match=r"missing column\(s\) \['gpu'\]"):
        pl.read_problems(bad, source.op)
    wrong = tmp_path / "kernels.csv"
    wrong.write_text("gpu,kernel_name\nA100,no_such_kernel\n")
    with pytest.raises(InputFileError, match="'no_such_kernel' is not a kernel of the run's table"):
        pl.candidates(source, _arch("sm80_a100"), pl.read_problems(wrong, source.op))


def test_measurements_of_another_gpu_are_refused(kt_run: dict[str, Path], tmp_path: Path) -> None:
    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    out = _plan(kt_run["run"], tmp_path / "plan.csv", "arch=sm80_a100", f"problems={problems}", "budget.total=2")
    filled = _fill(out, _truth(kt_run["new"], "sm80_a100"), tmp_path / "filled.csv")
    source = pl.load_source(kt_run["run"])
    with pytest.raises(InputFileError, match="no measurement of arch sm86_a6000"):
        pl.read_measured([str(filled)], source, _arch("sm86_a6000"))


def test_a_problem_with_one_candidate_is_never_planned(miopen_run: dict[str, Path], tmp_path: Path) -> None:
    problems = pd.read_csv(miopen_run["problems"])
    forward = problems["direction"] == "F"
    one = problems[~forward | ~problems.duplicated(["n", "c", "hi", "wi", "k", "dtype", "direction"])]
    one.to_csv(tmp_path / "problems.csv", index=False)
    out = _plan(miopen_run["run"], tmp_path / "plan.csv", "arch=gfx90a_mi210", f"problems={tmp_path / 'problems.csv'}",
                "budget.problems=100")  # more than the 80 with a choice
    frame = pd.read_csv(out)
    assert set(frame["direction"]) == {"B", "W"} and len(frame.drop_duplicates(["n", "c", "hi", "wi", "k", "dtype",
                                                                                "direction"])) == 80


def test_the_plan_prints_the_retraining_step_as_a_train_command_that_composes(
        miopen_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After the ingest step the plan prints the guide's retraining: ``train`` on the new GPU's
    tables alone (this round's and the earlier rounds'), with the run's own overrides, the new
    arch, the op's transfer feature set and, for a ranker, the linear label gain."""
    from ckpred.commands.plan import retrain_arguments

    _plan(miopen_run["run"], tmp_path / "r1.csv", "arch=gfx90a_mi210", f"problems={miopen_run['problems']}",
          "budget.problems=0.25")
    printed = capsys.readouterr().out
    assert "then retrain on the new GPU's measurements" in printed and "model.label_gain=linear" in printed
    assert f"data.path=[{tmp_path / 'r1.parquet'}]" in printed
    # the run as `python -m ckpred train` records it: its command line, with keys the retraining replaces
    source = pl.load_source(miopen_run["run"])
    argv = ["ckpred train", "--config-dir", str(OPS_DIR), "experiment=miopen_gfx942", "data.path=src.fdb.txt",
            "out_dir=runs/x", "hydra.run.dir=runs/x/hydra", "model.n_estimators=20", "features=miopen_conv"]
    source = replace(source, record={**source.record, "argv": argv})
    plan_cfg = compose("plan", [SEARCH, f"run_dir={miopen_run['run']}", "arch=gfx90a_mi210", "out=r2.csv",
                                "budget.problems=0.01"])
    tables = [tmp_path / "r1.parquet", tmp_path / "r2.parquet"]
    args = shlex.split(" ".join(retrain_arguments(source, plan_cfg, str(OPS_DIR), tables)))
    assert args[:2] == ["--config-dir", str(OPS_DIR)] and "hydra.run.dir=runs/x/hydra" not in args
    cfg = compose("train", [SEARCH, *args[2:]])
    assert (cfg.arch.name, cfg.features.name, cfg.model.label_gain, cfg.model.n_estimators) == (
        "gfx90a_mi210", "miopen_conv_transfer", "linear", 20)
    assert [Path(p) for p in cfg.data.path] == tables and cfg.out_dir == "runs/gfx90a_mi210_r2"
    # a run trained from a script has no command line to repeat: the command says so
    bare = replace(source, record={**source.record, "argv": ["pytest"]})
    assert "<the run's overrides>" in " ".join(retrain_arguments(bare, plan_cfg, "", tables))


@pytest.fixture(scope="module")
def kt_transfer_run(kt_run: dict[str, Path]) -> Path:
    """A zero-shot run of the three AMD GPUs' caches with the transfer recipe (the experiment's
    ``cv=leave_one_gpu_out``, ``transfer.mode=auto``), its static-order weight fixed at 0.5 so
    that the blend matters."""
    tmp = kt_run["tmp"]
    files = sorted(str(f) for f in tmp.glob("*.json"))
    cfg = compose("train", [SEARCH, "experiment=kernel_tuner_gpus", f"data.path=[{','.join(files)}]",
                            "transfer.weights=[0.5]", f"out_dir={tmp / 'transfer_run'}",
                            *[o for o in SMALL if not o.startswith("cv.")]])
    (tmp / "transfer_run").mkdir()
    cross_validate(cfg, tmp / "transfer_run")
    return tmp / "transfer_run"


@pytest.mark.slow
def test_a_transfer_recipe_run_plans_in_the_order_its_selector_ranks(kt_run: dict[str, Path], kt_transfer_run: Path,
                                                                     tmp_path: Path) -> None:
    from ckpred.fitting import prepare
    from ckpred.transfer import TransferModel

    assert json.loads((kt_transfer_run / "run.json").read_text())["model"] == "transfer"
    source = pl.load_source(kt_transfer_run)
    assert isinstance(source.pipeline, TransferModel) and source.pipeline.weight == 0.5
    arch = _arch("sm80_a100")
    pairs = pl.candidates(source, arch, pd.DataFrame({"gpu": ["A100"]}))
    scores = pd.Series(pl.model_scores(source, pairs, arch), index=pairs["kernel_name"].to_numpy())
    # the recipe's scores of the A100's candidates as cross-validation (and the exported selector,
    # parity-checked against it) computes them: rank percentiles of the learner's and the static
    # order's scores over the problem's candidates, blended half and half
    truth = _truth(kt_run["new"], "sm80_a100")
    data = prepare(truth, source.op, source.cfg, arch=arch)
    rows = np.arange(len(truth))
    expected = source.pipeline.score(data, rows, source.op, source.cfg, np.ones(len(rows), dtype=bool), arch)
    expected = pd.Series(expected, index=data.table["kernel_name"].to_numpy())
    assert len(scores) == len(expected) == 120
    np.testing.assert_allclose(scores.loc[expected.index].to_numpy(), expected.to_numpy(), rtol=0, atol=1e-12)
    learner_alone = pl.predict(source.pipeline.learner_pipeline(source.op, source.cfg, arch, pairs),
                               source.op.encode_frame(pairs))
    assert not np.array_equal(np.argsort(-scores.to_numpy(), kind="stable"),
                              np.argsort(-learner_alone, kind="stable"))  # the blend changed the order
    # the command plans from the run: the recipe's best-scored candidate first
    problems = tmp_path / "a100.csv"
    problems.write_text("gpu\nA100\n")
    out = _plan(kt_transfer_run, tmp_path / "plan.csv", "arch=sm80_a100", f"problems={problems}", "budget.total=3")
    frame = pd.read_csv(out)
    assert len(frame) == 3 and frame["kernel_name"].iloc[0] == scores.idxmax()
    assert frame["plan_score"].iloc[0] == pytest.approx(scores.max(), abs=1e-5)
