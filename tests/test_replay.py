"""Replay of autotune budgets on measured tables, and the cross-GPU guided search."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred import autotune as at
from ckpred import guided_search as gs
from ckpred import replay as rp


def _oof(tmp_path: Path) -> Path:
    """Four problems of three kernels, two folds. Model order is a, b, c everywhere (scores 3, 2, 1).
    perf by problem: p0 a best; p1 b best (a at 50%); p2 c best (a 90%, b failed); p3 a fails, b best."""
    perf = {"p0": [10, 5, 1], "p1": [5, 10, 1], "p2": [9, 0, 10], "p3": [0, 8, 4]}
    rows = []
    for i, (shape, ps) in enumerate(perf.items()):
        for name, p, score in zip("abc", ps, (3.0, 2.0, 1.0)):
            rows.append({"shape": shape, "fold": i % 2, "kernel_name": name, "perf": float(p),
                         "selectable": True, "score_model": score + 0.1 * i})
    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame(rows).to_parquet(run / "oof_predictions.parquet")
    return run


def test_fixed_budgets_and_hindsight_by_hand(tmp_path) -> None:
    data = rp.load_run(_oof(tmp_path))
    one = rp.replay(data, at.FixedK(1))
    # p3: a fails, so fixed(1) goes on to b (failures do not count as successes)
    assert one["efficiency"].tolist() == [1.0, 0.5, 0.9, 1.0] and one["benchmarks"].tolist() == [1, 1, 1, 2]
    two = rp.replay(data, at.FixedK(2))
    assert two["efficiency"].tolist() == [1.0, 1.0, 1.0, 1.0] and two["benchmarks"].tolist() == [2, 2, 3, 3]
    hind = rp.replay(data, rp.Hindsight(0.05))
    assert hind["benchmarks"].tolist() == [1, 2, 3, 2]
    s = rp.summarize(one)
    assert s["benchmarks"] == 1.25 and s["mean"] == pytest.approx(0.85) and s["min"] == 0.5


def test_random_order_is_seeded_and_every_order_is_a_permutation(tmp_path) -> None:
    data = rp.load_run(_oof(tmp_path))
    a = rp.replay(data, at.FixedK(3), order="random", seed=1)
    b = rp.replay(data, at.FixedK(3), order="random", seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert (a["efficiency"] == 1.0).all()  # three valid kernels measured: the best is always found
    with pytest.raises(at.AutotuneError, match="order='best'"):
        rp.replay(data, at.FixedK(1), order="best")


def test_cross_fitted_calibration_leaves_each_fold_out(tmp_path) -> None:
    data = rp.load_run(_oof(tmp_path))
    cals = rp.calibrations(data, within=(0.05,), bins=1, max_k=3, prior_failures=0)
    assert sorted(cals) == [0, 1]
    # fold 0 holds p0, p2: its calibration is fitted on p1 and p3 only, and the reverse
    assert sum(cals[0].counts) == 2 and sum(cals[1].counts) == 2
    assert cals[0].probability[0][0][0] == 0.0  # p1 (50%) and p3 (failed) both miss at top-1
    assert cals[1].probability[0][0][0] == 0.5  # p0 hits, p2 (90%) misses


def _many(seed: int = 0, n: int = 80) -> rp.ReplayData:
    """n problems of six kernels in two folds; the top-1 misses on about half of the problems,
    more often on the larger ones (a learnable signal)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        size = int(rng.integers(1, 64))
        perf = rng.uniform(0.5, 0.9, 6)
        perf[0 if rng.uniform() > size / 64 else 3] = 1.0
        for j in range(6):
            rows.append({"shape": f"{size}x{i}", "kernel_name": f"k{j}", "perf": perf[j], "selectable": True,
                         "score": 6.0 - j, "seconds": 1 / perf[j], "tie": j, "fold": i % 2})
    return rp.ReplayData(pd.DataFrame(rows))


