"""Calibration report of the simulator against AMD's real gfx950 fp8/rcr oracle-best table.

    python scripts/research/calibrate_simulator.py [--per-shape out.csv] [hydra overrides, e.g. data.seed=1]

Same figures as ``python -m ckpred simulate calibrate=true`` (median and P90 of |log(sim best /
real best)|, by M family, and where the real best kernel ranks in the simulator's order),
without writing a table; ``--per-shape`` also saves the per-shape comparison.
"""

from __future__ import annotations

import argparse
import sys

from ckpred.config import compose
from ckpred.data.simulate import calibrate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-shape", default="", help="CSV file for the per-shape comparison")
    args, overrides = parser.parse_known_args(argv)
    report = calibrate(compose("simulate", overrides))
    if args.per_shape:
        report["shapes"].to_csv(args.per_shape, index=False)
        print(f"per-shape comparison -> {args.per_shape}")
    return 0 if report["summary"]["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
