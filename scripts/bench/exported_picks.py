"""What an exported selector picks on every problem of a table: how often a kernel the table has
no row for (an unmeasured pick), and the efficiency of its picks.

    python scripts/bench/exported_picks.py exports/miopen_conv_gfx942_fp16_rcr --config-dir tests/ops \\
        op=miopen_conv arch=gfx942 dtype=fp16 data=path \\
        data.path=../shared/data/miopen_find_db/gfx942130.HIP.fdb.txt.bz2

The selector is run through the Python runtime (the same graph the C++ selector runs) on every
problem of the table the overrides load (the training table: the problems the issue's example
counted; pass another table's overrides for unseen problems). Per problem: the top-1 kernel,
whether the table has a row for it, its efficiency (its perf / the problem's best; 0 without a
row or when it failed) and whether the applicability mask fell back. Printed: the unmeasured-pick
rate, mean and P10 efficiency, and the fallbacks, overall and by the first breakdown key.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from ckpred.config import compose
from ckpred.data import load_table
from ckpred.evaluate import measured_perf
from ckpred.kernels.base import load_op
from ckpred.runtime import KernelSelector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="the export directory")
    parser.add_argument("--config-dir", default=None, help="a user config dir (as ckpred's --config-dir)")
    parser.add_argument("overrides", nargs="*", help="train overrides that load the table")
    args = parser.parse_intermixed_args()
    cfg = compose("train", list(args.overrides), config_dir=args.config_dir)
    op = load_op(cfg.op)
    table = load_table(cfg)
    sel = KernelSelector.load(args.export, cache_size=0)
    keys = np.asarray(op.shape_keys(table))
    table = table.assign(_key=keys, _perf=measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy()))
    best = table.groupby("_key", sort=False)["_perf"].max()
    perf_of = table.set_index(["_key", "kernel_name"])["_perf"]
    problems = table.drop_duplicates("_key")
    t = time.perf_counter()
    answers = sel.select_many(problems[list(op.problem_names)], top_k=1, batch=256)
    seconds = time.perf_counter() - t
    rows = []
    for key, answer in zip(problems["_key"], answers):
        pick = answer.kernels[0] if answer.ok else ""
        measured = (key, pick) in perf_of.index
        eff = float(perf_of.loc[(key, pick)]) / best[key] if measured and best[key] > 0 else 0.0
        rows.append((key, pick, measured, eff, bool(answer.applicability_fallback)))
    out = pd.DataFrame(rows, columns=["key", "pick", "measured", "efficiency", "fallback"])
    out = out[best.reindex(out["key"]).to_numpy() > 0]
    by = op.breakdowns[0] if getattr(op, "breakdowns", ()) else None

    def line(frame: pd.DataFrame, label: str) -> str:
        eff = frame["efficiency"].to_numpy()
        return (f"{label}: {len(frame)} problems, unmeasured picks {int((~frame['measured']).sum())} "
                f"({(~frame['measured']).mean():.3%}), efficiency mean {eff.mean():.4f} P10 {np.percentile(eff, 10):.4f}, "
                f"mask fallbacks {int(frame['fallback'].sum())}")

    print(f"{args.export}: {len(answers)} problems selected in {seconds:.1f}s")
    print(line(out, "all"))
    if by:
        labels = problems.set_index("_key")[by].astype(str).reindex(out["key"]).to_numpy()
        for value in pd.unique(labels):
            print(line(out[labels == value], f"{by}={value}"))


if __name__ == "__main__":
    main()
