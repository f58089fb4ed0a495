"""Autotune: measured search in model order, budgets, calibration, the shared result store."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from ckpred import autotune as at
from ckpred.errors import ModelMismatchError
from ckpred.runtime import KernelSelector
from export_helpers import export_gemm, forge

# trains and exports the runs its Python and C++ autotune tests share: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return export_gemm(tmp_path_factory.mktemp("autotune") / "gemm_universal_gfx950_fp8_rcr", n_estimators=20)


@pytest.fixture(scope="module")
def selector(model) -> KernelSelector:
    return KernelSelector.load(model, cache_size=0)


PROBLEM = {"m": 128, "n": 1536, "k": 7168}


class Bench:
    """A fake GPU: kernel -> seconds, the listed kernels fail (raise / NaN / inf / negative)."""

    def __init__(self, times: dict[str, float] | None = None, fail: dict[str, object] | None = None) -> None:
        self.times, self.fail, self.calls = times or {}, fail or {}, []

    def __call__(self, name: str) -> float:
        self.calls.append(name)
        if name in self.fail:
            how = self.fail[name]
            if isinstance(how, Exception):
                raise how
            return how  # type: ignore[return-value]
        return self.times.get(name, 1e-3 + 1e-6 * len(self.calls))


def test_autotune_measures_in_model_order_and_returns_the_measured_best(selector) -> None:
    ranked = selector.select(PROBLEM, top_k=5)
    times = {name: t for name, t in zip(ranked.kernels, [5e-3, 4e-3, 1e-3, 2e-3, 3e-3])}
    bench = Bench(times)
    result = selector.autotune(PROBLEM, bench, at.FixedK(3))
    assert bench.calls == list(ranked.kernels[:3])
    assert result.ok and result.kernel == ranked.kernels[2] and result.seconds == 1e-3
    assert result.kernel_id == ranked.ids[2] and result.benchmarks == 3 and not result.from_store
    assert [m.kernel for m in result.measured] == list(ranked.kernels[:3])


def test_failures_are_recorded_skipped_and_do_not_count_as_successes(selector) -> None:
    ranked = selector.select(PROBLEM, top_k=6)
    k = ranked.kernels
    bench = Bench({k[3]: 2e-3, k[4]: 1e-3}, {k[0]: RuntimeError("launch failed"), k[1]: math.nan, k[2]: -1.0})
    result = selector.autotune(PROBLEM, bench, at.FixedK(2))
    assert bench.calls == list(k[:5])  # three failures, then two successes
    assert result.kernel == k[4]
    errors = [m.error for m in result.measured if not m.ok]
    assert errors[0] == "RuntimeError: launch failed" and "nan" in errors[1] and "-1.0" in errors[2]


def test_budget_exhaustion_when_everything_fails(selector) -> None:
    ranked = selector.select(PROBLEM, top_k=10)
    bench = Bench(fail={name: OSError("no") for name in ranked.kernels})
    result = selector.autotune(PROBLEM, bench, at.FixedK(2, max_benchmarks=4))
    assert not result.ok and result.kernel is None and result.benchmarks == 4
    assert "max_benchmarks=4 reached" in result.stop and "all 4 benchmarks failed" in result.stop


def test_time_budget_stops_once_the_measured_seconds_are_spent(selector) -> None:
    ranked = selector.select(PROBLEM, top_k=8)
    bench = Bench({name: 0.4 for name in ranked.kernels})
    result = selector.autotune(PROBLEM, bench, at.TimeBudget(1.0))
    assert result.benchmarks == 3  # 0.4 + 0.4 < 1.0 <= 1.2
    wall = selector.autotune(PROBLEM, bench, at.TimeBudget(1e-9, clock="wall"))
    assert wall.benchmarks == 1


def test_confidence_budget_follows_the_calibration_table(selector) -> None:
    # Two bins split at gap 0.5: a narrow gap needs 3 candidates, a wide one 1.
    table = {"format": at.CALIBRATION_FORMAT, "within": [0.05], "edges": [0.5], "counts": [10, 10],
             "probability": [[[0.5, 0.8, 0.96, 0.99], [0.97, 0.99, 1.0, 1.0]]]}
    budget = at.Confidence(target=0.95, within=0.05, calibration=table)
    assert budget.planned([3.0, 2.9, 1.0]) == 3
    assert budget.planned([3.0, 2.0, 1.0]) == 1
    assert budget.planned([3.0]) == 1
    assert at.Confidence(target=0.999, within=0.05, calibration=table).planned([3.0, 2.9]) == 4  # max_k
    with pytest.raises(at.AutotuneError, match="no autotune calibration"):
        selector.autotune(PROBLEM, Bench(), at.Confidence())  # this export has none
    with pytest.raises(at.AutotuneError, match=r"within=0.02.*calibrated: \[0.05\]"):
        at.Confidence(within=0.02, calibration=table)


def test_calibrate_is_monotone_and_matches_hand_counts() -> None:
    # Six problems, two kernels each; score gap large for 0-2 (the top one is right), small
    # for 3-5 (the top one is 20% slow in two of them).
    shapes, perf, scores = [], [], []
    for s, (gap, first, second) in enumerate([(2, 1.0, 0.5), (3, 1.0, 0.5), (4, 1.0, 0.9),
                                              (0.1, 0.8, 1.0), (0.2, 1.0, 0.9), (0.1, 0.8, 1.0)]):
        shapes += [s, s]
        perf += [first, second]
        scores += [gap, 0.0]
    cal = at.calibrate(at.OofRows(shapes, perf, scores), within=(0.05,), bins=2, max_k=2, prior_failures=0)
    assert cal.edges == (1.1,) and cal.counts == (3, 3)
    assert np.allclose(cal.probability[0], [[1 / 3, 1.0], [1.0, 1.0]], atol=1e-6)
    again = at.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal
    # a violating bin order is pooled: make the wide-gap bin worse than the narrow one
    perf2 = [0.5, 1.0, 0.5, 1.0, 0.5, 1.0] + perf[6:]  # the wide-gap top kernels are now 50% slow
    cal2 = at.calibrate(at.OofRows(shapes, perf2, scores), within=(0.05,), bins=2, max_k=2, prior_failures=0)
    top1 = [row[0] for row in cal2.probability[0]]
    assert top1[0] == top1[1] == pytest.approx((1 / 3 + 0) / 2, abs=1e-6)  # 1/3 and 0 pooled


def test_store_round_trip_stale_model_and_other_process_view(selector, tmp_path) -> None:
    path = tmp_path / "store" / "autotune.jsonl"
    bench = Bench()
    first = selector.autotune(PROBLEM, bench, at.FixedK(2), store=path)
    assert first.ok and len(bench.calls) == 2
    again = selector.autotune(PROBLEM, bench, at.FixedK(2), store=path)
    assert again.from_store and again.kernel == first.kernel and len(bench.calls) == 2
    # a fresh store object (as another process) sees the same entry
    entry = at.ResultStore(path).get(at.model_hash(selector.manifest), "gemm_universal",
                                     "m=128,n=1536,k=7168,split_k=1")
    assert entry["kernel"] == first.kernel and entry["writer"] == "python" and len(entry["measured"]) == 2
    # a stale model (different selector hash) is ignored: it benchmarks again
    stale = json.loads(path.read_text().splitlines()[0])
    path.write_text(json.dumps({**stale, "model": "0" * 64, "kernel": "stale"}) + "\n")
    bench2 = Bench()
    fresh = selector.autotune(PROBLEM, bench2, at.FixedK(1), store=path)
    assert not fresh.from_store and fresh.kernel != "stale" and len(bench2.calls) == 1


def test_store_skips_a_torn_line_and_appends_after_it(tmp_path, caplog) -> None:
    path = tmp_path / "s.jsonl"
    store = at.ResultStore(path)
    store.put(_entry(1))
    with open(path, "ab") as fh:
        fh.write(b'{"format":"ckpred.autotune/1","model":"m"')  # a writer died mid-line
    store.put(_entry(2))
    reader = at.ResultStore(path)
    assert [e["problem"] for e in reader.entries()] == ["p=1", "p=2"]
    assert reader.skipped_lines == 1 and "skipped a store line (does not parse" in caplog.text


def _entry(i: int, model: str = "m") -> dict:
    return {"model": model, "op": "op", "problem": f"p={i}", "kernel": f"k{i}", "kernel_id": i, "seconds": 1e-3 * (i + 1)}


def _writer(path: str, worker: int, n: int) -> None:
    store = at.ResultStore(path, max_entries=40)
    for i in range(n):  # ten keys per writer, each rewritten four times: version i // 10
        store.put({**_entry(worker * 1000 + i % 10), "kernel": f"v{i // 10}"})


def test_store_under_concurrent_writers_compacts_and_loses_no_write(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert all(json.loads(line)["format"] == at.STORE_FORMAT for line in lines)  # no torn or merged line
    assert len(lines) < 160  # 160 writes of 40 keys: compacted at > 80 lines
    store = at.ResultStore(path, max_entries=40)
    latest = {e["problem"]: e["kernel"] for e in store.entries()}
    assert store.skipped_lines == 0
    # every key holds its writer's last version: no write was lost to a concurrent compaction
    assert latest == {f"p={w * 1000 + j}": "v3" for w in range(4) for j in range(10)}


def test_compaction_keeps_the_last_entry_per_key_and_the_newest_keys(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    store = at.ResultStore(path, max_entries=3)
    for i in range(5):
        store.put(_entry(i))
    store.put({**_entry(1), "kernel": "k1-new"})
    store.compact()
    got = [(e["problem"], e["kernel"]) for e in at.ResultStore(path).entries()]
    assert got == [("p=3", "k3"), ("p=4", "k4"), ("p=1", "k1-new")]
    assert len(path.read_text().splitlines()) == 3


def test_bad_budgets_are_one_line_errors() -> None:
    with pytest.raises(at.AutotuneError, match=r"FixedK.k=0; allowed: an integer >= 1"):
        at.FixedK(0)
    with pytest.raises(at.AutotuneError, match=r"TimeBudget.clock='gpu'; allowed: 'kernel', 'wall'"):
        at.TimeBudget(1.0, clock="gpu")
    with pytest.raises(at.AutotuneError, match="format None"):
        at.Calibration.from_dict({"within": [0.05]})
    with pytest.raises(at.AutotuneError, match="budget=3"):
        at.autotune_ranked([1], ["a"], [1.0], lambda k: 1.0, 3)  # type: ignore[arg-type]


def test_autotune_ranked_core_matches_replay_rules() -> None:
    seen = []
    result = at.autotune_ranked([7, 8, 9], ["a", "b", "c"], [3.0, 2.0, 1.0],
                                lambda i: seen.append(i) or {7: np.inf, 8: 2.0, 9: 1.0}[i], at.FixedK(1), pass_id=True)
    assert seen == [7, 8] and result.kernel == "b" and result.stop == "budget spent"


# -- C++ (scripts/cpp/ckpred_autotune.hpp) against the same store ------------------------------
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(cpp_demo: Path) -> Path:
    return cpp_demo


def _demo(demo: Path, model: Path, store: Path, times: dict, rankings: list, *args: str) -> list[dict]:
    import subprocess

    times_file = store.with_name(store.name + ".times.json")
    times_file.write_text(json.dumps(times))
    done = subprocess.run([str(demo), str(model), "--store", str(store), "--times", str(times_file), *args],
                          input="".join(json.dumps(r.to_dict()) + "\n" for r in rankings), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_cpp_and_python_read_each_others_store_entries(selector, model, demo, tmp_path) -> None:
    store = tmp_path / "shared.jsonl"
    py = selector.autotune(PROBLEM, Bench(), at.FixedK(2), store=store)
    other = {"m": 256, "n": 4096, "k": 512}
    ranked = selector.select(other, top_k=16)
    k = ranked.kernels
    times = {k[0]: "throw", k[1]: "nan", k[2]: 3e-3, k[3]: 2e-3}
    got = _demo(demo, model, store, times, [selector.select(PROBLEM, top_k=16), ranked])
    # C++ serves Python's entry without benchmarking ...
    assert got[0]["from_store"] and got[0]["kernel"] == py.kernel and got[0]["benchmarks"] == 0
    # ... and tunes the new problem: two failures skipped, two successes (fixed:2), the faster kept
    assert not got[1]["from_store"] and got[1]["kernel"] == k[3] and got[1]["benchmarks"] == 4
    assert got[1]["failures"] == 2 and got[1]["stop"] == "budget spent"
    # Python serves C++'s entry, with its failures recorded
    bench = Bench()
    again = selector.autotune(other, bench, at.FixedK(2), store=store)
    assert again.from_store and again.kernel == k[3] and bench.calls == []
    entry = at.ResultStore(store).get(at.model_hash(selector.manifest), "gemm_universal", again.problem)
    assert entry["writer"] == "cpp" and entry["seconds"] == 2e-3
    assert [m.get("error", "")[:9] for m in entry["measured"]][:2] == ["exception", "non-finit"]


def test_cpp_ignores_stale_models_and_reports_budget_exhaustion(selector, model, demo, tmp_path) -> None:
    store = tmp_path / "s.jsonl"
    ranked = selector.select(PROBLEM, top_k=16)
    key = "m=128,n=1536,k=7168,split_k=1"
    store.write_text(json.dumps({"format": at.STORE_FORMAT, "model": "f" * 64, "op": "gemm_universal",
                                 "problem": key, "kernel_id": 0, "kernel": "stale", "seconds": 1e-9}) + "\n")
    got = _demo(demo, model, store, {}, [ranked], "--budget", "fixed:2", "--max-benchmarks", "5")
    assert not got[0]["from_store"] and not got[0]["ok"] and got[0]["benchmarks"] == 5
    assert got[0]["stop"] == "max_benchmarks=5 reached: all 5 benchmarks failed"
    assert len(store.read_text().splitlines()) == 1  # nothing stored for a failed search


def test_cpp_budgets_match_python(selector, model, demo, tmp_path) -> None:
    ranked = selector.select(PROBLEM, top_k=16)
    times = {name: 0.4 for name in ranked.kernels}
    got = _demo(demo, model, tmp_path / "t.jsonl", times, [ranked], "--budget", "time:1.0")
    assert got[0]["benchmarks"] == selector.autotune(PROBLEM, Bench(times), at.TimeBudget(1.0)).benchmarks == 3
    # confidence: a copy of the export whose manifest carries a calibration table
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(model, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    gap = at.score_gap(ranked.scores)
    table = {"format": at.CALIBRATION_FORMAT, "within": [0.05], "edges": [gap / 2, 2 * gap + 1], "counts": [5, 5, 5],
             "probability": [[[0.1, 0.2, 0.3], [0.5, 0.6, 0.91], [0.99, 1.0, 1.0]]]}
    manifest["autotune"] = table
    forge(copy, manifest)  # the model's metadata too, files re-signed: both runtimes accept it
    assert KernelSelector.load(copy).calibration == at.load_calibration(table)
    want = at.Confidence(0.9, 0.05, table).planned(ranked.scores)
    assert want == 3  # the middle bin
    got = _demo(demo, copy, tmp_path / "c.jsonl", times, [ranked], "--budget", "confidence:0.9:0.05")
    assert got[0]["benchmarks"] == want


def _cpp_writer(demo: str, model: str, store: str, times: str, rankings: str) -> None:
    import subprocess

    with open(rankings) as fh:
        subprocess.run([demo, model, "--store", store, "--times", times, "--max-entries", "20"], stdin=fh,
                       capture_output=True, check=True, timeout=120)


def test_cpp_and_python_writers_at_once(selector, model, demo, tmp_path) -> None:
    store = tmp_path / "s.jsonl"
    problems = [{"m": m, "n": 1536, "k": 7168} for m in range(64, 64 + 8 * 30, 8)]
    rankings = [selector.select(p, top_k=4) for p in problems]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rankings))
    times = {name: 1e-3 for r in rankings for name in r.kernels}
    (tmp_path / "t.json").write_text(json.dumps(times))
    ctx = mp.get_context("fork")
    cpp = [ctx.Process(target=_cpp_writer, args=(str(demo), str(model), str(store), str(tmp_path / "t.json"),
                                                  str(tmp_path / "r.jsonl"))) for _ in range(2)]
    for p in cpp:
        p.start()
    py = at.ResultStore(store, max_entries=20)
    for i in range(60):
        py.put(_entry(i, model="python-side"))
    for p in cpp:
        p.join(120)
        assert p.exitcode == 0
    reader = at.ResultStore(store)
    entries = reader.entries()
    assert reader.skipped_lines == 0
    assert len(store.read_text().splitlines()) <= 2 * 20 + 1
    assert {e["writer"] for e in entries} <= {"python", "cpp"} and entries


# -- the calibration of a default export (select=reranked), checked by both runtimes ----------
SMALL = ["shapes=tiny", "model.n_estimators=8", "model.num_leaves=7", "model.n_jobs=1", "rows.max_per_shape=192",
         "rows.keep_top=32"]


@pytest.fixture(scope="module")
def default_export(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny 3-fold train run and two exports with the default strategy (reranked): the default
    calibration (logistic) and the score-gap table with non-default settings: (logistic export,
    table export, run dir)."""
    from ckpred.commands.export import export_command
    from ckpred.commands.train import train
    from ckpred.config import compose

    root = tmp_path_factory.mktemp("default_export")
    train(compose("train", [*SMALL, "cv.n_splits=3", "progress=false", "plots=false", f"out_dir={root / 'run'}",
                            "baselines.reference.enabled=false"]))
    common = [*SMALL, f"run_dir={root / 'run'}", "parity.shapes=3", "reranker.n_estimators=10",
              "reranker.num_leaves=7", "autotune.within=[0.02,0.05]"]
    logistic = export_command(compose("export", [*common, f"out_dir={root / 'ex'}"]))
    table = export_command(compose("export", [*common, f"out_dir={root / 'ex_table'}", "autotune.kind=table",
                                              "autotune.gap_to=2", "autotune.bins=3"]))
    return Path(logistic), Path(table), root / "run"