def test_learned_signal_is_nested_a_fold_never_sees_its_own_measurements() -> None:
    data = _many()
    base = rp.learned_probabilities(data, within=(0.02,), max_k=4)[0.02]
    # rewrite fold 0's measurements (every top-1 now hits): fold 0's own probabilities must not
    # move (its model is fitted on fold 1 only), fold 1's must (fold 0 is its training data)
    frame = data.frame.copy()
    zero = frame["fold"] == 0
    frame.loc[zero, "perf"] = np.where(frame.loc[zero, "kernel_name"] == "k0", 1.0, 0.5)
    moved = rp.learned_probabilities(rp.ReplayData(frame), within=(0.02,), max_k=4)[0.02]
    fold0 = [s for s, f in data.frame.groupby("shape", sort=False)["fold"].first().items() if f == 0]
    fold1 = [s for s in base.index if s not in set(fold0)]
    pd.testing.assert_frame_equal(base.loc[fold0], moved.loc[fold0])
    assert not np.allclose(base.loc[fold1].to_numpy(), moved.loc[fold1].to_numpy())
    # monotone in j, and the plan is the first j that reaches the target
    assert (np.diff(base.to_numpy(), axis=1) >= 0).all()
    plans = rp.learned_plans(data, None, [(0.6, 0.02)], max_k=4)[(0.6, 0.02)]
    want = {s: int(np.argmax(row >= 0.6)) + 1 if (row >= 0.6).any() else 4 for s, row in zip(base.index, base.to_numpy())}
    assert plans == want
    # a separate calibration run: the replayed run's own measurements play no part at all
    cal = _many(seed=1)
    a = rp.learned_probabilities(data, cal, within=(0.02,), max_k=4)[0.02]
    b = rp.learned_probabilities(rp.ReplayData(frame), cal, within=(0.02,), max_k=4)[0.02]
    pd.testing.assert_frame_equal(a, b)


def test_learned_budget_replays_its_plan_and_the_signal_is_scored() -> None:
    data = _many()
    table = rp.replay_table(data, [rp.Learned(0.6, 0.02), at.FixedK(1)], random_seeds=0, within=(0.02,), max_k=4)
    plans = rp.learned_plans(data, None, [(0.6, 0.02)], max_k=4)[(0.6, 0.02)]
    assert table.loc[0, "benchmarks"] == pytest.approx(np.mean(list(plans.values())))
    auc = rp.signal_auc(data, within=0.02, max_k=4, bins=2)
    assert 0.3 < auc["top1_within"] < 0.7 and set(auc) == {"top1_within", "table", "learned", "lightgbm", "gap2", "gap3"}
    assert auc["learned"] > 0.6  # the size drives the misses here, and the model sees it
    assert "logistic model" in rp.auc_line(auc, 0.02)


