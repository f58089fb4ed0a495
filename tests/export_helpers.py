"""Small fitted pipelines and synthetic training tables for the export/runtime/C++ tests."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd

from ckpred.config import compose
from ckpred.features import build_features
from ckpred.config import feature_set
from ckpred.kernels.base import OpDefinition, load_op

#: Training shapes: every M family, a prime, multiples that make most tiles valid.
TRAIN_SHAPES = [(1, 4096, 2048), (1, 7168, 4096), (7, 1536, 7168), (16, 1536, 7168), (64, 7168, 2048),
                (128, 4096, 512), (512, 576, 7168), (1024, 7168, 2304), (2048, 4608, 7168), (4096, 1536, 1536),
                (8192, 4096, 512), (16384, 7168, 4096), (97, 3072, 1024), (300, 9216, 3072)]

#: Edge shapes for parity: M=1, prime dims, K up to 2^20, N=1/K=1 (no kernel), huge products.
EDGE_SHAPES = [(1, 1536, 7168), (1, 7168, 1 << 20), (2, 256, 64), (3, 7168, 256), (13, 17, 19),
               (101, 1031, 2053), (7919, 7919, 7919), (1, 1, 7168), (64, 4096, 1), (4096, 4096, 1 << 20),
               (65537, 65536, 1 << 20), (20480, 28672, 8192), (1, 64, 64), (255, 192, 128), (1 << 20, 256, 256)]


def configs(arch: str = "gfx950", dtype: str = "fp8", layout: str = "rcr") -> Any:
    return compose("simulate", [f"arch={arch}", f"dtype={dtype}", f"layout={layout}"])


def synthetic_table(op: OpDefinition, cfg: Any, shapes: list[tuple[int, int, int]], *, kernels: int = 400,
                    seed: int = 0) -> pd.DataFrame:
    """A canonical-like table: shapes x a sample of the catalogue, with a smooth fake TFLOPS."""
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    sample = cat.sample(min(kernels, len(cat)), random_state=seed)
    probs = pd.DataFrame(shapes, columns=["m", "n", "k"]).assign(split_k=1)
    rows = probs.merge(sample, how="cross")
    valid, reason = op.validity(rows, rows, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    rng = np.random.default_rng(seed)
    m, n, k = (rows[c].to_numpy(float) for c in ("m", "n", "k"))
    tm, tn, tk = (rows[c].to_numpy(float) for c in ("tile_m", "tile_n", "tile_k"))
    waste = (np.ceil(m / tm) * tm * np.ceil(n / tn) * tn) / (m * n)
    pipe_bonus = rows["pipeline"].map({"compv3": 1.0, "compv4": 1.1, "mem": 0.8}).to_numpy(float)
    tflops = 2e-3 * m * n * k / (1e6 + m * n * k / 3000.0) * pipe_bonus / waste * (1 + 0.05 * rng.random(len(rows)))
    tflops = np.where(valid, tflops * 1000.0, 0.0)
    return rows.assign(tflops=tflops, is_valid=valid, invalid_reason=reason)


def fit_pipeline(op: OpDefinition, cfg: Any, table: pd.DataFrame, *, model: str = "regressor",
                 target: str = "log1p", n_estimators: int = 40, features: str = "minimal") -> Any:
    """A real ckpred pipeline (feature set + LightGBM, through ckpred.models) fitted on ``table``."""
    import lightgbm as lgb
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.pipeline import Pipeline

    from ckpred.models import IdentityTarget, Log1pTarget, relevance_grades

    feats = build_features(feature_set(features), op, cfg.arch, cfg.dtype, cfg.layout)
    params = dict(n_estimators=n_estimators, num_leaves=31, learning_rate=0.1, min_child_samples=5, n_jobs=1,
                  verbose=-1, deterministic=True, force_row_wise=True, random_state=0)
    rows = table[table["is_valid"]].copy()
    rows["_shape"] = op.shape_keys(rows)
    rows = rows.sort_values("_shape", kind="stable")
    codes = pd.factorize(rows.pop("_shape"))[0]
    X = op.encode_frame(rows)
    perf = rows["tflops"].to_numpy(float)
    if model == "ranker":
        est = lgb.LGBMRanker(objective="lambdarank", label_gain=[float(2 ** i - 1) for i in range(31)], **params)
        pipe = Pipeline([("features", feats), ("model", est)])
        sizes = np.diff(np.flatnonzero(np.r_[1, np.diff(codes), 1]))
        pipe.fit(X, relevance_grades(perf, codes, n_grades=31, exponent=3.0), model__group=sizes)
        pipe.ckpred_target_ = "rank"
        return pipe
    transformer = Log1pTarget() if target == "log1p" else IdentityTarget()
    est = TransformedTargetRegressor(regressor=lgb.LGBMRegressor(objective="regression", **params),
                                     transformer=transformer, check_inverse=False)
    pipe = Pipeline([("features", feats), ("model", est)])
    pipe.fit(X, perf)
    pipe.ckpred_target_ = target
    return pipe


def gemm() -> OpDefinition:
    return load_op("gemm_universal")


def export_gemm(out_dir: Path, *, n_estimators: int) -> Path:
    """A small real export of the gemm op (synthetic table on TRAIN_SHAPES, minimal features,
    log1p regressor) written to ``out_dir``, its manifest recording arch/dtype/layout as
    ``ckpred export`` does."""
    from ckpred.export import manifest as mf
    from ckpred.export.build import export_pipeline

    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    pipe = fit_pipeline(op, cfg, table, n_estimators=n_estimators)
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=out_dir,
                    training=mf.training_section(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout))
    return out_dir


def few_tree_regressor() -> tuple[OpDefinition, Any, pd.DataFrame]:
    """A 6-tree regressor on the synthetic gemm table and a 300-kernel catalogue: its trees split
    on a fraction of the op's full feature set (what pruning and packing act on)."""
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES, kernels=200)
    pipe = fit_pipeline(op, cfg, table, model="regressor", target="log1p", n_estimators=6, features="gemm_universal")
    catalogue = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).iloc[:300].reset_index(drop=True)
    return op, pipe, catalogue