def test_default_export_carries_the_rerankers_calibration_with_the_configured_settings(default_export) -> None:
    import pandas as pd

    from ckpred.commands.export import strategy_cv
    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.kernels.base import load_op

    out, out_table, run = default_export
    man, man_table = (json.loads((d / "manifest.json").read_text()) for d in (out, out_table))
    assert man["select"] == man["autotune"]["select"] == man_table["autotune"]["select"] == "reranked"
    logistic = at.load_calibration(man["autotune"])
    assert isinstance(logistic, at.LogisticCalibration) and logistic.within == (0.02, 0.05)
    assert logistic.fields == ("m", "n", "k", "split_k") and logistic.problems == 12 and logistic.max_k == 10
    table = at.load_calibration(man_table["autotune"])
    assert isinstance(table, at.Calibration) and table.gap_to == 2 and table.within == (0.02, 0.05)
    assert len(table.counts) <= 3 and sum(table.counts) == 12
    # both fitted on the reranked strategy's out-of-fold scores (per-fold candidates and
    # reranker), not on the run's full-model scores
    cfg = compose("export", [*SMALL, f"run_dir={run}", "reranker.n_estimators=10", "reranker.num_leaves=7"])
    op = load_op(cfg.op)
    data = load_table(cfg)
    _, scored = strategy_cv(run, data, op, cfg, cfg)
    ids = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).set_index("kernel_name")["kernel_id"]
    options = dict(within=(0.02, 0.05), gap_to=2, bins=3)
    assert at.calibration_from_oof(scored, ids, **options) == {k: v for k, v in man_table["autotune"].items()
                                                               if k != "select"}
    full = at.calibration_from_oof(pd.read_parquet(run / "oof_predictions.parquet"), ids, **options)
    assert scored["selectable"].sum() < len(scored)  # only the fold's candidates are ranked
    assert full["edges"] != man_table["autotune"]["edges"] or full["probability"] != man_table["autotune"]["probability"]
    fields = ["m", "n", "k", "split_k"]
    problems = data[fields].assign(shape=op.shape_keys(data)).drop_duplicates("shape").set_index("shape")
    again = at.calibration_from_oof(scored, ids, kind="logistic", problems=problems, within=(0.02, 0.05))
    assert again == {k: v for k, v in man["autotune"].items() if k != "select"}


