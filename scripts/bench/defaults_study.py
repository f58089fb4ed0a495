"""Defaults chosen by evidence across tables: objectives and their settings on every real table.

For each table (the simulator's default run, CK grouped-conv Protocols A and B, the CK GEMM
parity sweep, and any declared op table passed with ``--table``) and each seed, the folds of
``ckpred train`` are built once and every variant below is fitted on the same training rows of
the same folds (:func:`ckpred.fitting.fit_method`), so the figures differ only by the model.
Features are computed once per table (the feature step is stateless) and cached on disk; the
fit times are LightGBM's alone, as CPU seconds of this process (its threads included) and as
wall seconds.

Variants (``VARIANTS``): ``plain`` (LightGBM's default regressor on log1p(TFLOPS), early
stopping on inner CV groups: the reference every default is held against), the table's
recipe as configured, lambdarank at relevance exponents 0.5 / 1 / 3, linear label gain,
``rank_xendcg``, early stopping, more trees, and log1p / relative regressors.

Prints a markdown table: per table and variant, mean ± std over seeds of mean efficiency,
P10, the failed-pick rate and the fit time, and the difference to ``plain`` (mean and P10, in
points), then the verdict of each variant against the robustness bar (never more than 0.3
points of mean or 1 point of P10 below ``plain`` on any table, fit time within 1.5x).

Usage (from the repository root)::

    python scripts/bench/defaults_study.py --seeds 0,1,2 [--tables sim,convA,convB,gemm_parity]
        [--variants plain,rank_e1,...] [--out runs/defaults_study]
    python scripts/bench/defaults_study.py --table 'name=op=miopen_fwd data.path=...'   # more tables
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

REPO = Path(__file__).resolve().parents[2]
CONV = "data/ck_grouped_conv_fwd_bf16_gfx950"

#: Table name -> train overrides (relative to the repository root).
TABLES: dict[str, list[str]] = {
    "sim": [],
    "convA": ["experiment=ck_conv_gfx950", f"data.path={CONV}/training_data_forward_bf16_20.csv", "cv=external",
              "cv.data.source=path", f"cv.data.path={CONV}/benchmark_forward_300_bf16_gfx950.csv", "cv.data.format=csv"],
    "convB": ["experiment=ck_conv_gfx950", f"data.path={CONV}/benchmark_forward_300_bf16_gfx950.csv"],
    # 32 fp16 kernels x 4 shapes, measured twice (merged by median), gfx942: leave one shape out
    "gemm_parity": ["data=path", "data.path=data/ck_gemm_gfx950_results/parity_sweep_results*.csv", "arch=gfx942",
                    "dtype=fp16", "cv.n_splits=4"],
}

#: The same tree settings for every learned variant: LightGBM's defaults (lr 0.1, 31 leaves,
#: min_child_samples 20, every feature), so variants differ by objective, target and tree count.
TREES = ["model.learning_rate=0.1", "model.num_leaves=31", "model.max_depth=-1", "model.min_child_samples=20",
         "model.colsample_bytree=1.0", "model.subsample=1.0", "model.subsample_freq=0"]
RANKER = ["model=lgbm_ranker", *TREES]
#: Variant -> overrides on top of the table's. ``recipe`` is the table's recipe as configured:
#: the CK conv experiment's own (pinned) recipe on convA/convB, the default model elsewhere.
VARIANTS: dict[str, list[str]] = {
    "plain": ["model=lgbm_regressor", "target=log1p", *TREES, "model.n_estimators=100",
              "model.early_stopping_rounds=20"],
    "recipe": [],
    "rank_e3": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=3"],
    "rank_e1": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=1"],
    "rank_e05": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=0.5"],
    "rank_e1_linear": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=1", "model.label_gain=linear"],
    "xendcg_e1": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=1", "model.objective=rank_xendcg"],
    "xendcg_e05": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=0.5", "model.objective=rank_xendcg"],
    "xendcg_e3": [*RANKER, "model.n_estimators=100", "model.relevance_exponent=3", "model.objective=rank_xendcg"],
    "rank_e1_50": [*RANKER, "model.n_estimators=50", "model.relevance_exponent=1"],
    "rank_e1_50_q256": [*RANKER, "model.n_estimators=50", "model.relevance_exponent=1", "model.max_rows_per_query=256"],
    "rank_e1_es": [*RANKER, "model.n_estimators=300", "model.relevance_exponent=1", "model.early_stopping_rounds=20"],
    "rank_e1_200": [*RANKER, "model.n_estimators=200", "model.relevance_exponent=1"],
    "rank_e1_400": [*RANKER, "model.n_estimators=400", "model.relevance_exponent=1"],
    "log1p_100": ["model=lgbm_regressor", "target=log1p", *TREES, "model.n_estimators=100"],
    "relative_100": ["model=lgbm_regressor", "target=relative", *TREES, "model.n_estimators=100"],
}
#: The robustness bar (points of efficiency, percent) and the time bar against ``plain``.
MAX_MEAN_DROP, MAX_P10_DROP, MAX_TIME_RATIO = 0.3, 1.0, 1.5


def identity_build(recipe: Any, op: Any, arch: Any, dtype: Any) -> Pipeline:
    """The recipe's model behind an identity feature step (the data are featurised already)."""
    from ckpred.models import build_estimator

    return Pipeline([("features", FunctionTransformer()), ("model", build_estimator(recipe.model, recipe.target,
                                                                                      int(recipe.seed)))])


