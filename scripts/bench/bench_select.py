#!/usr/bin/env python
"""Per-shape kernel-selection latency of the default gfx950 fp8 model (4,608 candidates), one thread.

One run: fits the default export config's pipeline on the default simulated data (or the config
given by overrides), exports it (parity-checked on every training shape), then times selection
for unseen shapes with

* C++ selector        scripts/cpp ckpred_select (onnxruntime C++ API, model.onnx, one Run per shape)
* Python selector     ckpred.runtime.KernelSelector.select (cache off)
* ORT scorer, feats   onnxruntime on the model step alone, features precomputed (4,608 rows)
* LightGBM native     Booster.predict on precomputed features (4,608 rows)
* sklearn pipeline    Pipeline.predict on the raw rows (features + LightGBM, 4,608 rows)

and prints median and p99 per shape, ratios to the C++ selector, model file sizes and the
export's parity figures.

    python scripts/bench/bench_select.py [--shapes 300] [--out-dir exports/bench] [hydra overrides...]

This times the ``full`` selector (every kernel scored). With ``--train-run <train run dir>`` the
same run then measures every selection strategy (``full``, ``pruned``, ``reranked``; the default
export is ``reranked``): latency against CV efficiency, cached latency and the trade-off plot,
through ``scripts/bench/bench_strategies.py`` on the same pipeline::

    python scripts/bench/bench_select.py --train-run runs/train/<time> rows.max_per_shape=512 rows.keep_top=128
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def stats(us: list[float]) -> tuple[float, float]:
    arr = np.sort(np.asarray(us))
    return float(np.median(arr)), float(arr[min(len(arr) - 1, int(round(0.99 * (len(arr) - 1))))])


def float32_check(pipe, op, cfg, table: pd.DataFrame) -> dict[str, object]:
    """How the stock float32 LightGBM graph disagrees with sklearn on every training row."""
    from onnxmltools.convert import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    from ckpred.export import onnx as xo

    model = pipe.named_steps["model"]
    inner = getattr(model, "regressor_", model)
    X = op.encode_frame(table)
    feats = pipe.named_steps["features"].transform(X)
    want = np.asarray(pipe.predict(X), dtype=np.float64)
    stock = convert_lightgbm(inner, initial_types=[("x", FloatTensorType([None, feats.shape[1]]))], target_opset=15)
    raw = xo.session(stock, threads=2).run(None, {"x": feats.astype(np.float32)})[0].ravel().astype(np.float64)
    got = model.transformer_.inverse_transform(raw.reshape(-1, 1)).ravel() if inner is not model else raw
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-12)
    valid, _ = op.validity(table, table, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    keys = op.shape_keys(table).to_numpy()
    differs = 0
    shapes = pd.unique(keys)
    for key in shapes:
        idx = np.flatnonzero((keys == key) & valid)
        if len(idx) and np.argmax(want[idx]) != np.argmax(got[idx]):
            differs += 1
    return {"rows": int(len(table)), "rows_differing": int((rel > 1e-3).sum()),
            "max_rel_diff": float(rel.max()), "top1_differs": differs, "shapes": int(len(shapes))}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=int, default=300, help="unseen shapes to time (default 300)")
    parser.add_argument("--out-dir", default=str(REPO / "exports" / "bench"), help="export root (default exports/bench, git-ignored)")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--reuse", action="store_true",
                        help="load <out-dir>/pipeline.joblib from an earlier run instead of fitting")
    parser.add_argument("--float32-check", action="store_true",
                        help="also score every training row with onnxmltools' stock float32 trees and count "
                             "rows and top-1 choices that differ from sklearn")
    parser.add_argument("--train-run", default="",
                        help="a train run (oof_predictions.parquet): also measure every selection strategy")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of the export config")
    return parser.parse_args()


def fit_or_reuse(args: argparse.Namespace, cfg, table: pd.DataFrame, op):
    """The export config's final pipeline: fitted here (and saved), or ``--reuse``d; and the seconds."""
    import joblib

    from ckpred.fitting import fit_final
    from ckpred.runs import load_pipeline

    saved = Path(args.out_dir) / "pipeline.joblib"
    t0 = time.perf_counter()
    if args.reuse and saved.is_file():
        pipe = load_pipeline(saved)  # runs nothing a tampered file names
        print(f"reusing {saved}")
    else:
        pipe = fit_final(cfg, table, op)
        saved.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(pipe, saved, compress=3)
    return pipe, time.perf_counter() - t0