@pytest.mark.parametrize("which", [0, 1], ids=["logistic", "table"])
def test_confidence_budget_on_a_default_export_python_and_cpp_agree(default_export, demo, tmp_path, which) -> None:
    out = default_export[which]
    sel = KernelSelector.load(out, cache_size=0)
    assert sel.calibration == at.load_calibration(sel.manifest["autotune"])
    problems = [{"m": m, "n": n, "k": k} for m in (16, 128, 1024, 8192) for n in (512, 4096) for k in (256, 7168)]
    planned, rankings, policies, shifted = [], [], [], 0
    for target in (0.3, 0.6, 0.9):
        for p in problems:
            bench = Bench()
            r = sel.autotune(p, bench, at.Confidence(target=target, within=0.05))
            ranked = sel.select(p, top_k=16)
            k = sel.calibration.needed(ranked.scores, target, 0.05, problem={**p, "split_k": 1})
            if ranked.out_of_distribution:  # outside the training ranges: at least the stated fallback k
                k, shifted = max(k, sel.calibration.fallback_k), shifted + 1
                assert r.policy == f"confidence(target={target:g},within=0.05)+shifted(k>={sel.calibration.fallback_k})"
            else:
                assert r.policy == f"confidence(target={target:g},within=0.05)"
            want = min(k, len(ranked.kernels))
            assert r.ok and len(bench.calls) == want  # (a reranked export ranks a few candidates)
            assert bench.calls == list(ranked.kernels[:len(bench.calls)])  # model order
            planned.append(len(bench.calls))
            policies.append(r.policy)
            rankings.append(ranked)
        times = {name: 1e-3 for r in rankings for name in r.kernels}
        got = _demo(demo, out, tmp_path / f"s{target}.jsonl", times, rankings[-len(problems):], "--budget",
                    f"confidence:{target}:0.05")
        assert [g["benchmarks"] for g in got] == planned[-len(problems):]
        assert [g["policy"] for g in got] == policies[-len(problems):]
    assert len(set(planned)) > 1  # the calibration sizes the budget per problem/target, not one constant
    assert 0 < shifted < len(planned)  # in- and out-of-distribution problems both sized


