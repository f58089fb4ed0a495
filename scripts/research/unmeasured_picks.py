"""How often a selector that ranks the whole catalogue picks a kernel the table never measured.

    python scripts/research/unmeasured_picks.py --config-dir tests/ops experiment=miopen_gfx942 \\
        data.path=../shared/data/miopen_find_db/gfx942130.HIP.fdb.txt.bz2 --groups 0.3 --folds 2

The exported selector ranks every rule-valid kernel of the catalogue; cross-validation used to
rank only the rows the table holds for each test problem. For each of the first ``--folds``
folds of the experiment's CV (optionally on a seeded share ``--groups`` of its CV groups) this
script fits the model on the training problems and prints, over the test problems:

* ``measured only``: the efficiency when only the measured rows are ranked (what CV reported);
* ``whole catalogue``: the strict efficiency (a pick without a measurement scores 0), the
  unmeasured-pick rate and the fallback efficiency (the next-ranked measured kernel) when every
  rule-valid catalogue kernel is ranked;
* ``mask t``: the same with an applicability mask (problem and kernel features -> absent or
  not, fitted on the training problems' whole candidate set) dropping the kernels whose
  estimate of being absent exceeds ``t``, for each ``t`` of ``--thresholds`` (the test fold's
  curve, to see how flat it is: the threshold the product uses is chosen on inner folds);
* with ``--inner K``: the threshold :func:`ckpred.fitting.fit_applicability` picks on K inner
  folds of the training problems, and its figures on the test fold.

Every figure is per fold, then the mean over folds. Numbers to quote come from ``ckpred train``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

from ckpred import evaluate as ev
from ckpred.config import compose
from ckpred.cv import make_folds
from ckpred.data import load_table
from ckpred.fitting import fit_method, model_method, predict, prepare, rows_of, with_unmeasured
from ckpred.kernels.base import load_op
from ckpred.kernels.declared import bind_training_catalogue
from ckpred.models import failure_estimator, predicted_ok


def ev_cfg(cfg, inner: int):
    """``cfg`` with ``applicability.inner_folds=inner``."""
    return dataclasses.replace(cfg, applicability=dataclasses.replace(cfg.applicability, inner_folds=inner))


def _sub(groups: ev.ShapeGroups, rows: np.ndarray) -> ev.ShapeGroups:
    return ev.ShapeGroups.from_keys(groups.codes[rows])


def _summary(frame: pd.DataFrame) -> dict[str, float]:
    r = ev.summarize(frame)
    return {"mean": r["mean"], "p10": r["p10"], "unmeasured": r.get("unmeasured_pick", 0.0),
            "fallback": r["fallback_efficiency"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", default=None, help="a user config dir (as ckpred's --config-dir)")
    parser.add_argument("--groups", type=float, default=1.0, help="seeded share of the CV groups to use")
    parser.add_argument("--folds", type=int, default=5, help="how many of the CV folds to run")
    parser.add_argument("--thresholds", default="0.3,0.5,0.7,0.9,0.95,0.99",
                        help="comma-separated thresholds on the estimate that a kernel is absent")
    parser.add_argument("--inner", type=int, default=0, help="inner folds to choose the threshold on (0: skip)")
    parser.add_argument("overrides", nargs="*", help="train overrides")
    args = parser.parse_args()
    cfg = compose("train", list(args.overrides), config_dir=args.config_dir)
    op = load_op(cfg.op)
    start = time.perf_counter()
    table = load_table(cfg)
    bind_training_catalogue(op, table, cfg)
    if args.groups < 1.0:
        keys = np.asarray(op.cv_group_keys(table))
        uniq = pd.unique(keys)
        rng = np.random.default_rng(int(cfg.seed))
        kept = set(rng.choice(uniq, size=max(2, int(round(args.groups * len(uniq)))), replace=False).tolist())
        table = table[pd.Series(keys).isin(kept).to_numpy()].reset_index(drop=True)
    expanded, coverage = with_unmeasured(table, op, cfg)
    data = prepare(table, op, cfg)
    cand = prepare(expanded, op, cfg)
    measured = expanded["measured"].to_numpy(bool)
    print(f"data: {len(table)} rows, {data.groups.n_shapes} problems, catalogue {len(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))}"
          f" kernels; {coverage.pairs} rule-valid pairs, {coverage.unmeasured} unmeasured "
          f"({coverage.unmeasured / max(coverage.pairs, 1):.1%}); {coverage.one_kernel} problems with one row "
          f"({time.perf_counter() - start:.1f}s)", flush=True)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    method = model_method(cfg)
    folds = make_folds(cfg.cv, data, int(cfg.seed))[: args.folds]
    results: dict[str, list[dict[str, float]]] = {}
    for i, fold in enumerate(folds):
        t0 = time.perf_counter()
        seed = int(cfg.seed) + i
        pipe, _ = fit_method(method, data, fold.train_shapes, op, cfg, seed)
        test = rows_of(data.groups, fold.test_shapes)
        one = {"measured only": _summary(ev.shape_metrics(data.perf[test], predict(pipe, data.X.iloc[test]),
                                                          _sub(data.groups, test), data.selectable[test]))}
        crow = rows_of(cand.groups, fold.test_shapes)
        groups = _sub(cand.groups, crow)
        scores = predict(pipe, cand.X.iloc[crow])
        rules = cand.selectable[crow]
        runs = predicted_ok(pipe, cand.X.iloc[crow])
        one["whole catalogue"] = _summary(ev.shape_metrics(cand.perf[crow], scores, groups,
                                                           ev.narrowed_mask(rules, runs, groups)[0], measured[crow]))
        train = rows_of(cand.groups, fold.train_shapes)
        features = pipe.named_steps["features"]
        model = failure_estimator(cfg.applicability, seed)
        model.fit(features.transform(cand.X.iloc[train]), (~measured[train]).astype(np.float64))
        estimate = model.predict(features.transform(cand.X.iloc[crow]))
        for t in thresholds:
            mask, fell = ev.narrowed_mask(rules, estimate <= t, groups)
            mask = ev.narrowed_mask(mask, runs, groups)[0]
            r = _summary(ev.shape_metrics(cand.perf[crow], scores, groups, mask, measured[crow]))
            r["fell_back"] = float(fell.mean())
            one[f"mask t={t:g}"] = r
        if args.inner:
            from ckpred.fitting import fit_applicability

            fitted = fit_applicability(cand, fold.train_shapes, data, op, ev_cfg(cfg, args.inner), seed, pipe)
            mask, fell = ev.narrowed_mask(rules, fitted.applicable(pipe, cand.X.iloc[crow]), groups)
            mask = ev.narrowed_mask(mask, runs, groups)[0]
            r = _summary(ev.shape_metrics(cand.perf[crow], scores, groups, mask, measured[crow]))
            r["fell_back"] = float(fell.mean())
            r["threshold"] = fitted.threshold
            one["mask (inner)"] = r
        for name, r in one.items():
            results.setdefault(name, []).append(r)
        print(f"fold {i}: {len(fold.test_shapes)} test problems, {time.perf_counter() - t0:.1f}s", flush=True)
        for name, r in one.items():
            extra = "".join(f" {k} {v:.4g}" for k, v in r.items() if k in ("fell_back", "threshold"))
            print(f"  {name:16s} mean {100 * r['mean']:6.2f} P10 {100 * r['p10']:6.2f} unmeasured "
                  f"{100 * r['unmeasured']:6.2f}% fallback {100 * r['fallback']:6.2f}{extra}", flush=True)
    print(f"mean ± std over {len(folds)} folds, %:")
    for name, rs in results.items():
        cells = []
        for key in ("mean", "p10", "unmeasured", "fallback"):
            v = np.array([r[key] for r in rs]) * 100
            cells.append(f"{key} {v.mean():6.2f} ± {v.std():4.2f}")
        print(f"  {name:16s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