@dataclasses.dataclass
class Table:
    """One table: its config, the prepared train and test data with cached features."""

    name: str
    overrides: list[str]
    cfg: Any
    op: Any
    data: Any
    test: Any


def featurise(cfg: Any, op: Any, prepared: Any, cache: Path) -> Any:
    """``prepared`` with X replaced by the features of its rows (cached by table hash and feature set)."""
    from ckpred.data.table import data_hash
    from ckpred.models import build_pipeline

    key = hashlib.sha256(f"{data_hash(prepared.table)}|{json.dumps(_plain(cfg.features), sort_keys=True)}|"
                         f"{cfg.arch.name}|{cfg.dtype.name}|{cfg.layout.name}".encode()).hexdigest()[:16]
    path = cache / f"features-{key}.npy"
    if path.exists():
        Xt = np.load(path)
    else:
        features = build_pipeline(cfg, op, cfg.arch, cfg.dtype).named_steps["features"]
        Xt = np.asarray(features.fit_transform(prepared.X), dtype=np.float64)
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, Xt)
    return dataclasses.replace(prepared, X=pd.DataFrame(Xt))


def _plain(node: Any) -> Any:
    return dataclasses.asdict(node)


def load(name: str, overrides: list[str], cache: Path) -> Table:
    from ckpred.config import compose
    from ckpred.cv import External
    from ckpred.data import load_table
    from ckpred.fitting import prepare
    from ckpred.kernels.base import load_op

    cfg = compose("train", overrides)
    op = load_op(cfg.op)
    data = featurise(cfg, op, prepare(load_table(cfg), op, cfg), cache)
    test = data
    if cfg.cv.name == "external":
        test = featurise(cfg, op, prepare(load_table(External(cfg.cv).data_config(cfg)), op, cfg), cache)
    return Table(name, overrides, cfg, op, data, test)


def run_variant(table: Table, variant: list[str], seed: int) -> dict[str, float]:
    """Out-of-fold summary of one variant at one seed (same folds as ``ckpred train``)."""
    from ckpred import evaluate as ev
    from ckpred.config import compose
    from ckpred.cv import make_folds
    from ckpred.fitting import LearnedMethod, fit_method, predict, recipe_config, rows_of

    cfg = compose("train", [*table.overrides, *variant, f"seed={seed}"])
    method = LearnedMethod("model", recipe_config(cfg, cfg.features, cfg.model, cfg.target), cfg.rows)
    folds = make_folds(cfg.cv, table.data, seed, table.test)
    scores = np.full(len(table.test.table), np.nan)
    fit_s, trees = 0.0, []
    cpu_s = 0.0
    for i, fold in enumerate(folds):
        t, c = time.perf_counter(), time.process_time()
        pipe, info = fit_method(method, table.data, fold.train_shapes, table.op, cfg, seed + i, build=identity_build)
        fit_s += time.perf_counter() - t
        cpu_s += time.process_time() - c
        trees.append(info.get("best_iteration") or info["trees"])
        rows = rows_of(table.test.groups, fold.test_shapes)
        scores[rows] = predict(pipe, table.test.X.iloc[rows])
    per_shape = ev.shape_metrics(table.test.perf, scores, table.test.groups, table.test.selectable)
    out = ev.summarize(per_shape)
    return {"mean": out["mean"], "p10": out["p10"], "min": out["min"], "top1": out["top1"],
            "failed_pick": out["failed_pick"], "fit_s": fit_s, "fit_cpu_s": cpu_s, "trees": float(np.mean(trees)),
            "n_shapes": out["n_shapes"]}


