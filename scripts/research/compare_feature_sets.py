"""Compare feature sets by kernel-selection quality under shape-grouped CV (a quick screen).

Usage::

    python scripts/research/compare_feature_sets.py                      # anchor55, minimal, full
    python scripts/research/compare_feature_sets.py --sets anchor55 full --extra problem,kernel,wave
    python scripts/research/compare_feature_sets.py --data path --path '/data/*.json'

For each feature set: features of the whole table, GroupKFold over shapes, an LGBMRegressor on
log1p(TFLOPS) trained on a per-shape subsample of the training shapes' rule-valid rows (the
top ``--keep-top`` kernels of each shape always kept), and per-shape selection efficiency on
the test shapes over every rule-valid kernel (failed kernels score 0). Prints mean, P10, P50,
min efficiency, top-1 hit rate, feature count and wall time per set. This is a screen with a
small model, not the training run; ``python -m ckpred train features=<set>`` is the real one.

Caveat printed with the results: on simulated data, features that mirror the simulator's own
physics (wave quantisation, roofline time) are favoured more than real hardware may favour them.
"""

from __future__ import annotations

import argparse
import time

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from ckpred.config import compose
from ckpred.data import load_table
from ckpred.features import build_features
from ckpred.config import feature_set
from ckpred.kernels.base import load_op


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=["anchor55", "minimal", "full"])
    parser.add_argument("--extra", nargs="*", default=[],
                        help="ad-hoc sets as comma-separated group kinds, e.g. problem,kernel,wave")
    parser.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides of the train config")
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--trees", type=int, default=300)
    parser.add_argument("--leaves", type=int, default=63)
    parser.add_argument("--per-shape", type=int, default=600, help="training rows sampled per shape")
    parser.add_argument("--keep-top", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def sampled_rows(perf: np.ndarray, shape_id: np.ndarray, *, per_shape: int, keep_top: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Training-row mask: per shape the ``keep_top`` fastest kernels plus a random sample of the
    rest, about ``per_shape`` rows in all."""
    order = np.lexsort((-perf, shape_id))
    rank = np.empty(len(perf), dtype=np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(shape_id[order])) + 1]
    counts = np.diff(np.r_[starts, len(order)])
    rank[order] = np.arange(len(order)) - np.repeat(starts, counts)
    size = np.bincount(shape_id)
    keep_p = np.clip((per_shape - keep_top) / np.maximum(size[shape_id] - keep_top, 1), 0, 1)
    return (rank < keep_top) | (rng.random(len(perf)) < keep_p)


def fold_efficiency(F: np.ndarray, perf: np.ndarray, shape_id: np.ndarray, n_shapes: int, folds: list,
                    sampled: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    """Per-shape efficiency of a log1p LGBMRegressor on features ``F``, out of fold."""
    eff = np.zeros(n_shapes)
    for train_idx, test_idx in folds:
        tr = train_idx[sampled[train_idx]]
        model = lgb.LGBMRegressor(n_estimators=args.trees, num_leaves=args.leaves, learning_rate=0.05,
                                  min_child_samples=20, colsample_bytree=0.8, subsample=0.8,
                                  subsample_freq=1, n_jobs=args.threads, random_state=args.seed,
                                  verbose=-1)
        model.fit(F[tr], np.log1p(perf[tr]))
        pred = model.predict(F[test_idx])
        frame = pd.DataFrame({"s": shape_id[test_idx], "pred": pred, "perf": perf[test_idx]})
        best = frame.groupby("s")["perf"].max()
        chosen = frame.loc[frame.groupby("s")["pred"].idxmax()].set_index("s")["perf"]
        eff[best.index] = (chosen / best).to_numpy()
    return eff


def main() -> None:
    args = parse_args()
    cfg = compose("train", list(args.overrides))
    op = load_op(cfg.op)
    t0 = time.perf_counter()
    table = load_table(cfg)
    shape = op.shape_keys(table).to_numpy()
    rule_ok, _ = op.validity(table, table, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
    table, shape = table[rule_ok].reset_index(drop=True), shape[rule_ok]
    perf = np.where(table["is_valid"].to_numpy(bool), table["tflops"].to_numpy(np.float64), 0.0)
    X = op.encode_frame(table)
    codes, shape_id = np.unique(shape, return_inverse=True)
    print(f"data: {len(table):,} rule-valid rows, {len(codes)} shapes ({time.perf_counter() - t0:.1f} s)")

    sampled = sampled_rows(perf, shape_id, per_shape=args.per_shape, keep_top=args.keep_top,
                           rng=np.random.default_rng(args.seed))
    folds = list(GroupKFold(n_splits=args.folds).split(X, groups=shape_id))
    sets = {name: feature_set(name) for name in args.sets}
    for spec in args.extra:
        sets[spec] = {"name": spec, "groups": [{"kind": kind} for kind in spec.split(",")]}

    rows = []
    for name, fs in sets.items():
        start = time.perf_counter()
        F = build_features(fs, op, cfg.arch, cfg.dtype, cfg.layout).fit_transform(X)
        eff = fold_efficiency(F, perf, shape_id, len(codes), folds, sampled, args)
        rows.append({"set": name, "features": F.shape[1], "mean": eff.mean(), "p10": np.percentile(eff, 10),
                     "p50": np.median(eff), "min": eff.min(), "top1": float(np.mean(eff >= 1.0 - 1e-12)),
                     "seconds": time.perf_counter() - start})
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1, float_format="%.4f"),
              flush=True)
    print("\nsorted by mean efficiency:")
    print(pd.DataFrame(rows).sort_values("mean", ascending=False).to_string(index=False, float_format="%.4f"))
    print("\ncaveat: on simulated data, features mirroring the simulator's physics may be favoured.")


if __name__ == "__main__":
    main()
