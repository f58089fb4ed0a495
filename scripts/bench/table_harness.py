"""A benchmark harness that answers from a table ``ingest`` wrote: the new GPU's loop replayed
through the commands a user types, the table revealing only the planned rows.

    python scripts/bench/table_harness.py problems gfx90a.parquet gfx90a_problems.csv
    python -m ckpred plan run_dir=<run> arch=gfx90a_mi210 problems=gfx90a_problems.csv \\
        budget.problems=0.05 out=round1.csv
    python scripts/bench/table_harness.py fill gfx90a.parquet round1.csv round1_filled.csv
    python -m ckpred ingest ... data.path=round1_filled.csv ...   # the command plan printed
    python scripts/bench/table_harness.py kernels gfx942.parquet gfx942_kernels.txt

``problems`` writes what ``plan`` takes as the new GPU's problems: one row per (problem, kernel)
pair of the table (for a find-db, every solver MIOpen lists as applicable), the table's field
columns only. ``fill`` writes the plan with its metric column filled from the table's row of
each planned pair (``--metric``, from the table's canonical ``--from`` column; a failed row as
``inf``), every other column unchanged; a planned pair the table has no row of is refused.
``kernels`` writes the kernel names the table has a row of, one per line: a kernel list an arch
config reads (``arch.kernel_lists.<op>``; for a find-db, the solvers MIOpen ran on that GPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

#: Columns of an ingested table that are no problem or kernel field.
NOT_FIELDS = ("op", "arch", "kernel_name", "tflops", "latency_ms", "bandwidth_gbs", "is_valid", "invalid_reason",
              "repeats", "spread", "source", "run_id")
#: Columns of a plan file that are no problem or kernel field.
PLAN_COLUMNS = ("kernel_name", "arch", "plan_rank", "plan_score")


def fields(table: pd.DataFrame) -> list[str]:
    """The table's problem and kernel field columns."""
    return [c for c in table.columns if c not in NOT_FIELDS]


def fill(table: pd.DataFrame, plan: pd.DataFrame, metric: str, source: str) -> pd.DataFrame:
    """``plan`` with ``metric`` read from ``table``'s ``source`` column of each planned pair."""
    keys = [c for c in plan.columns if c not in (*PLAN_COLUMNS, metric)]
    missing = sorted(set(keys) - set(fields(table)))
    if missing:
        raise SystemExit(f"the plan's columns {missing} are no field of the table (fields: {fields(table)})")
    answers = table[keys].copy()
    answers["_value"] = np.where(table["is_valid"], table[source], np.inf)
    for c in keys:  # the CSV read ints as ints and strings as objects; match the table's types
        plan[c] = plan[c].astype(answers[c].dtype)
    filled = plan.drop(columns=[metric]).merge(answers, on=keys, how="left", validate="many_to_one")
    unknown = filled["_value"].isna()
    if unknown.any():
        raise SystemExit(f"{int(unknown.sum())} planned pair(s) have no row in the table, e.g. "
                         f"{filled.loc[unknown, keys].iloc[0].to_dict()}")
    return filled.rename(columns={"_value": metric})[list(plan.columns)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=("problems", "fill", "kernels"))
    parser.add_argument("table", type=Path, help="a table ingest wrote (Parquet)")
    parser.add_argument("files", nargs="+", type=Path, help="problems, kernels: OUT; fill: PLAN OUT")
    parser.add_argument("--metric", default="time_ms", help="fill: the plan's column to fill (op.metric.column)")
    parser.add_argument("--from", dest="source", default="latency_ms", help="fill: the table's column it comes from")
    args = parser.parse_args()
    table = pd.read_parquet(args.table)
    if args.job == "problems":
        table[fields(table)].to_csv(args.files[0], index=False)
        print(f"{len(table):,} candidate pairs -> {args.files[0]}")
        return
    if args.job == "kernels":
        names = sorted(table["kernel_name"].astype(str).unique())
        args.files[0].write_text("".join(f"{n}\n" for n in names))
        print(f"{len(names)} kernels -> {args.files[0]}")
        return
    plan_file, out = args.files
    filled = fill(table, pd.read_csv(plan_file, keep_default_na=False), args.metric, args.source)
    filled.to_csv(out, index=False)
    print(f"{len(filled):,} planned pairs filled ({int(np.isinf(filled[args.metric]).sum())} failed) -> {out}")


if __name__ == "__main__":
    main()