def _pm(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    v = np.asarray(values, dtype=float) * scale
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def report(results: dict[str, dict[str, dict[int, dict[str, float]]]], seeds: list[int]) -> str:
    """The markdown table and the verdict of every variant against ``plain``."""
    head = ["table", "variant", "mean %", "P10 %", "min %", "failed picks %", "fit CPU s", "fit wall s", "trees",
            "Δmean vs plain", "ΔP10 vs plain", "CPU / plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdict: dict[str, dict[str, Any]] = {}
    for table, variants in results.items():
        plain = variants.get("plain")
        for name, per_seed in variants.items():
            runs = [per_seed[s] for s in seeds if s in per_seed]
            if not runs:
                continue
            cells = [table, name, _pm([r["mean"] for r in runs]), _pm([r["p10"] for r in runs]),
                     _pm([r["min"] for r in runs], digits=1), _pm([r["failed_pick"] for r in runs]),
                     _pm([r["fit_cpu_s"] for r in runs], scale=1.0, digits=1),
                     _pm([r["fit_s"] for r in runs], scale=1.0, digits=1), f"{np.mean([r['trees'] for r in runs]):.0f}"]
            if plain and name != "plain":
                common = [s for s in seeds if s in per_seed and s in plain]
                dm = np.mean([per_seed[s]["mean"] - plain[s]["mean"] for s in common]) * 100
                dp = np.mean([per_seed[s]["p10"] - plain[s]["p10"] for s in common]) * 100
                ratio = (np.sum([per_seed[s]["fit_cpu_s"] for s in common])
                         / max(np.sum([plain[s]["fit_cpu_s"] for s in common]), 1e-9))
                cells += [f"{dm:+.2f}", f"{dp:+.2f}", f"{ratio:.2f}x"]
                v = verdict.setdefault(name, {"tables": 0, "ahead": 0, "fails": [], "max_ratio": 0.0})
                v["tables"] += 1
                v["ahead"] += int(dm > 0)
                v["max_ratio"] = max(v["max_ratio"], float(ratio))
                if dm < -MAX_MEAN_DROP or dp < -MAX_P10_DROP:
                    v["fails"].append(f"{table} ({dm:+.2f} / {dp:+.2f})")
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Bar: on no table more than {MAX_MEAN_DROP} points of mean or {MAX_P10_DROP} point of P10 below "
              f"plain, ahead of it on most, fit time within {MAX_TIME_RATIO}x of plain's (CPU seconds of the fits, "
              f"summed over folds and seeds: wall time on a shared machine measures the other processes).", ""]
    for name, v in verdict.items():
        ok = not v["fails"] and v["ahead"] * 2 > v["tables"] and v["max_ratio"] <= MAX_TIME_RATIO
        lines.append(f"- {name}: ahead of plain on {v['ahead']}/{v['tables']} tables; "
                     f"{'below the bar on ' + ', '.join(v['fails']) if v['fails'] else 'never below the bar'}; "
                     f"slowest {v['max_ratio']:.2f}x plain -> {'meets' if ok else 'misses'} the bar")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated subset of {list(TABLES)}")
    parser.add_argument("--table", action="append", default=[],
                        help="an extra table: 'name=<override> <override> ...' (train overrides)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "defaults_study")
    parser.add_argument("--resume", action="store_true",
                        help="keep the results already in <out>/results.json and run only what is missing")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    tables = {name: TABLES[name] for name in args.tables.split(",") if name}
    for extra in args.table:
        name, _, rest = extra.partition("=")
        tables[name] = rest.split()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; allowed: {list(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "results.json"
    results: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    if args.resume and partial.exists():
        results = {t: {v: {int(s): r for s, r in runs.items()} for v, runs in variants.items()}
                   for t, variants in json.loads(partial.read_text()).items()}
    for name, overrides in tables.items():
        todo = [(v, s) for v in args.variants.split(",") for s in seeds if s not in results.get(name, {}).get(v, {})]
        if not todo:
            continue
        t = time.perf_counter()
        table = load(name, overrides, args.out / "cache")
        print(f"{name}: {len(table.data.table)} rows, {table.data.groups.n_shapes} shapes "
              f"(test {table.test.groups.n_shapes}), loaded in {time.perf_counter() - t:.0f} s", flush=True)
        for variant, seed in todo:
            r = run_variant(table, VARIANTS[variant], seed)
            results.setdefault(name, {}).setdefault(variant, {})[seed] = r
            print(f"  {variant} seed {seed}: mean {100 * r['mean']:.2f} P10 {100 * r['p10']:.2f} "
                  f"failed {100 * r['failed_pick']:.2f}% fit {r['fit_s']:.1f} s trees {r['trees']:.0f}", flush=True)
            partial.write_text(json.dumps(results, indent=1))
    text = report({t: results[t] for t in tables if t in results}, seeds)
    (args.out / "defaults_study.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
