"""Screen model/target/feature variants on the first CV folds of the default data.

    python scripts/research/compare_models.py --folds 1 "model=lgbm_regressor target=log1p" "model=lgbm_ranker"

Each positional argument is a space-separated list of ``train`` overrides. For every variant the
script fits on the training shapes of the first ``--folds`` folds of the default
``group_kfold`` split (the same folds ``train`` uses) and prints mean / P10 / min / top-1
efficiency on their test shapes, the wall time and the training rows. No baselines, no
outputs: a quick screen; the numbers to quote come from ``python -m ckpred train``.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from ckpred import evaluate as ev
from ckpred.config import compose
from ckpred.data import load_table
from ckpred.kernels.base import load_op
from ckpred.cv import make_folds
from ckpred.fitting import LearnedMethod, fit_method, predict, prepare, recipe_config, rows_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=1, help="how many of the 5 folds to run")
    parser.add_argument("variants", nargs="+", help="space-separated train overrides per variant")
    args = parser.parse_args()
    base = compose("train", [])
    op = load_op(base.op)
    start = time.perf_counter()
    data = prepare(load_table(base), op, base)
    print(f"data: {len(data.table)} rows, {data.groups.n_shapes} shapes ({time.perf_counter() - start:.1f}s)")
    folds = make_folds(base.cv, data, int(base.seed))[: args.folds]
    for variant in args.variants:
        cfg = compose("train", variant.split())
        method = LearnedMethod("model", recipe_config(cfg, cfg.features, cfg.model, cfg.target), cfg.rows)
        start = time.perf_counter()
        parts = []
        for i, fold in enumerate(folds):
            pipe, info = fit_method(method, data, fold.train_shapes, op, cfg, int(cfg.seed) + i)
            rows = rows_of(data.groups, fold.test_shapes)
            groups = ev.ShapeGroups.from_keys(data.groups.codes[rows])
            parts.append(ev.shape_metrics(data.perf[rows], predict(pipe, data.X.iloc[rows]), groups,
                                          data.selectable[rows]))
        r = ev.summarize(pd.concat(parts))
        print(f"{variant!r}: mean {100 * r['mean']:.2f} P10 {100 * r['p10']:.2f} min {100 * r['min']:.2f} "
              f"top1 {100 * r['top1']:.1f} over {r['n_shapes']} shapes; {time.perf_counter() - start:.1f}s, "
              f"{info['train_rows']} training rows", flush=True)


if __name__ == "__main__":
    main()
