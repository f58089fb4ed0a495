"""A sparse table from the simulator: per problem, the kernels a tuner would prune are left out.

    python scripts/bench/sparse_simulated.py --out sparse_sim.parquet arch=gfx950 dtype=fp8
    python -m ckpred train arch=gfx950 dtype=fp8 data=path data.path=sparse_sim.parquet \\
        op.absence=not_applicable

The simulated table (``train``'s data for the given overrides) measures every catalogue kernel on
every problem. This script drops, per problem,

* the kernels a structured rule prunes: a block tile more than ``--factor`` times the problem's
  size padded to the smallest tile of the catalogue along that dimension (``tile_m > 2 *
  ceil(m / 64) * 64`` on the default catalogue, and the same for n and k), the rule a sweep that
  skips hopeless tiles on small problems applies;
* and a seeded ``--random`` share of the remaining kernels: ``--random-kind kernels`` drops the
  same share of catalogue kernels from every problem (kernels the tuner never built), ``pairs``
  drops each (problem, kernel) pair with that probability (gaps no feature can predict).

It prints how many rows each step removed and whether the fastest kernel of a problem was
among them, and writes the rest as a canonical parquet table (``ckpred.data.table.write_table``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ckpred.config import compose
from ckpred.data.simulate import simulated_table
from ckpred.data.table import write_table
from ckpred.evaluate import measured_perf
from ckpred.kernels.base import load_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the parquet table to write")
    parser.add_argument("--factor", type=float, default=2.0, help="prune tiles above factor x the padded problem")
    parser.add_argument("--random", type=float, default=0.05, help="share of the remaining kernels dropped at random")
    parser.add_argument("--random-kind", choices=("kernels", "pairs"), default="kernels",
                        help="kernels: the same kernels from every problem; pairs: each (problem, kernel) alone")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random drop")
    parser.add_argument("overrides", nargs="*", help="train overrides (arch, dtype, layout, shapes...)")
    args = parser.parse_args()
    cfg = compose("train", list(args.overrides))
    op = load_op(cfg.op)
    table = simulated_table(cfg).reset_index(drop=True)
    catalogue = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    pruned = np.zeros(len(table), dtype=bool)
    for dim, tile in (("m", "tile_m"), ("n", "tile_n"), ("k", "tile_k")):
        smallest = int(catalogue[tile].min())
        padded = np.ceil(table[dim].to_numpy(np.float64) / smallest) * smallest
        pruned |= table[tile].to_numpy(np.float64) > args.factor * padded
    rng = np.random.default_rng(args.seed)
    if args.random_kind == "kernels":
        names = catalogue["kernel_name"].to_numpy()
        gone = set(rng.choice(names, size=int(round(args.random * len(names))), replace=False).tolist())
        dropped = table["kernel_name"].isin(gone).to_numpy() & ~pruned
    else:
        dropped = (rng.random(len(table)) < args.random) & ~pruned
    perf = measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    keys = np.asarray(op.shape_keys(table))
    best = table.assign(perf=perf, key=keys).groupby("key", sort=False)["perf"].transform("max").to_numpy()
    is_best = (perf >= best) & (best > 0)
    kept = table[~(pruned | dropped)].reset_index(drop=True)
    problems = len(np.unique(keys))
    print(f"{len(table)} rows ({problems} problems x {len(catalogue)} kernels): {int(pruned.sum())} pruned by the rule "
          f"({pruned.mean():.1%}; the fastest kernel of {len(np.unique(keys[is_best & pruned]))} problems), "
          f"{int(dropped.sum())} dropped at random ({args.random_kind}; the fastest kernel of "
          f"{len(np.unique(keys[is_best & dropped]))} problems), {len(kept)} kept "
          f"({len(kept) / problems:.0f} per problem on average)")
    write_table(kept, Path(args.out), op)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
