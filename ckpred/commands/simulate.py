"""``python -m ckpred simulate``: write a simulated benchmark table (the embedded default data)."""

from __future__ import annotations

import shutil
from ckpred.data.shapes import load_shapes
from ckpred.data.simulate import LOG_FILE, cache_path, calibrate, simulated_table, write_log
from ckpred.data.table import TABLE_FILE
from ckpred.schema import SimulateConfig
from ckpred.util import atomic_path, check_replaceable, resolve_path


def simulate_command(cfg: SimulateConfig) -> float:
    """``ckpred simulate``: write the simulated table (and log); optionally the calibration report.

    Returns the calibration's median |log(sim best / real best)| with ``calibrate=true`` (what a
    sweep would minimise), else the share of valid rows in the written table. An existing
    ``out`` (``log``) is replaced only when it is a table (log) ckpred wrote, or empty.
    """
    check_replaceable("out", cfg.out, TABLE_FILE)  # before any work: nothing of the user's is replaced
    if cfg.log:
        check_replaceable("log", cfg.log, LOG_FILE)
    table = simulated_table(cfg)
    out = resolve_path(cfg.out)
    cached = cache_path(cfg, load_shapes(cfg.shapes))  # written by simulated_table
    if out.resolve() != cached.resolve():
        # The cache file is already the canonical parquet of this table: copy it atomically.
        with atomic_path(out, TABLE_FILE) as tmp:
            shutil.copyfile(cached, tmp)
    shapes = table.groupby(["m", "n", "k", "split_k"], sort=False).ngroups
    print(f"simulated {len(table):,} rows ({shapes} shapes x {len(table) // max(shapes, 1):,} kernels, "
          f"{table['is_valid'].mean():.1%} valid) -> {out}")
    if cfg.log:
        log = write_log(table, resolve_path(cfg.log), acc_dtype=cfg.dtype.accumulator, c_dtype=cfg.dtype.c_dtype)
        print(f"streaming log -> {log}")
    if cfg.calibrate:
        return calibrate(cfg)["summary"]["median_abs_log"]
    return float(table["is_valid"].mean())
