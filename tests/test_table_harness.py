"""scripts/bench/table_harness.py: the offline harness of a new GPU's loop answers a plan from a
table ingest wrote, only for the planned pairs, and refuses a pair it has no row of."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "bench" / "table_harness.py"


def _harness():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("table_harness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table() -> pd.DataFrame:
    """Two problems (one B, one F) and their listed solvers, as ingest writes them; one failed row."""
    return pd.DataFrame({"op": "miopen_conv", "arch": "gfx942", "n": [1, 1, 1, 2], "direction": ["B", "B", "F", "F"],
                         "solver": ["a", "b", "a", "c"], "kernel_name": ["a", "b", "a", "c"],
                         "tflops": [1.0, 2.0, 3.0, 0.0], "latency_ms": [0.5, 0.25, 0.125, np.nan],
                         "is_valid": [True, True, True, False], "invalid_reason": ["", "", "", "kernel failed"],
                         "repeats": 1, "spread": np.nan, "source": "f", "run_id": "f"})


def test_fill_answers_the_planned_pairs_only_and_a_failure_as_inf(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    _table().to_parquet(table)
    out = subprocess.run([sys.executable, str(SCRIPT), "problems", str(table), str(tmp_path / "p.csv")],
                         capture_output=True, text=True, check=True)
    assert "4 candidate pairs" in out.stdout
    problems = pd.read_csv(tmp_path / "p.csv")
    assert list(problems.columns) == ["n", "direction", "solver"] and len(problems) == 4
    # a plan of two pairs, in the plan's own column order, the metric column empty
    plan = pd.DataFrame({"n": [2, 1], "direction": ["F", "B"], "solver": ["c", "b"], "kernel_name": ["c", "b"],
                         "arch": "gfx942", "plan_rank": [1, 2], "plan_score": [0.5, 0.1], "time_ms": ""})
    plan.to_csv(tmp_path / "plan.csv", index=False)
    subprocess.run([sys.executable, str(SCRIPT), "fill", str(table), str(tmp_path / "plan.csv"),
                    str(tmp_path / "filled.csv")], capture_output=True, text=True, check=True)
    filled = pd.read_csv(tmp_path / "filled.csv")
    assert list(filled.columns) == list(plan.columns)
    assert filled["time_ms"].tolist() == [np.inf, 0.25]
    assert filled.drop(columns="time_ms").equals(pd.read_csv(tmp_path / "plan.csv").drop(columns="time_ms"))


def test_fill_refuses_a_pair_the_table_has_no_row_of() -> None:
    harness = _harness()
    plan = pd.DataFrame({"n": [3], "direction": ["F"], "solver": ["a"], "kernel_name": ["a"], "arch": "gfx942",
                         "plan_rank": [1], "plan_score": [0.0], "time_ms": [""]})
    with pytest.raises(SystemExit, match=r"1 planned pair\(s\) have no row in the table, e\.g\. \{'n': 3"):
        harness.fill(_table(), plan, "time_ms", "latency_ms")


def test_kernels_writes_the_kernel_names_the_table_has_rows_of(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    _table().to_parquet(table)
    out = subprocess.run([sys.executable, str(SCRIPT), "kernels", str(table), str(tmp_path / "k.txt")],
                         capture_output=True, text=True, check=True)
    assert "3 kernels" in out.stdout
    assert (tmp_path / "k.txt").read_text() == "a\nb\nc\n"  # a failed row is a row: the build has the kernel