@pytest.mark.slow
def test_replay_command_writes_table_and_curve(tmp_path) -> None:
    run = _oof(tmp_path)
    out = subprocess.run([sys.executable, "-m", "ckpred", "replay", str(run), "seeds=2", "ks=[1,2]",
                          "targets=[0.5]", f"out={tmp_path / 'r'}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "r" / "replay.md").read_text()
    assert "| fixed(k=1) | model | 1.25 | 85.00 |" in text and "| fixed(k=2) | random |" in text
    assert (tmp_path / "r" / "replay.png").stat().st_size > 1000
    bad = subprocess.run([sys.executable, "-m", "ckpred", "replay", str(run), "within=2"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0 and "within" in bad.stderr and "a fraction in (0, 1)" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "ckpred", "replay", str(tmp_path)], capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode != 0 and "no out-of-fold predictions" in missing.stderr


def test_guided_search_re_ranks_towards_what_the_new_gpu_shows() -> None:
    # x = 0..19. The prior interleaves two regions (0, 10, 1, 11, ...); on the new GPU the upper
    # region is fast (best at 19) and the lower one slow, which the first two measurements show.
    params = np.arange(20, dtype=float)[:, None]
    prior = (params[:, 0] % 10) + 0.5 * (params[:, 0] >= 10)
    time = np.where(params[:, 0] >= 10, 1.0 + 0.01 * (19 - params[:, 0]), 10.0)
    static = gs.guided_search(params, prior, lambda i: time[i], 20, adapt=False)
    guided = gs.guided_search(params, prior, lambda i: time[i], 20, bandwidth=0.5)
    assert static[:4] == [0, 10, 1, 11] and gs.evaluations_to_reach(static, time, 0.0) == 20
    assert sorted(guided) == list(range(20))
    assert gs.evaluations_to_reach(guided, time, 0.0) == 15  # mostly the upper region after the first look
    assert gs.random_evaluations(time, 0.0) == 21 / 2


def test_guided_search_exploring_step_measures_the_farthest_of_the_pool() -> None:
    # x = 0..19, prior ranks by x; every 2nd measurement is the one farthest from what was
    # measured among the 3 best-ranked left: 0, then 3 (of 1, 2, 3), then the best-ranked 1,
    # then 5 (of 2, 4, 5: distances 1, 1, 2 from {0, 3, 1})
    params = np.arange(20, dtype=float)[:, None]
    prior = params[:, 0].copy()
    order = gs.guided_search(params, prior, lambda i: 1.0, 6, adapt=False, explore_every=2, explore_pool=3)
    assert order[:4] == [0, 3, 1, 5]
    assert gs.guided_search(params, prior, lambda i: 1.0, 4, adapt=False) == [0, 1, 2, 3]


def test_read_cache_parses_failures_and_varying_parameters(tmp_path) -> None:
    doc = {"tune_params_keys": ["bx", "by", "f"], "cache": {
        "1,1,3": {"bx": 1, "by": 1, "f": 3, "time": 2.0}, "2,1,3": {"bx": 2, "by": 1, "f": 3, "time": 1.0},
        "4,1,3": {"bx": 4, "by": 1, "f": 3, "time": "CompilationFailedConfig"}}}
    path = tmp_path / "c.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    frame, varying = gs.read_cache(path)
    assert varying == ["bx"] and frame["time"].isna().tolist() == [False, False, True]
    (tmp_path / "bad.json").write_text("{}")
    from ckpred.errors import InputFileError

    with pytest.raises(InputFileError, match="not a Kernel Tuner cache"):
        gs.read_cache(tmp_path / "bad.json")


def test_kernel_tuner_search_takes_any_cache_files_and_the_op(tmp_path, capsys) -> None:
    """scripts/bench/kernel_tuner_search.py read only files named convolution_milo_<GPU>: it takes
    the caches given (labelled by their device) and the op whose kernel fields are searched."""
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("kts", REPO / "scripts" / "bench" / "kernel_tuner_search.py")
    kts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kts)
    doc = json.loads((REPO / "tests" / "fixtures" / "kernel_tuner_small.json").read_text())
    (tmp_path / "first.json").write_text(json.dumps(doc))
    doc["device_name"] = "AMD Instinct MI250X"
    for entry in doc["cache"].values():
        if isinstance(entry.get("time"), float):
            entry["time"] *= 1 + 0.1 * entry["block_size_x"] / 48
    with gzip.open(tmp_path / "second.json.gz", "wt") as fh:
        json.dump(doc, fh)
    files = [str(tmp_path / "first.json"), str(tmp_path / "second.json.gz")]
    assert kts.main([*files, "--budget", "5"]) == 0
    out = capsys.readouterr().out
    assert "| W7800 | guided" in out and "| MI250X | random (expectation) |" in out
    with pytest.raises(SystemExit):  # another op's kernel fields are not the caches' parameters
        kts.main([*files, "--config-dir", str(REPO / "tests" / "fixtures" / "user_op"), "--op", "tmm"])
    assert "none of op tmm's kernel fields" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kts.main(files[:1])
    assert "two or more Kernel Tuner caches" in capsys.readouterr().err
