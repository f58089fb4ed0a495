"""Wall time and peak memory of the simulator on the default set: 168 shapes x 4,608 kernels.

    python scripts/bench/bench_simulate.py [--repeats 3] [hydra overrides, e.g. shapes=llm]

Prints the median wall time of ``simulate`` (the DataFrame), of writing it as canonical parquet,
and the process's peak resident set size (ru_maxrss) before and after.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ckpred.config import compose
from ckpred.data.shapes import load_shapes
from ckpred.data.simulate import SIMULATOR_VERSION, simulate
from ckpred.data.table import write_table
from ckpred.kernels.base import load_op


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args(argv)
    cfg = compose("simulate", overrides)
    op = load_op(cfg.op)
    shapes = load_shapes(cfg.shapes)
    rss0 = peak_rss_mib()
    times, table = [], None
    for _ in range(args.repeats):
        table = None  # free the previous table before measuring the next run
        start = time.perf_counter()
        table = simulate(shapes, op, cfg.arch, cfg.dtype, cfg.layout, seed=int(cfg.data.seed))
        times.append(time.perf_counter() - start)
    rss_sim = peak_rss_mib()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_table(table, Path(tmp) / "sim.parquet", op)
        t_write = time.perf_counter() - start
        size = (Path(tmp) / "sim.parquet").stat().st_size / 2**20
    print(f"simulator {SIMULATOR_VERSION}: {cfg.arch.name}/{cfg.dtype.name}/{cfg.layout.name}, shapes={cfg.shapes.name}: "
          f"{len(shapes)} shapes x {len(table) // len(shapes):,} kernels = {len(table):,} rows")
    print(f"simulate wall time: median {statistics.median(times):.2f} s, min {min(times):.2f} s over {args.repeats} runs")
    print(f"write canonical parquet: {t_write:.2f} s ({size:.1f} MiB)")
    print(f"peak RSS: {rss0:.0f} MiB after imports and setup, {rss_sim:.0f} MiB after simulating, "
          f"{peak_rss_mib():.0f} MiB after writing")


if __name__ == "__main__":
    main(sys.argv[1:])