def test_logistic_calibration_reads_the_problem_size() -> None:
    # a hand-made model: P_1 rises with log2(1 + m) only; P_2 is high everywhere
    fields = ("m",)
    n = len(at.SCORE_FEATURES) + 2
    coef1 = [0.0] * n
    coef1[len(at.SCORE_FEATURES)] = 4.0  # log2_m
    cal = at.LogisticCalibration(within=(0.05,), fields=fields, fill=(1.0,) * n, lo=(-1e9,) * n, hi=(1e9,) * n,
                                 mean=(0.0,) * (n - 2) + (8.0, 8.0), scale=(1.0,) * n,
                                 coef=(((*coef1,), (0.0,) * n),), intercept=((0.0, 3.0),))
    small, large = {"m": 15}, {"m": 1023}  # log2(1 + m) = 4 and 10: z = -16 and +8
    assert cal.needed([3.0, 2.0, 1.0], 0.9, 0.05, problem=small) == 2
    assert cal.needed([3.0, 2.0, 1.0], 0.9, 0.05, problem=large) == 1
    assert at.load_calibration(cal.to_dict()) == cal
    with pytest.raises(at.AutotuneError, match="pass problem"):
        cal.needed([3.0, 2.0], 0.9, 0.05)
    with pytest.raises(at.AutotuneError, match=r"needs problem fields \['m'\]"):
        cal.needed([3.0, 2.0], 0.9, 0.05, problem={"n": 1})


