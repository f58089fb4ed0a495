"""Rescore a run's out-of-fold picks as if the selector knew which kernels the test GPU has.

    python scripts/research/known_kernel_list.py <run>/seed0 [<run>/seed1 ...] [--measured plan.csv ...]

On a new GPU, a selector trained on another ranks every catalogue kernel its rules and the
applicability mask learned on the training GPU keep; a kernel the new GPU does not have at all
(a solver its library build never lists) is an unmeasured pick scored 0. This script reads a
run's ``oof_predictions.parquet`` and prints, per method, the strict mean and P10 efficiency and
the unmeasured-pick rate as the run scored them, then with the candidates narrowed to the kernels
the test table measures on at least one problem (it uses the test table's kernel names, nothing
else of it). It rescores the run's scores under the run's masks; declaring the list in the new
GPU's arch config (``arch.kernel_lists``, docs/ops.md "Hardware") makes the run itself rank the
listed kernels only, the applicability mask's fallback included, which is what an export ships.

With ``--measured``, the problems of those plan files (the new GPU's measured problems a run
was retrained on) are left out: the figures are those of the problems never measured.

The last figures (``listed per problem``) rank, for each problem, only the kernels the test table
lists for it, with no applicability mask: a perfect mask. Their distance to the strict figures is
what the run's mask costs on the new GPU (masking the best listed kernel, letting an unlisted one
through).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ckpred import evaluate as ev
from ckpred.kernels.base import load_op
from ckpred.schema import saved_recipe


def scored(oof: pd.DataFrame, column: str, keep: np.ndarray, masked: bool = True) -> tuple[float, float, float, float]:
    """Strict mean, P10, unmeasured-pick rate and fallback efficiency of ``column``'s top-1 among
    ``keep`` rows (and, with ``masked``, those the run's rules and mask keep)."""
    groups = ev.ShapeGroups.from_keys(oof["shape"])
    per_shape = ev.shape_metrics(oof["perf"].to_numpy(), oof[column].to_numpy(), groups,
                                 selectable=(oof["selectable"].to_numpy() if masked else True) & keep,
                                 measured=oof["measured"].to_numpy())
    summary = ev.summarize(per_shape)
    return summary["mean"], summary["p10"], summary["unmeasured_pick"], summary["fallback_efficiency"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="seed folders holding oof_predictions.parquet")
    parser.add_argument("--measured", nargs="*", type=Path, default=[],
                        help="plan files (CSV or Parquet) whose problems are left out")
    args = parser.parse_args()
    for run in args.runs:
        oof = pd.read_parquet(run / "oof_predictions.parquet")
        if args.measured:
            op = load_op(saved_recipe(json.loads((run / "run.json").read_text())["config"]).op)
            done = pd.concat([pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f, keep_default_na=False)
                              for f in args.measured])
            oof = oof[~oof["shape"].isin(set(op.shape_keys(done)))].reset_index(drop=True)
        listed = oof["kernel_name"].isin(set(oof.loc[oof["measured"], "kernel_name"])).to_numpy()
        print(f"{run}: {oof['shape'].nunique():,} problems, {oof.loc[listed, 'kernel_name'].nunique()} of "
              f"{oof['kernel_name'].nunique()} candidate kernels measured on the test GPU")
        for column in [c for c in oof.columns if c.startswith("score_")]:
            everything = scored(oof, column, np.ones(len(oof), dtype=bool))
            narrowed = scored(oof, column, listed)
            # a scored row is a candidate the rules keep (the others have no score)
            perfect = scored(oof, column, oof["measured"].to_numpy() & np.isfinite(oof[column].to_numpy()), masked=False)
            print(f"  {column[len('score_'):]:<12} as scored: mean {everything[0]:.4f} P10 {everything[1]:.3f} "
                  f"unmeasured {everything[2]:.3f} fallback {everything[3]:.4f} | its kernels only: mean {narrowed[0]:.4f} "
                  f"P10 {narrowed[1]:.3f} unmeasured {narrowed[2]:.3f} | listed per problem: mean {perfect[0]:.4f} "
                  f"P10 {perfect[1]:.3f}")


if __name__ == "__main__":
    main()
