"""Sparse tables: the candidate set the exported selector ranks, and what absence means."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import ConfigValueError
from ckpred.fitting import NOT_MEASURED, Coverage, coverage_note, with_unmeasured
from ckpred.kernels.declared import load_declared
from tests.test_cpp import _run, binary  # noqa: F401 (binary: the built C++ selector, a fixture)

#: A tiny op: problem ``m``, kernel tile ``t``, and a rule (a tile no larger than the problem).
TINY_OP = {
    "name": "tiny", "problem_fields": {"m": {"kind": "int"}}, "kernel_fields": {"t": {"kind": "int"}},
    "kernel_id": {"template": "t{t}"}, "metric": {"column": "ms", "better": "lower", "unit": "ms"},
    "rules": [{"expr": "t <= m", "message": "tile larger than the problem"}],
    "keys": {"query": ["m"]},
}


def tiny_op(**changes: object):  # type: ignore[no-untyped-def]
    op = load_declared({**TINY_OP, **changes})
    return op


def tiny_table(pairs: list[tuple[int, int, float]]) -> pd.DataFrame:
    """Canonical rows of (m, t, tflops)."""
    rows = [{"op": "tiny", "arch": "gfx942", "dtype": "fp16", "layout": "rcr", "m": m, "t": t, "kernel_name": f"t{t}",
             "tflops": p, "latency_ms": 1.0 / p, "bandwidth_gbs": np.nan, "is_valid": True, "invalid_reason": "",
             "repeats": 1, "spread": 0.0, "source": f"x.csv:{i}", "run_id": "r"} for i, (m, t, p) in enumerate(pairs)]
    return pd.DataFrame(rows)


CFG = SimpleNamespace(arch="gfx942", dtype="fp16", layout="rcr")


def _bound(op, table: pd.DataFrame):  # type: ignore[no-untyped-def]
    op.bind_catalogue(op.catalogue_from_table(table, dtype="fp16", layout="rcr"))
    return op


def test_with_unmeasured_adds_exactly_the_rule_valid_pairs_a_problem_lacks() -> None:
    # catalogue t1, t2, t4; m=4 measures t4 and t1 (listed out of catalogue order), m=1 t1, m=8 t2
    table = tiny_table([(4, 4, 3.0), (4, 1, 2.0), (1, 1, 5.0), (8, 2, 7.0)])
    op = _bound(tiny_op(), table)
    out, coverage = with_unmeasured(table, op, CFG)
    # m=4 lacks t2 (2 <= 4: added); m=1 lacks t2 and t4 (rule-invalid: not candidates); m=8 lacks t1, t4
    got = list(zip(out["m"], out["kernel_name"], out["measured"]))
    assert got == [(4, "t1", True), (4, "t2", False), (4, "t4", True), (1, "t1", True),
                   (8, "t1", False), (8, "t2", True), (8, "t4", False)]
    added = out[~out["measured"]]
    assert (added["tflops"] == 0).all() and not added["is_valid"].any()
    assert (added["invalid_reason"] == NOT_MEASURED).all() and (added["t"].tolist() == [2, 1, 4])
    assert (added["arch"] == "gfx942").all() and (added["source"] == "").all()
    # the measured rows are the table's, untouched
    measured = out[out["measured"]].drop(columns="measured").sort_values("source").reset_index(drop=True)
    assert isinstance(out["kernel_name"].dtype, pd.CategoricalDtype)  # text as categories
    measured = measured.astype({c: table[c].dtype for c in table})
    pd.testing.assert_frame_equal(measured, table.sort_values("source").reset_index(drop=True))
    assert coverage == Coverage(problems=3, pairs=7, unmeasured=3, one_kernel=2, example=str(coverage.example))
    assert coverage.example in ("1", "8")


def test_a_full_table_gains_no_row() -> None:
    table = tiny_table([(4, 1, 1.0), (4, 2, 2.0), (8, 1, 1.0), (8, 2, 3.0)])
    op = _bound(tiny_op(), table)
    out, coverage = with_unmeasured(table, op, CFG)
    assert out["measured"].all() and len(out) == len(table)
    assert coverage.unmeasured == 0 and coverage.pairs == 4 and coverage.one_kernel == 0
    assert coverage_note(op, coverage) is None


def test_coverage_notes_and_refusals() -> None:
    sparse = Coverage(problems=10, pairs=40, unmeasured=10, one_kernel=0)
    note = coverage_note(tiny_op(), sparse)
    assert note is not None and "10 of 40" in note and "(25.0%)" in note and "op.absence: not_applicable" in note
    note = coverage_note(tiny_op(absence="not_applicable"), sparse)
    assert note is not None and "taken as not applicable" in note and "single row" not in note
    note = coverage_note(tiny_op(absence="not_applicable"),
                         Coverage(problems=10, pairs=40, unmeasured=10, one_kernel=3, example="m=7"))
    assert note is not None and "3 of 10 problems have a single row (e.g. m=7)" in note
    # sparse declared on a full table: nothing to learn
    with pytest.raises(ConfigValueError, match=r"op.absence.*not_applicable.*'unknown' for this table.*each of its 10 "
                                               r"problems"):
        coverage_note(tiny_op(absence="not_applicable"), Coverage(problems=10, pairs=40, unmeasured=0, one_kernel=0))
    # every problem with one row: a table of winners, not of applicable kernels
    with pytest.raises(ConfigValueError, match=r"op.absence.*each of its 10 problems has a single row"):
        coverage_note(tiny_op(absence="not_applicable"), Coverage(problems=10, pairs=40, unmeasured=30, one_kernel=10))


def test_absence_is_checked_when_the_op_is_composed() -> None:
    with pytest.raises(ConfigValueError, match=r"op.absence.*'sparse'.*one of \['unknown', 'not_applicable'\]"):
        tiny_op(absence="sparse")
    assert tiny_op().absence == "unknown" and tiny_op(absence="not_applicable").absence == "not_applicable"


# -- the applicability mask, fitted, exported and run by both runtimes -----------------------------
@pytest.fixture(scope="module")
def sparse_fit(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A find-db whose problems list three solvers each, of nine (three per direction), trained
    with op.absence=not_applicable: the final pipeline carries the applicability mask.""" 
    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.fitting import fit_final
    from ckpred.kernels.base import load_op
    from ckpred.kernels.declared import bind_training_catalogue
    from tests.test_yaml_ops_train import OPS_DIR, write_find_db

    fdb = write_find_db(tmp_path_factory.mktemp("fdb") / "small.fdb.txt", n_convs=12)
    # B problems of two convolutions in three, W of one in two, as a pruned sweep would have them:
    # with every direction equally frequent, neither a solver nor a direction alone would tell
    # (each pair is absent 2/3 of the time) and greedy trees would find no first split
    lines = fdb.read_text().splitlines()
    fdb.write_text("\n".join(line for i, line in enumerate(lines)
                             if not (line.split("=")[0].endswith("-W") and (i // 6) % 2)
                             and not (line.split("=")[0].endswith("-B") and (i // 6) % 3 == 2)) + "\n")
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "op.absence=not_applicable",
                            "arch=gfx942", "data=path", f"data.path={fdb}", "model.n_estimators=20",
                            "model.n_jobs=1", "applicability.n_estimators=30", "progress=false"])
    op = load_op(cfg.op)
    table = load_table(cfg)
    bind_training_catalogue(op, table, cfg)
    return op, cfg, table, fit_final(cfg, table, op)


def test_the_final_pipeline_learns_which_solvers_apply(sparse_fit) -> None:  # type: ignore[no-untyped-def]
    from ckpred.models import applicability_model, predicted_applicable

    op, cfg, table, pipe = sparse_fit
    assert applicability_model(pipe) is not None
    assert pipe.ckpred_applicability_threshold_ in list(cfg.applicability.thresholds)
    full, coverage = with_unmeasured(table, op, cfg)
    assert coverage.unmeasured == 2 * len(table)  # 9 solvers, 3 listed per problem
    applies = predicted_applicable(pipe, op.encode_frame(full))
    # the solvers of the problem's direction apply, the others' do not (every training pair right)
    assert (applies == full["measured"].to_numpy()).all()


def _forced_fallbacks(pipe, op, problems: pd.DataFrame):  # type: ignore[no-untyped-def]
    """``pipe`` with a threshold between the problems' smallest estimates of absence: the mask
    leaves some problems without a kernel (they fall back) and others with one."""
    from ckpred.models import absent_estimate, set_applicability_model

    cat = op.catalogue("", "", "")  # a bound catalogue: the same for every arch, dtype and layout
    rows = problems.loc[problems.index.repeat(len(cat))].reset_index(drop=True)
    kernels = cat.iloc[np.tile(np.arange(len(cat)), len(problems))].reset_index(drop=True)
    X = op.encode_frame(pd.concat([rows, kernels[list(op.kernel_names)]], axis=1))
    lowest = absent_estimate(pipe, X).reshape(len(problems), len(cat)).min(axis=1)
    threshold = float(np.median(lowest))
    assert (lowest > threshold).any() and (lowest <= threshold).any()
    set_applicability_model(pipe, pipe.ckpred_applicability_model_, threshold)
    return lowest > threshold


@pytest.fixture(scope="module")
def sparse_export(sparse_fit, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import copy

    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline

    op, cfg, table, pipe = sparse_fit
    pipe = copy.deepcopy(pipe)
    problems = table[list(op.problem_names)].drop_duplicates().reset_index(drop=True)
    # unseen problems too: other channel counts and batch sizes
    problems = pd.concat([problems, problems.head(12).assign(c=lambda f: f["c"] * 3, n=7)], ignore_index=True)
    expect_fallback = _forced_fallbacks(pipe, op, problems)
    d = tmp_path_factory.mktemp("export") / "miopen_conv_gfx942_fp16_rcr"
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout),
                          options=ExportOptions(parity_problems=problems))
    return d, man, problems, expect_fallback


def test_export_compiles_the_mask_and_its_fallback_with_parity(sparse_export) -> None:  # type: ignore[no-untyped-def]
    from ckpred.runtime import KernelSelector

    d, man, problems, expect_fallback = sparse_export
    # the parity check (which raises on any difference, fallback flag included) ran on every problem
    assert man["parity"]["top1_agreement"] == 1.0 and man["parity"]["topk_agreement"] == 1.0
    assert man["parity"]["applicability_fallbacks"] == int(expect_fallback.sum())
    assert man["applicability_model"]["threshold"] > 0 and man["applicability_model"]["n_trees"] == 30
    assert [o["name"] for o in man["graphs"]["selector"]["outputs"]][-1] == "applicability_fallback"
    sel = KernelSelector.load(d, cache_size=0)
    answers = sel.select_many(problems, top_k=9)
    assert [a.applicability_fallback for a in answers] == expect_fallback.tolist()
    for a, fell in zip(answers, expect_fallback):
        assert a.ok and a.to_dict()["applicability_fallback"] == fell
        # a fallback ranks every rule-valid solver (none known to apply); otherwise only those
        # predicted to apply: the three of the problem's direction
        assert a.num_valid == (9 if fell else 3)


def _cpp_and_python(binary: Path, export_dir: Path, problems: pd.DataFrame, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Per problem, the C++ selector's answer (top 4, a JSON line) and the Python runtime's."""
    from ckpred.runtime import KernelSelector

    records = problems.to_dict("records")
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("\n".join(",".join(f"{k}={v}" for k, v in r.items()) for r in records) + "\n")
    out = _run(binary, export_dir, "--top-k", 4, "--shapes", shape_file)
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(got) == len(records)
    sel = KernelSelector.load(export_dir, cache_size=0)
    return [(g, sel.select(record, top_k=4)) for g, record in zip(got, records)]


def test_cpp_reports_the_fallback_like_python(sparse_export, binary, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d, _, problems, expect_fallback = sparse_export
    for (g, want), fell in zip(_cpp_and_python(binary, d, problems, tmp_path), expect_fallback):
        assert g["applicability_fallback"] == want.applicability_fallback == bool(fell)
        assert g["num_valid"] == want.num_valid and [k["id"] for k in g["kernels"]] == list(want.ids)
        assert [k["score"] for k in g["kernels"]] == list(want.scores)  # bit-identical doubles


@pytest.fixture(scope="module")
def transfer_export(sparse_fit, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``sparse_fit``'s pipeline as a zero-shot transfer recipe's learner (w = 0) whose
    applicability model is unsure (estimates spread over [0, 1], as on a GPU the mask was not
    learned on), exported with parity checked on every problem."""
    import copy

    import lightgbm as lgb

    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline
    from ckpred.models import set_applicability_model
    from ckpred.transfer import TransferModel, transfer_method

    op, cfg, table, pipe = sparse_fit
    pipe = copy.deepcopy(pipe)
    full, _ = with_unmeasured(table, op, cfg)
    Xt = pipe.named_steps["features"].transform(op.encode_frame(full))
    # the faster a pair was measured, the more the mask doubts it applies
    speed = full["tflops"].rank(pct=True).to_numpy()
    unsure = np.clip(np.where(full["measured"], speed, 1.0) * 0.99, 0.0, 0.99)
    model = lgb.LGBMRegressor(n_estimators=20, num_leaves=15, min_child_samples=2, verbose=-1).fit(Xt, unsure)
    set_applicability_model(pipe, model, 0.995)
    recipe = TransferModel(learner=pipe, static=pd.Series(dtype=np.float64), static_by=(), weight=0.0,
                           method=transfer_method(cfg), arch=cfg.arch, archs=("gfx90a_mi210",))
    problems = table[list(op.problem_names)].drop_duplicates().reset_index(drop=True)
    d = tmp_path_factory.mktemp("transfer_export") / "miopen_conv_gfx942_fp16_rcr"
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                          training=mf.training_section(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout),
                          options=ExportOptions(parity_problems=problems, transfer=recipe))
    return d, man, problems, op, pipe


def test_the_transfer_selector_ranks_by_expected_throughput(transfer_export) -> None:  # type: ignore[no-untyped-def]
    """Under an applicability mask the recipe's learner scores a kernel by its predicted
    throughput times the chance it applies, in Python and in the exported selector alike; a fast
    kernel the mask doubts loses to a surely listed one."""
    from ckpred.models import absent_estimate, predicted_applicable
    from ckpred.runtime import KernelSelector
    from ckpred.models import FLOOR, expected_throughput
    from ckpred.transfer import learner_predict

    np.testing.assert_array_equal(expected_throughput(np.array([2.0, 2.0, -1.0, 3.0]), np.array([0.5, -0.2, 0.0, 1.5])),
                                  [1.0, 2.0, FLOOR, 3.0 * FLOOR])
    d, man, problems, op, pipe = transfer_export
    # parity (which raises on any difference) compared the selector with learner_predict on every problem
    assert man["parity"]["top1_agreement"] == 1.0 and man["parity"]["topk_agreement"] == 1.0
    assert man["transfer"]["model_scores"].startswith("expected throughput") and man["transfer"]["floor"] == FLOOR
    cat = op.catalogue("", "", "")
    rows = problems.loc[problems.index.repeat(len(cat))].reset_index(drop=True)
    kernels = cat.iloc[np.tile(np.arange(len(cat)), len(problems))].reset_index(drop=True)
    X = op.encode_frame(pd.concat([rows, kernels[list(op.kernel_names)]], axis=1))
    shape = (len(problems), len(cat))
    expected = learner_predict(pipe, X).reshape(shape)
    raw = np.asarray(pipe.predict(X), dtype=np.float64).reshape(shape)
    np.testing.assert_allclose(expected, expected_throughput(raw, absent_estimate(pipe, X).reshape(shape)))
    applies = predicted_applicable(pipe, X).reshape(shape)
    sel = KernelSelector.load(d, cache_size=0)
    reordered = 0
    for j, answer in enumerate(sel.select_many(problems, top_k=len(cat))):
        ids = np.asarray(answer.ids)
        assert set(ids) == set(np.flatnonzero(applies[j])) or answer.applicability_fallback
        np.testing.assert_allclose(answer.scores, expected[j, ids], rtol=1e-12)
        reordered += int(ids[0] != ids[np.argmax(raw[j, ids])])
    assert reordered > 0  # the estimates moved some problem's pick off the fastest predicted kernel


def test_cpp_ranks_the_transfer_selector_like_python(transfer_export, binary, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d, _, problems, _, _ = transfer_export
    for g, want in _cpp_and_python(binary, d, problems, tmp_path):
        assert [k["id"] for k in g["kernels"]] == list(want.ids)
        assert [k["score"] for k in g["kernels"]] == list(want.scores)  # bit-identical doubles


def test_candidates_prepare_the_whole_candidate_set_on_the_same_shapes() -> None:
    from ckpred.fitting import candidates, prepare

    table = tiny_table([(4, 4, 3.0), (4, 1, 2.0), (1, 1, 5.0), (8, 2, 7.0)])
    op = _bound(tiny_op(), table)
    cfg = SimpleNamespace(arch="gfx942", dtype=SimpleNamespace(name="fp16"), layout=SimpleNamespace(name="rcr"))
    data = prepare(table, op, cfg)
    cand, coverage = candidates(data, op, cfg)
    assert coverage.unmeasured == 3 and len(cand.table) == 7 and "_shape" not in cand.table
    # what prepare() makes of the same rows, without recomputing keys: same shapes, same indices
    again = prepare(with_unmeasured(table, op, cfg)[0], op, cfg)
    assert list(cand.groups.keys) == list(data.groups.keys) == list(again.groups.keys)
    assert cand.groups.codes.tolist() == again.groups.codes.tolist() == [0, 0, 0, 1, 2, 2, 2]
    assert cand.groups.bounds.tolist() == again.groups.bounds.tolist()
    assert cand.selectable.tolist() == again.selectable.tolist()
    assert cand.perf.tolist() == again.perf.tolist() and cand.measured.tolist() == again.measured.tolist()
    pd.testing.assert_frame_equal(cand.X, again.X)
    assert cand.shapes is data.shapes
    # a full table is its own candidate set
    full = tiny_table([(4, 1, 1.0), (4, 2, 2.0), (8, 1, 1.0), (8, 2, 3.0)])
    op = _bound(tiny_op(), full)
    data = prepare(full, op, cfg)
    assert candidates(data, op, cfg)[0] is data


def test_the_candidates_of_a_table_of_several_gpus_are_each_gpus_own() -> None:
    """On a table of several GPUs a problem's added candidates pass its own GPU's rules (a tile
    that fits gfx950's 160 KiB of shared memory and not gfx942's 64 KiB is a candidate on the
    one only), and every candidate row keeps its GPU: features and rules use its constants."""
    from ckpred.config import compose
    from ckpred.fitting import candidates, prepare

    op = tiny_op(rules=[{"expr": "t <= m", "message": "tile larger than the problem"},
                        {"expr": "t * 1024 <= hw.shared_memory_bytes", "message": "tile over shared memory"}],
                 absence="not_applicable")
    rows = [(200, 1, 1.0), (200, 64, 2.0), (300, 1, 1.0), (400, 1, 1.0), (400, 128, 3.0), (500, 64, 2.0)]
    table = tiny_table(rows)
    table["arch"] = ["gfx942", "gfx942", "gfx942", "gfx950", "gfx950", "gfx950"]
    table = table.iloc[[3, 0, 4, 1, 2, 5]].reset_index(drop=True)  # the GPUs' rows interleaved
    op = _bound(op, table)
    cfg = compose("train", ["arch=gfx942", "dtype=fp16"])
    data = prepare(table, op, cfg)
    assert data.multi_arch
    cand, coverage = candidates(data, op, cfg)
    got = {(int(m), str(k)) for m, k in zip(cand.table["m"], cand.table["kernel_name"])}
    assert got == {(200, "t1"), (200, "t64"), (300, "t1"), (300, "t64"),
                   (400, "t1"), (400, "t64"), (400, "t128"), (500, "t1"), (500, "t64"), (500, "t128")}
    assert coverage.unmeasured == 4 and coverage.problems == 4
    assert cand.multi_arch and [str(a.name) for a in cand.archs] == [str(a.name) for a in data.archs]
    gpu = np.array([str(cand.archs[i].name) for i in cand.row_arch])
    assert (gpu == cand.table["arch"].astype(str).to_numpy()).all()
    assert (gpu == np.where(cand.table["m"].to_numpy() < 400, "gfx942", "gfx950")).all()
    # the same shapes, each problem's rows together, measured rows with their perf
    assert (np.diff(cand.groups.codes) >= 0).all() and cand.groups.n_shapes == data.groups.n_shapes
    assert list(cand.groups.keys) == list(data.groups.keys)
    for s in range(data.groups.n_shapes):
        theirs = cand.table.iloc[cand.groups.rows(s)]
        assert set(theirs["m"]) == set(data.table.iloc[data.groups.rows(s)]["m"])
    assert cand.measured.sum() == len(table) and np.isclose(cand.perf[cand.measured].sum(), data.perf.sum())


def test_the_mask_and_its_threshold_never_see_the_problems_they_are_scored_on(sparse_fit) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from ckpred.fitting import candidates, fit_applicability, fit_method, model_method, prepare, rows_of

    op, cfg, table, _ = sparse_fit
    data = prepare(table, op, cfg)
    cand, _ = candidates(data, op, cfg)
    groups = np.unique(data.cv_groups)
    train = np.flatnonzero(np.isin(data.cv_groups, groups[: len(groups) * 2 // 3]))
    test = np.setdiff1d(np.arange(data.groups.n_shapes), train)
    pipe, _ = fit_method(model_method(cfg), data, train, op, cfg, 0)
    first = fit_applicability(cand, train, data, op, cfg, 0, pipe)
    # the held-out problems made unrecognisable: measurements shuffled, other solvers "measured"
    rng = np.random.default_rng(1)
    rows, crows = rows_of(data.groups, test), rows_of(cand.groups, test)
    perf, cperf = data.perf.copy(), cand.perf.copy()
    perf[rows], cperf[crows] = rng.permutation(perf[rows]), rng.permutation(cperf[crows])
    flipped = cand.table.copy()
    flipped.loc[crows, "measured"] = ~flipped.loc[crows, "measured"].to_numpy(bool)
    second = fit_applicability(dataclasses.replace(cand, perf=cperf, table=flipped), train,
                               dataclasses.replace(data, perf=perf), op, cfg, 0, pipe)
    assert first.threshold == second.threshold
    pd.testing.assert_frame_equal(first.curve, second.curve)
    X = cand.X.iloc[crows]
    assert (first.applicable(pipe, X) == second.applicable(pipe, X)).all()
    assert first.train_pairs == len(rows_of(cand.groups, train))


def test_a_transfer_run_chooses_the_threshold_on_its_learners_expected_throughput(sparse_fit, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The mask's threshold is chosen on inner folds scored as the method it narrows ranks: the
    transfer recipe's inner folds fit its learner (plain LightGBM, not the model recipe) and score
    each pair by expected throughput; the model recipe's score by its own predictions."""
    from ckpred import fitting
    from ckpred.models import expected_throughput
    from ckpred.transfer import transfer_method

    op, cfg, table, _ = sparse_fit
    data = fitting.prepare(table, op, cfg)
    cand, _ = fitting.candidates(data, op, cfg)
    shapes = np.arange(data.groups.n_shapes)
    fitted, predicted, curves = [], [], []
    real_fit, real_predict, real_curve = fitting.fit_method, fitting.predict, fitting.ev.threshold_curve

    def fit_method(method, *args, **kwargs):  # type: ignore[no-untyped-def]
        fitted.append(method)
        return real_fit(method, *args, **kwargs)

    def predict(pipe, X, *args):  # type: ignore[no-untyped-def]
        predicted.append(real_predict(pipe, X, *args))
        return predicted[-1]

    def threshold_curve(perf, scores, groups, selectable, measured, estimate, *args, **kwargs):  # type: ignore[no-untyped-def]
        curves.append((scores, estimate))
        return real_curve(perf, scores, groups, selectable, measured, estimate, *args, **kwargs)

    monkeypatch.setattr(fitting, "fit_method", fit_method)
    monkeypatch.setattr(fitting, "predict", predict)
    monkeypatch.setattr(fitting.ev, "threshold_curve", threshold_curve)
    for method, expected in ((transfer_method(cfg), True), (fitting.model_method(cfg), False)):
        fitted.clear(), predicted.clear(), curves.clear()
        pipe, _ = real_fit(fitting.learner_method(method), data, shapes, op, cfg, 0)
        mask = fitting.fit_applicability(cand, shapes, data, op, cfg, 0, pipe, method)
        assert len(fitted) == int(cfg.applicability.inner_folds) and len(curves) == 1
        assert all(m.transfer is None and m.recipe == method.recipe for m in fitted)
        scores, estimate = curves[0]
        raw = np.concatenate(predicted)
        np.testing.assert_array_equal(scores, expected_throughput(raw, estimate) if expected else raw)
        assert (scores != raw).any() == expected
        assert mask.inner_scores.startswith("the transfer recipe's learner" if expected else "the model recipe")
    assert transfer_method(cfg).recipe.model != fitting.model_method(cfg).recipe.model  # plain, not the ranker


# -- cross-validation ranks what the export ships --------------------------------------------------
def _pruned_find_db(path):  # type: ignore[no-untyped-def]
    from tests.test_yaml_ops_train import write_find_db

    fdb = write_find_db(path, n_convs=36)
    lines = fdb.read_text().splitlines()
    fdb.write_text("\n".join(line for i, line in enumerate(lines)
                             if not (line.split("=")[0].endswith("-W") and (i // 6) % 2)
                             and not (line.split("=")[0].endswith("-B") and (i // 6) % 3 == 2)) + "\n")
    return fdb


def _cv(tmp_path, fdb, *extra: str):  # type: ignore[no-untyped-def]
    from ckpred.config import compose
    from ckpred.cv.driver import cross_validate
    from tests.test_yaml_ops_train import OPS_DIR

    out = tmp_path / "run"
    out.mkdir()
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx942", "data=path",
                            f"data.path={fdb}", f"out_dir={out}", "model.n_estimators=20", "model.n_jobs=1",
                            "baselines.plain.model.n_estimators=10", "applicability.n_estimators=30",
                            "plots=false", "progress=false", "cv.n_splits=3", *extra])
    cross_validate(cfg, out)
    return (json.loads((out / "metrics.json").read_text()), json.loads((out / "run.json").read_text()),
            pd.read_parquet(out / "oof_predictions.parquet"), json.loads((out / "folds.json").read_text()))


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A train run of the pruned find-db with op.absence=not_applicable (and what it printed)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("sparse_run")
    fdb = _pruned_find_db(tmp / "small.fdb.txt")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        got = _cv(tmp, fdb)
    return (tmp, fdb, printed.getvalue(), *got)


@pytest.mark.slow
def test_cv_ranks_every_candidate_and_the_mask_keeps_picks_measured(sparse_run) -> None:  # type: ignore[no-untyped-def]
    _, _, printed, metrics, record, oof, folds = sparse_run
    assert "taken as not applicable; the selector learns an applicability mask" in printed
    # every problem is ranked over the 9 solvers of the catalogue, 6 of them unmeasured
    assert record["candidates"]["absence"] == "not_applicable"
    assert record["candidates"]["unmeasured"] == 6 * record["data"]["shapes"] == 6 * 156
    assert len(oof) == 9 * record["data"]["shapes"] and (~oof["measured"]).sum() == record["candidates"]["unmeasured"]
    # the mask leaves only the solvers that apply (the problem's direction's) selectable
    assert (oof["selectable"] == oof["measured"]).all()
    for name in ("model", "plain", "best_static"):
        assert metrics[name]["unmeasured_pick"] == 0.0 and metrics[name]["unmeasured_picks"] == 0.0
    assert metrics["random"]["unmeasured_pick"] == 0.0  # it draws among what the mask keeps
    assert all("applicability" in f and f["applicability"]["fell_back"] == 0 for f in folds["folds"])
    assert all(f["applicability"]["fit_predict_s"] >= 0 for f in folds["folds"])
    assert record["timings_s"]["applicability_s"] > 0  # the mask's cost beside the model's
    assert record["pipeline"]["applicability_threshold"] in (0.1, 0.3, 0.5, 0.7, 0.9)


@pytest.mark.slow
def test_export_and_replay_of_a_sparse_run(sparse_run, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ckpred import replay as rp
    from ckpred.autotune import FixedK
    from ckpred.commands.export import export_command
    from ckpred.config import compose
    from ckpred.runtime import KernelSelector
    from tests.test_yaml_ops_train import OPS_DIR

    run_tmp, fdb, _, metrics, *_ = sparse_run
    monkeypatch.chdir(tmp_path)
    # the default strategy (reranked): its CV report relearns candidates and reranker per fold on
    # the run's out-of-fold rows, unmeasured candidates included
    out = export_command(compose("export", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx942",
                                            "data=path", f"data.path={fdb}", f"run_dir={run_tmp / 'run'}",
                                            "out_dir=ex", "parity.shapes=40"]))
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    assert manifest["applicability_model"] is not None and manifest["parity"]["top1_agreement"] == 1.0
    assert manifest["selection"]["cv"]["full"]["mean"] == pytest.approx(metrics["model"]["mean"])
    assert manifest["selection"]["cv"]["reranked"]["mean"] > metrics["random"]["mean"]
    sel = KernelSelector.load(out)
    answer = sel.select(n=4, c=64, hi=14, wi=14, k=128, ho=14, wo=14, y=1, x=1, pad_h=0, pad_w=0, stride_h=1,
                        stride_w=1, dilation_h=1, dilation_w=1, groups=1, bias=0, layout="NCHW", dtype="FP16",
                        direction="W", top_k=9)
    assert answer.applicability_fallback is False and answer.num_valid == 3
    assert set(answer.kernels) == {"ConvAsmImplicitGemmGTCDynamicWrwXdlopsNHWC", "GemmWrw1x1_stride1",
                                   "GemmWrwUniversal"}
    # the autotune replay benchmarks what the selector ranks: here only measured solvers
    data = rp.load_run(run_tmp / "run")
    assert len(data.frame) == 9 * 156
    table = rp.replay(data, FixedK(9))
    assert (table["benchmarks"] == 3).all() and (table["efficiency"] == 1.0).all()


def test_without_the_declaration_the_same_table_shows_its_unmeasured_picks(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    fdb = _pruned_find_db(tmp_path / "small.fdb.txt")
    metrics, record, oof, _ = _cv(tmp_path, fdb, "op.absence=unknown")
    out = capsys.readouterr().out
    assert "have no row; the exported selector ranks them too" in out and "op.absence: not_applicable" in out
    assert record["candidates"]["absence"] == "unknown"
    assert oof["selectable"].all()  # nothing but the (absent) rules masks a candidate
    # a ranker that never saw a solver on a direction scores it blindly: some picks have no row
    assert metrics["model"]["unmeasured_pick"] > 0
    assert metrics["random"]["unmeasured_pick"] == pytest.approx(2 / 3)  # 6 of the 9 candidates
    # strict: such a pick scores 0, the fallback (next-ranked measured kernel) recovers
    assert metrics["model"]["mean"] < metrics["model"]["fallback_efficiency"]


# -- bad input, as a user meets it on the command line ---------------------------------------------
def _train_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
               *argv: str) -> tuple[int, str, str]:
    """``python -m ckpred train <argv>`` in-process, from ``tmp_path``: (exit status, stdout, stderr)."""
    from tests.test_hostile import run

    monkeypatch.chdir(tmp_path)  # Hydra's run folder lands here
    return run(["train", "model.n_estimators=5", "model.n_jobs=1", "plots=false", "progress=false",
                "save_pipeline=false", "applicability.n_estimators=20", *argv], capsys)


@pytest.mark.slow
def test_train_refuses_not_applicable_on_a_full_table(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_hostile import assert_named

    rc, _, err = _train_cli(tmp_path, capsys, monkeypatch, "shapes=tiny", "rows.max_per_shape=32",
                            "baselines.reference.enabled=false", "op.absence=not_applicable",
                            f"out_dir={tmp_path / 'run'}")
    assert_named(rc, err, "train", "op.absence", "'not_applicable'", "'unknown' for this table",
                 "measures every rule-valid catalogue kernel on each of its")
    assert not (tmp_path / "run").exists()  # the refused run leaves no output folder


def _find_db_lines(path: Path, keep: Any) -> Path:
    """The small find-db with each problem's line cut to the solvers ``keep(i)`` says (line i)."""
    from tests.test_yaml_ops_train import write_find_db

    fdb = write_find_db(path, n_convs=12)
    lines = []
    for i, line in enumerate(fdb.read_text().splitlines()):
        key, entries = line.split("=")
        lines.append(f"{key}={';'.join(entries.split(';')[:keep(i)])}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_refuses_a_table_of_one_kernel_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_hostile import assert_named
    from tests.test_yaml_ops_train import OPS_DIR

    fdb = _find_db_lines(tmp_path / "winners.fdb.txt", lambda i: 1)
    rc, _, err = _train_cli(tmp_path, capsys, monkeypatch, f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv",
                            "arch=gfx942", "data=path", f"data.path={fdb}", f"out_dir={tmp_path / 'run'}")
    assert_named(rc, err, "train", "op.absence", "each of its 72 problems has a single row (a table of winners?)")


@pytest.mark.slow
def test_train_names_the_problems_with_one_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_yaml_ops_train import OPS_DIR

    # every fourth problem lists one solver, the others three
    fdb = _find_db_lines(tmp_path / "some.fdb.txt", lambda i: 1 if i % 4 == 0 else 3)
    rc, out, err = _train_cli(tmp_path, capsys, monkeypatch, f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv",
                              "arch=gfx942", "data=path", f"data.path={fdb}", "cv.n_splits=3",
                              "baselines.plain.model.n_estimators=5", f"out_dir={tmp_path / 'run'}")
    assert rc == 0, err
    assert "18 of 72 problems have a single row (e.g. " in out
    assert "their one kernel is the only one taken to apply, and they teach the ranker nothing" in out


@pytest.mark.slow
def test_a_zero_shot_run_of_a_sparse_op_masks_the_new_gpus_candidates(tmp_path, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    """``cv=external`` onto another arch of an ``absence: not_applicable`` op: the model is the
    transfer recipe, its learner carries the applicability mask learned on the training GPU, the
    folds rank the new GPU's whole candidate set, and the export of the run for that GPU holds
    the mask and meets parity."""
    from ckpred.commands.export import export_command
    from ckpred.config import compose
    from ckpred.cv.driver import cross_validate
    from ckpred.models import FLOOR
    from tests.test_yaml_ops_train import OPS_DIR

    monkeypatch.chdir(tmp_path)
    train_db = _pruned_find_db(tmp_path / "gfx942.fdb.txt")
    test_db = _pruned_find_db(tmp_path / "other.fdb.txt")
    test_db.write_text(test_db.read_text().replace("-FP16-", "-FP32-", 3))  # another GPU's timings
    run = tmp_path / "run"
    run.mkdir()
    cross_validate(compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx942", "dtype=fp16",
                                     "data=path", f"data.path={train_db}", f"out_dir={run}", "model.n_estimators=20",
                                     "model.n_jobs=1", "baselines.plain.model.n_estimators=10",
                                     "applicability.n_estimators=30", "plots=false", "progress=false", "cv=external",
                                     "cv.data.source=path", f"cv.data.path={test_db}", "+arch@cv.arch=gfx90a_mi210"]),
                   run)
    assert "zero-shot onto gfx90a_mi210 with no kernel list (arch.kernel_lists.miopen_conv)" in capsys.readouterr().out
    metrics, record, folds = (json.loads((run / name).read_text()) for name in ("metrics.json", "run.json",
                                                                                "folds.json"))
    assert record["model"] == "transfer" and record["zero_shot"] is True
    assert folds["folds"][0]["applicability"]["inner_scores"] == "the transfer recipe's learner, expected throughput"
    assert record["candidates"]["absence"] == "not_applicable"
    assert folds["folds"][0]["applicability"]["threshold"] is not None
    assert 0.0 <= metrics["model"]["unmeasured_pick"] <= 0.5
    # the recipe's learner is plain's fit (w = 0): its scores are plain's predictions weighed by the
    # chance each solver applies on the new GPU, never above them
    oof = pd.read_parquet(run / "oof_predictions.parquet")
    scored = oof[np.isfinite(oof["score_model"]) & np.isfinite(oof["score_plain"])]
    assert len(scored) and (scored["score_model"] <= np.maximum(scored["score_plain"], FLOOR) * (1 + 1e-12)).all()
    assert (scored["score_model"] < scored["score_plain"]).any()
    out = export_command(compose("export", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv",
                                            "arch=gfx90a_mi210", "dtype=fp16", "data=path", f"data.path={train_db}",
                                            f"run_dir={tmp_path / 'run'}", "out_dir=ex", "parity.shapes=40"]))
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    assert manifest["arch"] == "gfx90a_mi210" and manifest["applicability_model"] is not None
    assert manifest["parity"]["top1_agreement"] == 1.0
    assert manifest["transfer"]["model_scores"].startswith("expected throughput")