def _scaled(table: dict, factor: float) -> dict:
    return {**table, "probability": [[[p * factor for p in row] for row in t] for t in table["probability"]]}


@pytest.mark.parametrize("which, edit, message", [
    (1, lambda t: _scaled(t, 9.0), "outside \\[0, 1\\]"),
    (1, lambda t: {**t, "edges": [t["edges"][0]] * (len(t["edges"]) + 1), "counts": [1, *t["counts"]],
                   "probability": [[tab[0], *tab] for tab in t["probability"]]}, "strictly increasing"),
    (1, lambda t: {**t, "within": [0.05, 0.05]}, "distinct fractions"),
    (0, lambda t: {**t, "within": [0.05, 0.05]}, "distinct fractions"),
    (0, lambda t: {**t, "scale": [0.0] * len(t["scale"])}, "scale <= 0"),
    (0, lambda t: {**t, "fill": t["fill"][:-1]}, "fill/lo/hi/mean/scale"),
    (1, lambda t: {**t, "fallback_k": 0}, "fallback_k is 0"),
    (0, lambda t: {**t, "fallback_k": 2.5}, "fallback_k is 2.5"),
    (0, lambda t: {**t, "uninformative_within": [0.3]}, "uninformative_within"),
    (1, lambda t: {**t, "uninformative_within": ["0.05"]}, "uninformative_within"),
    (1, lambda t: {**t, "zero_shot": "yes"}, "zero_shot is"),
], ids=["table-probability", "table-edges", "table-within", "logistic-within", "logistic-scale", "logistic-fill",
        "table-fallback-k", "logistic-fallback-k", "logistic-uninformative", "table-uninformative", "table-zero-shot"])
