"""Training past one machine: a partitioned simulated table through ``model.backend=dask``.

1. Writes (or reuses) a partitioned Parquet dataset of ``--rows`` simulated rows over every
   arch x dtype the simulator has a gemm_universal catalogue for (layout rcr), one file per
   (combo, block of shapes), generated file by file in a child process (never the whole table
   in one process).
2. Trains the default model recipe on it with LightGBM's Dask interface on a local cluster of
   ``--workers`` single-threaded workers, holding out the queries whose stable hash falls in
   [0, ``--test``); scores the held-out queries on the cluster.
3. On a sample of partitions (``--sample-rows`` rows), cross-validates the same recipe
   (``--folds`` folds of queries by key hash) in memory (``backend=local``), in memory with the
   next seed (how much the figures move by chance), and with Dask; prints each one's
   out-of-fold mean / P10 efficiency and the paired per-query differences (bootstrap 95%).

Prints wall and CPU seconds, the peak RSS of each worker (its own high-water mark), of the
client process (which also runs the local scheduler) and the held-out metrics.

    OMP_NUM_THREADS=1 python scripts/bench/dask_scale.py --rows 20000000 --out /tmp/ckpred_20m
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

SPEC = "gfx950/fp8"  # the config the returned pipeline's feature constants come from


def combos():
    """(arch config, dtype config, catalogue size) of every arch the simulator models x every
    dtype with a catalogue there."""
    from ckpred.data.simulate import MICROARCH
    from ckpred.dtypes import dtype_configs, load_dtype
    from ckpred.errors import CkpredError
    from ckpred.kernels.base import load_op
    from ckpred.scale import layout_config
    from ckpred.schema import arch_config

    op = load_op("gemm_universal")
    out = []
    for a in sorted(MICROARCH):
        arch = arch_config(a)
        for d in sorted(dtype_configs()):
            if d not in (arch.peak_tflops or {}):
                continue
            try:
                n = len(op.catalogue(arch, load_dtype(d), layout_config("rcr")))
            except (CkpredError, ValueError):
                continue
            out.append((arch, load_dtype(d), n))
    return op, out


def shape_grid(count: int) -> pd.DataFrame:
    """``count`` GEMM shapes spread evenly over a wide M x N x K grid (deterministic)."""
    m = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
         6144, 8192, 16384, 20480]
    n = [256, 512, 576, 1024, 1536, 2048, 3072, 4096, 7168, 8192, 14336, 16384, 28672]
    k = [256, 512, 1024, 1536, 2048, 4096, 7168, 8192, 14336, 16384]
    grid = pd.MultiIndex.from_product([m, n, k], names=["m", "n", "k"]).to_frame(index=False)
    idx = np.unique(np.round(np.linspace(0, len(grid) - 1, min(count, len(grid)))).astype(int))
    return grid.iloc[idx].reset_index(drop=True)


def generate(out: Path, rows: int, shapes_per_part: int) -> None:
    from ckpred.data.simulate import simulate
    from ckpred.scale import layout_config, write_partitions

    op, cs = combos()
    per_shape = sum(n for _, _, n in cs)
    shapes = shape_grid(int(np.ceil(rows / per_shape)))
    layout = layout_config("rcr")

    def frames():
        for arch, dtype, _ in cs:
            for i in range(0, len(shapes), shapes_per_part):
                yield simulate(shapes.iloc[i:i + shapes_per_part], op, arch, dtype, layout)

    t, cpu = time.perf_counter(), time.process_time()
    manifest = write_partitions(frames(), out, op)
    print(json.dumps({"generated_rows": manifest["rows"], "partitions": len(manifest["partitions"]),
                      "combos": [f"{a.name}/{d.name}" for a, d, _ in cs], "shapes_per_combo": len(shapes),
                      "wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(time.process_time() - cpu, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


def config(overrides: list[str]):
    from hydra import compose, initialize_config_module

    from ckpred.config import register_schemas

    register_schemas()
    arch, dtype = SPEC.split("/")
    with initialize_config_module("ckpred.conf", version_base=None):
        return compose("train", overrides=[f"arch={arch}", f"dtype={dtype}", *overrides])


def _worker_stats() -> dict:
    import psutil

    p = psutil.Process()
    t = p.cpu_times()
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "cpu_s": round(t.user + t.system, 1)}


def run(cfg, path: Path, backend: str, test: tuple[float, float], workers: int, memory_limit: str) -> dict:
    """One fit + held-out scoring; on a fresh local cluster for ``dask``."""
    from ckpred import scale
    from ckpred.kernels.base import load_op

    op = load_op(cfg.op)
    t, cpu = time.perf_counter(), time.process_time()
    if backend == "local":
        pipe, info = scale.fit_partitioned(cfg, op, path, backend="local", test=test)
        fit_s = time.perf_counter() - t
        per_query = scale.score_partitioned(pipe, cfg, op, path, test=test)
        stats = {}
    else:
        from omegaconf import OmegaConf

        dask_cfg = OmegaConf.create({"address": None, "n_workers": workers, "memory_limit": memory_limit})
        with scale.dask_client(dask_cfg) as client:
            pipe, info = scale.fit_partitioned(cfg, op, path, backend="dask", client=client, test=test)
            fit_s = time.perf_counter() - t
            per_query = scale.score_partitioned(pipe, cfg, op, path, test=test, client=client)
            stats = client.run(_worker_stats)
    return {"backend": backend, **info, "fit_wall_s": round(fit_s, 1),
            "wall_s": round(time.perf_counter() - t, 1), "client_cpu_s": round(time.process_time() - cpu, 1),
            "workers": {str(i): s for i, s in enumerate(stats.values())},
            "held_out": scale.summary(per_query), "per_query": per_query}


def oof(cfg, path: Path, backend: str, folds: int, workers: int, memory_limit: str) -> tuple[pd.DataFrame, dict]:
    """Out-of-fold per-query efficiency over ``folds`` hash-range folds, and the summed costs."""
    frames, cost = [], {"fit_wall_s": 0.0, "cpu_s": 0.0, "worker_peak_rss_mb": 0}
    for i in range(folds):
        r = run(cfg, path, backend, (i / folds, (i + 1) / folds), workers, memory_limit)
        frames.append(r["per_query"])
        cost["fit_wall_s"] += r["fit_wall_s"]
        cost["cpu_s"] += r["client_cpu_s"] + sum(w["cpu_s"] for w in r["workers"].values())
        cost["worker_peak_rss_mb"] = max([cost["worker_peak_rss_mb"], *(w["peak_rss_mb"] for w in r["workers"].values())])
        cost["train_rows"] = r["train_rows"]
    return pd.concat(frames, ignore_index=True), {k: round(v, 1) for k, v in cost.items()}


def paired(a: pd.DataFrame, b: pd.DataFrame, seed: int = 0) -> dict:
    """Mean of b - a efficiency over the queries both scored, with a bootstrap 95% interval."""
    m = a.merge(b, on="query", suffixes=("_a", "_b"))
    d = (m["efficiency_b"] - m["efficiency_a"]).to_numpy()
    rng = np.random.default_rng(seed)
    boot = rng.choice(d, size=(2000, len(d)), replace=True).mean(axis=1)
    return {"queries": len(d), "mean_diff": round(float(d.mean()), 4),
            "ci95": [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)],
            "same_pick_share": round(float(np.mean(np.isclose(m["efficiency_a"], m["efficiency_b"]))), 3)}


def sample_dataset(full: Path, out: Path, rows: int) -> int:
    """A dataset of evenly spaced partitions of ``full`` (links to its files) of about ``rows`` rows."""
    from ckpred.data.partitions import MANIFEST

    manifest = json.loads((full / MANIFEST).read_text())
    parts = manifest["partitions"]
    step = max(1, int(round(manifest["rows"] / rows)))
    chosen = parts[::step]
    out.mkdir(parents=True, exist_ok=True)
    for p in chosen:
        link = out / p["file"]
        if not link.exists():
            link.symlink_to((full / p["file"]).resolve())
    (out / MANIFEST).write_text(json.dumps({**manifest, "partitions": chosen,
                                            "rows": int(sum(p["rows"] for p in chosen))}))
    return int(sum(p["rows"] for p in chosen))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ckpred_dask_scale"))
    ap.add_argument("--shapes-per-part", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="6GiB")
    ap.add_argument("--test", type=float, default=0.2, help="held-out share of the queries")
    ap.add_argument("--sample-rows", type=int, default=1_500_000)
    ap.add_argument("--folds", type=int, default=5, help="hash-range folds of the sample comparison")
    ap.add_argument("--skip-full", action="store_true", help="only the sample comparison")
    ap.add_argument("--skip-sample", action="store_true", help="only the full-size Dask run")
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="train config overrides (e.g. rows.max_per_shape=0)")
    args = ap.parse_args()
    data = args.out / f"rows{args.rows}"
    if args.generate:
        generate(data, args.rows, args.shapes_per_part)
        return
    if not (data / "_ckpred_partitions.json").is_file():
        # a child process: the generator's memory is not this process's
        subprocess.run([sys.executable, __file__, "--generate", "--rows", str(args.rows), "--out", str(args.out),
                        "--shapes-per-part", str(args.shapes_per_part)], check=True)
    cfg = config(args.overrides)
    test = (0.0, args.test)
    print(f"dataset {data} ({json.loads((data / '_ckpred_partitions.json').read_text())['rows']:,} rows); "
          f"recipe {cfg.model.name}, {cfg.model.n_estimators} trees, rows.max_per_shape={cfg.rows.max_per_shape}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if not args.skip_full:
        full = run(cfg, data, "dask", test, args.workers, args.memory_limit)
        full["client_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        full.pop("per_query")
        print("FULL", json.dumps(full))
    if not args.skip_sample:
        sample = args.out / f"sample{args.sample_rows}_of_{args.rows}"
        n = sample_dataset(data, sample, args.sample_rows)
        print(f"sample: {n:,} rows")
        # out-of-fold over the whole sample: local, local with another seed (the noise yardstick), Dask
        seed = int(cfg.seed)
        other = config([*args.overrides, f"seed={seed + 1}"])
        out = {}
        for label, c, backend in (("local", cfg, "local"), (f"local_seed{seed + 1}", other, "local"),
                                  ("dask", cfg, "dask")):
            per_query, cost = oof(c, sample, backend, args.folds, args.workers, args.memory_limit)
            out[label] = per_query
            print("SAMPLE", label, json.dumps({**scale_summary(per_query), **cost}), flush=True)
        print("PAIRED dask - local", json.dumps(paired(out["local"], out["dask"])))
        print(f"PAIRED local seed {seed + 1} - local", json.dumps(paired(out["local"], out[f"local_seed{seed + 1}"])))


def scale_summary(per_query: pd.DataFrame) -> dict:
    from ckpred.scale import summary

    return {k: round(v, 4) if isinstance(v, float) else v for k, v in summary(per_query).items()}


if __name__ == "__main__":
    main()
