"""Sparse tables: the candidate set the exported selector ranks, and what absence means."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import ConfigValueError
from ckpred.fitting import NOT_MEASURED, Coverage, coverage_note, with_unmeasured
from ckpred.kernels.declared import load_declared

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