def forge(d: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as export ``d``'s manifest.json *and* into its model.onnx metadata, and
    re-sign every file: a forgery no hash or embedded-manifest check can tell from an export."""
    import hashlib
    import json

    import onnx

    model = onnx.load(str(d / "model.onnx"))
    for prop in model.metadata_props:
        if prop.key == "ckpred.manifest":
            prop.value = json.dumps({k: v for k, v in manifest.items() if k != "files"}, sort_keys=True,
                                    separators=(",", ":"))
    onnx.save(model, str(d / "model.onnx"))
    manifest = {**manifest, "files": {name: {**info, "sha256": hashlib.sha256((d / name).read_bytes()).hexdigest()}
                                      for name, info in manifest["files"].items()}}
    (d / "manifest.json").write_text(json.dumps(manifest))


@contextmanager
def re_exporting(target: Path, exports: Sequence[Path]) -> Iterator[list[int]]:
    """Write ``exports``' files into the export folder ``target`` in turn, over and over, on a
    thread until the block ends (a re-export racing whoever loads ``target``); the first is in
    place on entry. Yields the number of re-exports so far, as ``[n]``."""
    from ckpred.export import manifest as mf

    versions = [{name: (d / name).read_bytes() for name in ("model.onnx", "scorer.onnx", "manifest.json")}
                for d in exports]
    mf.write_export_dir(target, versions[0])
    stop, swaps = threading.Event(), [0]

    def swap() -> None:
        while not stop.is_set():
            mf.write_export_dir(target, versions[swaps[0] % len(versions)])
            swaps[0] += 1

    writer = threading.Thread(target=swap, daemon=True)
    writer.start()
    try:
        yield swaps
    finally:
        stop.set()
        writer.join(30)