def test_a_malformed_calibration_is_refused_by_both_runtimes(default_export, demo, tmp_path, which, edit,
                                                            message) -> None:
    import shutil
    import subprocess

    out = default_export[which]
    good = json.loads((out / "manifest.json").read_text())["autotune"]
    bad = edit(good)
    with pytest.raises(at.AutotuneError, match=message):
        at.load_calibration(bad)
    copy = tmp_path / "m"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    forge(copy, {**manifest, "autotune": bad})  # consistent: only the calibration check can refuse it
    with pytest.raises(ModelMismatchError, match=message):
        KernelSelector.load(copy)
    (tmp_path / "t.json").write_text("{}")
    done = subprocess.run([str(demo), str(copy), "--store", str(tmp_path / "s.jsonl"), "--times",
                           str(tmp_path / "t.json")], input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "autotune calibration" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_python_runtime_checks_the_embedded_calibration_at_load(default_export, tmp_path, monkeypatch) -> None:
    from ckpred import runtime
    from ckpred.errors import ModelMismatchError

    out = default_export[1]
    manifest = json.loads((out / "manifest.json").read_text())
    with pytest.raises(ModelMismatchError, match=r"manifest.json: autotune: .*outside \[0, 1\]"):
        runtime._calibration({**manifest, "autotune": _scaled(manifest["autotune"], 9.0)}, out)
    assert runtime._calibration({**manifest, "autotune": None}, out) is None


# -- a calibration with nothing to learn, problems it did not measure -----------------------------------
def _oof(n_problems: int, top1: float, kernels: int = 6, best_at: int = 1):
    """Out-of-fold rows: every problem's top-scored kernel reaches ``top1`` of its best, the one
    ranked ``best_at`` (0 = the top) is the best."""
    import pandas as pd

    rows = []
    for p in range(n_problems):
        for j in range(kernels):
            perf = top1 if j == 0 else (1.0 if j == best_at else 0.3)
            rows.append({"shape": f"s{p}", "kernel_name": f"k{j}", "perf": perf, "selectable": True,
                         "score_model": float(kernels - j) + 0.01 * p})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", ["table", "logistic"])
def test_a_calibration_that_never_saw_a_top1_hit_says_so_and_falls_back_to_the_stated_k(kind) -> None:
    import pandas as pd

    oof = _oof(12, top1=0.5, kernels=14, best_at=12)  # as on the Kernel Tuner caches: the best ranks far down
    problems = pd.DataFrame({"m": np.arange(12) + 1}, index=[f"s{p}" for p in range(12)])
    d = at.calibration_from_oof(oof, kind=kind, problems=problems, within=(0.02, 0.1), fallback_k=3)
    assert d["uninformative_within"] == [0.02, 0.1] and d["fallback_k"] == 3 and d["zero_shot"] is False
    assert "no out-of-fold problem's top-1 kernel is within 10% of its best (12 problems)" in d["note"]
    assert "fixed k = 3" in d["note"]
    cal = at.load_calibration(d)
    budget = at.Confidence(0.9, 0.02, cal)
    for scores in ([9.0, 1.0], [5.0, 4.9, 4.8]):  # whatever the scores say
        sized = at.size_confidence(budget, scores, {"m": 4})
        assert sized.k == 3 and sized.describe() == "confidence(target=0.9,within=0.02)+fallback(k=3)"
    # without the fallback the same labels would plan the cap: the probabilities never reach 0.9
    assert at.load_calibration({**d, "uninformative_within": []}).needed([9.0, 1.0], 0.9, 0.02, {"m": 4}) == 10


def test_only_the_tolerances_without_a_top1_hit_or_too_few_problems_are_uninformative() -> None:
    d = at.calibration_from_oof(_oof(12, top1=0.95), within=(0.02, 0.1))
    assert d["uninformative_within"] == [0.02] and "within 2% of its best" in d["note"]
    assert at.calibration_from_oof(_oof(12, top1=1.0), within=(0.02, 0.1))["uninformative_within"] == []
    few = at.calibration_from_oof(_oof(12, top1=1.0), within=(0.02, 0.1), min_problems=13)
    assert few["uninformative_within"] == [0.02, 0.1] and "12 out-of-fold problem(s), fewer than the 13" in few["note"]
    assert "note" not in at.calibration_from_oof(_oof(12, top1=1.0), within=(0.02, 0.1))


def test_the_budget_spends_at_least_the_fallback_out_of_distribution_and_on_a_new_gpu() -> None:
    d = at.calibration_from_oof(_oof(30, top1=1.0), within=(0.05,), fallback_k=4)
    cal = at.load_calibration(d)
    budget = at.Confidence(0.5, 0.05, cal)
    inside = at.size_confidence(budget, [3.0, 1.0])
    assert inside.k == 1 and inside.describe() == "confidence(target=0.5,within=0.05)"
    shifted = at.size_confidence(budget, [3.0, 1.0], shift="out of distribution (m)")
    assert shifted.k == 4 and shifted.describe() == "confidence(target=0.5,within=0.05)+shifted(k>=4)"
    manifest = {"arch": "sm90_h100", "training": {"problem_ranges": {"m": [16, 4096]}, "archs": ["gfx90a", "gfx942"]}}
    assert at.shift_of(manifest, {"m": 128}, cal) == "arch sm90_h100 never trained on (gfx90a, gfx942)"
    assert at.shift_of({**manifest, "arch": "gfx942"}, {"m": 128}, cal) == ""
    assert at.shift_of({**manifest, "arch": "gfx942"}, {"m": 8192}, cal) == "out of distribution (m)"
    # a calibration fitted on held-out GPUs measured the new GPU already: only the ranges shift it
    zero_shot = at.load_calibration({**d, "zero_shot": True})
    assert at.shift_of(manifest, {"m": 128}, zero_shot) == ""
    assert at.shift_of({"arch": "x", "training": {}}, {"m": 1}, cal) == ""  # nothing recorded: nothing known


def test_cpp_sizes_shifted_and_uninformative_problems_as_python(default_export, demo, tmp_path) -> None:
    import shutil

    out = default_export[1]  # the score-gap table
    sel = KernelSelector.load(out, cache_size=0)
    problems = [{"m": 128, "n": 1536, "k": 7168}, {"m": 1 << 20, "n": 1536, "k": 7168}]
    rankings = [sel.select(p, top_k=16) for p in problems]
    assert [r.out_of_distribution for r in rankings] == [False, True]
    times = {name: 1e-3 for r in rankings for name in r.kernels}
    for name, edit in (("as exported", {}), ("new gpu", {"training": {"archs": ["gfx942"]}}),
                       ("uninformative", {"autotune": {"uninformative_within": [0.05], "fallback_k": 3}})):
        copy = tmp_path / name.replace(" ", "_")
        shutil.copytree(out, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        for key, value in edit.items():
            manifest[key] = {**manifest[key], **value}
        forge(copy, manifest)
        mine = KernelSelector.load(copy, cache_size=0)
        want = [mine.autotune(p, Bench(times), at.Confidence(0.6, 0.05)) for p in problems]
        got = _demo(demo, copy, tmp_path / f"{copy.name}.jsonl", times, rankings, "--budget", "confidence:0.6:0.05")
        assert [g["benchmarks"] for g in got] == [w.benchmarks for w in want]
        assert [g["policy"] for g in got] == [w.policy for w in want]
        if name == "new gpu":  # gfx950's model on a GPU list without it: both problems shifted
            assert all(w.policy.endswith(f"+shifted(k>={mine.calibration.fallback_k})") for w in want)
        elif name == "uninformative":
            assert all(w.benchmarks == 3 and w.policy.endswith("+fallback(k=3)") for w in want)
        else:
            assert not want[0].policy.endswith(")+shifted(k>=5)") and want[1].policy.endswith("+shifted(k>=5)")