def per_call_us(call, inputs) -> tuple[float, float]:
    """Median and p99 microseconds of ``call(x)`` over ``inputs``, after one warm-up call."""
    call(inputs[0])
    us = []
    for x in inputs:
        t = time.perf_counter()
        call(x)
        us.append((time.perf_counter() - t) * 1e6)
    return stats(us)


def cpp_selector_us(out: Path, shapes: pd.DataFrame) -> tuple[float, float] | None:
    """Median and p99 per shape of the C++ selector (one process, one Run per shape, timed by
    the program itself); None when it does not build."""
    build = subprocess.run(["bash", str(REPO / "scripts" / "cpp" / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
    if build.returncode != 0:
        print(build.stdout[-2000:], build.stderr[-2000:], file=sys.stderr)
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        for r in shapes.itertuples(index=False):
            fh.write(",".join(str(int(v)) for v in r) + "\n")
    binary = REPO / "build" / "cpp" / "ckpred_select"
    res = subprocess.run([str(binary), str(out), "--threads", "1", "--bench", "1", "--shapes", fh.name],
                         capture_output=True, text=True, check=True)
    bench = json.loads(res.stdout)["bench"]
    return bench["median_us"], bench["p99_us"]


def model_step_session(model, n_features: int):
    """onnxruntime session of the model step alone (features precomputed), one thread."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType

    from ckpred.export import lightgbm as xl
    from ckpred.export import onnx as xo

    xl.register()
    model_onnx = convert_sklearn(model, initial_types=[("features", DoubleTensorType([None, n_features]))],
                                 target_opset={**xo.OPSET, "ai.onnx.ml": 3})
    for entry in model_onnx.opset_import:
        if entry.domain == "ai.onnx.ml":
            entry.version = xo.OPSET["ai.onnx.ml"]
    return xo.session(model_onnx, threads=1)


def file_sizes_mb(pipe) -> tuple[float, float]:
    """Sizes of the pipeline as joblib (compress=3) and of its LightGBM text model, in MB."""
    import joblib

    from ckpred.models import booster

    with tempfile.TemporaryDirectory() as tmp:
        joblib.dump(pipe, Path(tmp) / "p.joblib", compress=3)
        booster(pipe).save_model(str(Path(tmp) / "lgbm.txt"))
        return (Path(tmp) / "p.joblib").stat().st_size / 1e6, (Path(tmp) / "lgbm.txt").stat().st_size / 1e6


def main() -> int:
    args = parse_args()

    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.data.shapes import unseen_shapes
    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline
    from ckpred.export.manifest import export_name
    from ckpred.kernels.base import load_op
    from ckpred.runtime import KernelSelector

    cfg = compose("export", list(args.overrides))
    op = load_op(cfg.op)
    t0 = time.perf_counter()
    table = load_table(cfg)
    print(f"data: {len(table):,} rows, {len(table[list(op.problem_names)].drop_duplicates())} shapes "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    pipe, fit_s = fit_or_reuse(args, cfg, table, op)
    model = pipe.named_steps["model"]
    inner = getattr(model, "regressor_", model)
    print(f"fit: {inner.booster_.num_trees()} trees, {fit_s:.1f} s", flush=True)

    out = Path(args.out_dir) / export_name(op.name, cfg.arch.name, cfg.dtype.name, cfg.layout.name)
    problems = table[list(op.problem_names)].drop_duplicates()
    t0 = time.perf_counter()
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=out,
                          training=mf.training_section(table, op), options=ExportOptions(parity_problems=problems))
    par = man["parity"]
    print(f"export + parity: {time.perf_counter() - t0:.1f} s -> {out}", flush=True)

    # one thread everywhere
    inner.set_params(n_jobs=1)
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    C = len(cat)
    shapes = unseen_shapes(problems, args.shapes)
    kern = op.encode(cat, op.kernel_names)

    def raw_rows(row: np.ndarray) -> pd.DataFrame:
        X = np.hstack([np.repeat(row[None, :], C, axis=0), kern])
        return pd.DataFrame(X, columns=list(op.input_names))

    results: dict[str, tuple[float, float]] = {}
    cpp = cpp_selector_us(out, shapes)
    if cpp is None:
        return 1
    results["C++ selector (model.onnx)"] = cpp
    sel = KernelSelector.load(out, cache_size=0, threads=1)
    results["Python selector (model.onnx)"] = per_call_us(lambda r: sel.select(*r, top_k=5),
                                                          list(shapes.itertuples(index=False)))
    # features precomputed for the next three
    features = pipe.named_steps["features"]
    feats = [features.transform(raw_rows(r)) for r in shapes.to_numpy(np.int64)]
    sess = model_step_session(model, feats[0].shape[1])
    name = sess.get_inputs()[0].name
    results["onnxruntime scorer, features precomputed"] = per_call_us(
        lambda f: np.argmax(sess.run(None, {name: f})[0]), feats)
    booster = inner.booster_
    results["LightGBM native predict, features precomputed"] = per_call_us(
        lambda f: np.argmax(booster.predict(f, num_threads=1)), feats)
    raws = [raw_rows(r) for r in shapes.to_numpy(np.int64)]
    results["sklearn pipeline (features + LightGBM)"] = per_call_us(lambda X: np.argmax(pipe.predict(X)), raws)

    base = results["C++ selector (model.onnx)"][0]
    print()
    print(f"Selection latency per unseen shape, {C} candidates, {len(shapes)} shapes, 1 thread, "
          f"{booster.num_trees()} trees x {inner.get_params()['num_leaves']} leaves, "
          f"{len(man['features'])} features ({cfg.features.name})")
    print(f"{'method':<48} {'median ms':>10} {'p99 ms':>10} {'x C++':>8}")
    for name_, (med, p99) in results.items():
        print(f"{name_:<48} {med / 1e3:>10.2f} {p99 / 1e3:>10.2f} {med / base:>8.2f}")
    joblib_mb, lgbm_mb = file_sizes_mb(pipe)
    print()
    print("model files: " + ", ".join(f"{k} {v['bytes'] / 1e6:.2f} MB" for k, v in man["files"].items())
          + f", manifest.json {(out / 'manifest.json').stat().st_size / 1e6:.2f} MB"
          + f", pipeline.joblib {joblib_mb:.2f} MB, LightGBM text model {lgbm_mb:.2f} MB")
    print(f"parity (all {par['shapes']} training shapes x {C} kernels = {par['rows']:,} rows): top-1 agreement "
          f"{par['top1_agreement']:.2%}, top-5 {par['topk_agreement']:.2%}, max |score diff| scorer "
          f"{par['max_abs_diff_scorer']:.3g}, selector {par['max_abs_diff_selector']:.3g} (model output space: "
          f"{man['model']['target']})")
    f32: dict[str, object] = {}
    if args.float32_check:
        f32 = float32_check(pipe, op, cfg, table)
        print(f"stock float32 trees (onnxmltools TreeEnsembleRegressor, float features) on {f32['rows']:,} training "
              f"rows: {f32['rows_differing']:,} rows differ from sklearn by > 1e-3 relative, top-1 differs on "
              f"{f32['top1_differs']} of {f32['shapes']} shapes")
    if args.json:
        Path(args.json).write_text(json.dumps({"latency_us": {k: {"median": v[0], "p99": v[1]} for k, v in results.items()},
                                               "files": man["files"], "parity": par, "fit_seconds": fit_s,
                                               "float32_check": f32}, indent=1))
    if args.train_run:
        print("\nselection strategies (scripts/bench/bench_strategies.py, same pipeline):", flush=True)
        # overrides first: argparse would read them as more --top-n values after it
        extra = ["--json", str(Path(args.json).with_suffix(".strategies.json"))] if args.json else []
        strategies = Path(__file__).with_name("bench_strategies.py")
        return subprocess.run([sys.executable, str(strategies), *args.overrides, "--train-run", args.train_run,
                               "--shapes", str(min(args.shapes, 100)), "--out-dir", args.out_dir, "--reuse",
                               "--top-n", "1", "2", "5", *extra]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
