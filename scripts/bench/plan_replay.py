"""The new-GPU loop replayed offline: plan -> measure -> retrain, the cache revealing only the planned pairs.

Every plan is made by :func:`ckpred.plan.make_plan` (what ``python -m ckpred plan`` runs); a
"measurement" is the planned pair's row of the held-out GPU's table, and nothing else of that
table reaches a plan or a model. Figures are printed as markdown tables.

* ``kt``: Kernel Tuner's convolution caches of six GPUs (MI250X, W6600, W7800, A100, A4000,
  A6000), each held out in turn. The run: the regressor recipe (LightGBM on log1p of perf, 100
  trees of 31 leaves at learning rate 0.1, every row of each training GPU) fitted on the other
  five GPUs, **each GPU's rows featurised with its own arch config** (this script builds the
  per-GPU features itself and fits the same estimator on them; written before the fitting engine
  did so, it gives the same figures on the engine that does). The new GPU's problem is its one
  convolution; the candidates are the 4,362 configurations of the run's table that pass the
  op's rules on its arch. Reported: the best measured configuration / the GPU's optimum, for
  each round schedule (``--schedules``), and the pick of each retraining with the measurements
  (the model's top-1 over every candidate).
* ``miopen``: a gfx942 model (the experiment's ranker on the whole gfx942 find-db), then a
  fraction of gfx90a's problems (MI210, arch ``gfx90a_mi210``) measured -- every solver the
  find-db lists for a planned problem, as MIOpen's find would time them -- in rounds
  (``--rounds``: fractions of the problems per round; the first round is stratified, each later
  one planned with a ranker retrained on the measurements so far, which makes ``plan``'s
  problem order the retrained model's uncertainty), then the final retraining, scored on the
  problems never measured: mean and P10 of the pick's efficiency, per direction, and the mean
  over every problem with the measured ones at 1.

* ``kt-bound``: for each Kernel Tuner GPU, the best configuration within the top ``--budget`` of
  any order built from the other five GPUs' measurements (a bound on plans that take the top of
  such orders).

Usage (from the repository root; ``runs/plan_replay/`` caches the ingested tables, ``--cache``
elsewhere)::

    OMP_NUM_THREADS=1 python scripts/bench/plan_replay.py kt --seeds 0,1,2 [--source recipe]
    OMP_NUM_THREADS=1 python scripts/bench/plan_replay.py kt-bound
    OMP_NUM_THREADS=1 python scripts/bench/plan_replay.py miopen --seeds 0,1,2 --features miopen_conv_transfer \
        --new-overrides model.label_gain=linear
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ckpred import evaluate as ev  # noqa: E402
from ckpred import fitting  # noqa: E402
from ckpred import plan as pl  # noqa: E402
from ckpred.config import compose  # noqa: E402
from ckpred.kernels.base import load_op  # noqa: E402
from ckpred.models import build_pipeline  # noqa: E402
from ckpred.schema import PlanBudgetConfig, arch_config  # noqa: E402

DATA = REPO.parent / "shared" / "data"
OPS = REPO / "tests" / "ops"
CACHE = REPO / "runs" / "plan_replay"
KT_GPUS = ("MI250X", "W6600", "W7800", "A100", "A4000", "A6000")
#: The regressor recipe of the Kernel Tuner run (the zero-shot study's plain LightGBM, every row).
KT_RECIPE = ["model=lgbm_regressor", "target=log1p", "model.n_estimators=100", "model.learning_rate=0.1",
             "model.num_leaves=31", "model.colsample_bytree=1.0", "rows.max_per_shape=0", "model.n_jobs=1"]


# LightGBM's sklearn wrapper warns when a model fitted on a frame predicts an array: the columns are the same
warnings.filterwarnings("ignore", message="X does not have valid feature names")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cached_table(cfg: Any, name: str) -> pd.DataFrame:
    from ckpred.data import load_table

    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    table = load_table(cfg)
    table.to_parquet(path)
    return table


# ---------------------------------------------------------------------------------------------
# Fitting a run: the engine's fit, on features built per GPU
# ---------------------------------------------------------------------------------------------
class _AsIs:
    """A feature step that passes already-featurised rows through."""

    def fit(self, X: Any, y: Any = None) -> "_AsIs":
        return self

    def transform(self, X: Any) -> Any:
        return X

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        return X


def featurise_per_arch(cfg: Any, op: Any, table: pd.DataFrame) -> pd.DataFrame:
    """The recipe's features of every row with its own row's arch config (``arch`` column)."""
    X = op.encode_frame(table)
    out = None
    for a in pd.unique(table["arch"].astype(str)):
        rows = np.flatnonzero(table["arch"].astype(str).to_numpy() == a)
        features = build_pipeline(cfg, op, arch_config(a), cfg.dtype).named_steps["features"].fit(X.head(8))
        part = np.asarray(features.transform(X.iloc[rows]), dtype=np.float32)
        if out is None:
            out = np.zeros((len(X), part.shape[1]), np.float32)
        out[rows] = part
    return pd.DataFrame(out)  # unnamed columns, as the pipeline's feature step hands them to the model


def fit_run(cfg: Any, op: Any, table: pd.DataFrame, seed: int, *, per_arch: bool, init_model: Any = None,
            weight: np.ndarray | None = None) -> pl.Source:
    """What ``train`` would save for ``table`` (its final fit: every shape), as a plan's source.

    ``per_arch``: each row featurised with its own arch (a multi-GPU table); ``init_model``: a
    warm start; ``weight``: per-row sample weights (the pooled retraining's new rows)."""
    from sklearn.pipeline import Pipeline

    table = table.reset_index(drop=True)
    data = fitting.prepare(table, op, cfg)
    method = fitting.model_method(cfg)
    method.validity = None  # no learned failure mask: it does not change which rows are planned
    method.init_model = init_model
    if per_arch:
        data.X = featurise_per_arch(cfg, op, table)

        def build(recipe: Any, op_: Any, arch: Any, dtype: Any) -> Any:
            pipe = build_pipeline(recipe, op_, arch, dtype)
            return Pipeline([("features", _AsIs()), ("model", pipe.named_steps["model"])])
    else:
        build = build_pipeline
    if weight is not None:
        pipe = _fit_weighted(method, data, op, cfg, seed, weight, build)
    else:
        pipe, _ = fitting.fit_method(method, data, np.arange(data.groups.n_shapes), op, cfg, seed, build=build)
    if per_arch:  # the real feature step back in front (plan.model_scores builds it for the new arch)
        features = build_pipeline(cfg, op, cfg.arch, cfg.dtype).named_steps["features"]
        features.fit(op.encode_frame(table).head(8))
        pipe = Pipeline([("features", features), ("model", pipe.named_steps["model"])])
    return pl.Source(REPO, cfg, op, pipe, table)


def fit_recipe(cfg: Any, op: Any, table: pd.DataFrame, seed: int) -> pl.Source:
    """The transfer recipe (what ``train`` saves for a zero-shot run: ``baselines.plain`` blended
    with the training GPUs' static order, w by the inner leave-one-GPU-out split), as a plan's source."""
    from ckpred.transfer import fit_transfer, transfer_method

    table = table.reset_index(drop=True)
    data = fitting.prepare(table, op, cfg)
    model, info = fit_transfer(transfer_method(cfg), data, np.arange(data.groups.n_shapes), op, cfg, seed)
    log(f"transfer recipe on {info['archs']}: w = {model.weight:g}")
    return pl.Source(REPO, cfg, op, model, table)


def _fit_weighted(method: Any, data: Any, op: Any, cfg: Any, seed: int, weight: np.ndarray, build: Any) -> Any:
    """The recipe fitted on every training row with sample weights (no engine path takes weights)."""
    from ckpred.models import query_sizes, training_target

    recipe = method.recipe
    rows = fitting.training_rows(data, np.arange(data.groups.n_shapes), method.rows, max_rows=10 ** 9,
                                 rng=np.random.default_rng(seed))
    codes = data.groups.codes[rows]
    y = training_target(data.perf[rows], codes, recipe.model, recipe.target)
    pipe = build(recipe, op, data.arch, cfg.dtype)
    model = pipe.named_steps["model"]
    kw: dict[str, Any] = {"sample_weight": weight[rows]}
    if recipe.model.name == "lgbm_ranker":
        kw["group"] = query_sizes(codes)
    model.fit(pipe.named_steps["features"].fit_transform(data.X.iloc[rows]), y, **kw)
    return pipe


def reveal(truth: pd.DataFrame, op: Any, plan: pl.Plan) -> pd.DataFrame:
    """The held-out GPU's rows of the planned pairs, in the plan's order: what the harness measured."""
    keys = pd.Series(np.arange(len(truth)), index=(op.shape_keys(truth).astype(str) + "|"
                                                   + truth["kernel_name"].astype(str)).to_numpy())
    want = op.shape_keys(plan.rows).astype(str) + "|" + plan.rows["kernel_name"].astype(str)
    return truth.iloc[keys.loc[want.to_numpy()].to_numpy()]


def perf_of(table: pd.DataFrame) -> np.ndarray:
    return ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())


# ---------------------------------------------------------------------------------------------
# Kernel Tuner: <= 10 measurements on each held-out GPU
# ---------------------------------------------------------------------------------------------
def kt_main(args: argparse.Namespace) -> None:
    path = f"[{DATA}/kernel_tuner_amd/*.json.gz,{DATA}/kernel_tuner_nvidia/*.json.gz]"
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS}]", "experiment=kernel_tuner_amd", f"data.path={path}",
                            *KT_RECIPE])
    op = load_op(cfg.op)
    table = cached_table(cfg, "kt")
    schedules = {s: [int(x) for x in s.split("+")] for s in args.schedules.split(",")}
    records = []
    for seed in args.seeds:
        for gpu in KT_GPUS:
            t0 = time.perf_counter()
            held = table["gpu"].astype(str).to_numpy() == gpu
            truth = table[held].reset_index(drop=True)
            arch = arch_config(str(truth["arch"].iloc[0]))
            source = fit_run(cfg, op, table[~held], seed, per_arch=True) if args.source == "plain" else \
                fit_recipe(cfg, op, table[~held], seed)
            pairs = pl.candidates(source, arch, pd.DataFrame({"gpu": [gpu]}))
            scores = pl.model_scores(source, pairs, arch)
            optimum = perf_of(truth).max()
            rec: dict[str, Any] = {"seed": seed, "gpu": gpu}
            by_name = pd.Series(perf_of(truth), index=truth["kernel_name"].to_numpy())
            rec["zero-shot pick"] = by_name.get(pairs["kernel_name"].iloc[int(np.argmax(scores))], 0.0) / optimum
            for name, rounds in schedules.items():
                for order in args.kernel_orders:
                    measured = truth.iloc[:0]
                    for r in rounds:
                        plan = pl.make_plan(source, pairs, arch, PlanBudgetConfig(total=r), measured=measured,
                                            options=pl.PlanOptions(kernel_order=order, min_distance=args.min_distance,
                                                                   seed=seed), scores=scores)
                        measured = pd.concat([measured, reveal(truth, op, plan)], ignore_index=True)
                    rec[f"{name} ({order})"] = perf_of(measured).max() / optimum
                    if name == args.retrain_schedule and order == "auto":
                        rec.update(kt_retrain(cfg, op, table[~held], measured, source, pairs, arch, by_name,
                                              optimum, seed))
                        rec.update(kt_reach(source, pairs, arch, truth, op, measured, optimum, seed, args))
            records.append(rec)
            log(f"seed {seed} {gpu}: " + ", ".join(f"{k} {v:.3f}" for k, v in rec.items()
                                                  if isinstance(v, float)) + f" ({time.perf_counter() - t0:.0f}s)")
    res = pd.DataFrame(records)
    counts = [c for c in res.columns if c.startswith("measurements to")]
    methods = [c for c in res.columns if c not in ("seed", "gpu", *counts)]
    print("\nBest measured (or picked) configuration / the held-out GPU's optimum; mean over seeds "
          f"{args.seeds} (± the largest std over seeds of any GPU):\n")
    print("| plan | " + " | ".join(KT_GPUS) + " | GPUs >= 0.98 | mean |")
    print("|" + "---|" * (len(KT_GPUS) + 3))
    for m in methods:
        per = res.groupby("gpu")[m].mean().reindex(KT_GPUS)
        sd = res.groupby("gpu")[m].std().max()
        print(f"| {m} | " + " | ".join(f"{v:.3f}" for v in per) + f" | {int((per >= 0.98).sum())} | "
              f"{per.mean():.3f} ± {np.nan_to_num(sd):.3f} |")
    print(f"\nMeasurements until the first within 0.95 / 0.98 of the optimum ({args.retrain_schedule}, then rounds "
          f"of 5; '-' = not within {args.reach_cap}), per seed:\n")
    print("| | " + " | ".join(KT_GPUS) + " |")
    print("|" + "---|" * (len(KT_GPUS) + 1))
    for c in counts:
        cells = [" / ".join("-" if np.isnan(v) else f"{v:.0f}" for v in res[res.gpu == g][c]) for g in KT_GPUS]
        print(f"| {c} | " + " | ".join(cells) + " |")


def kt_reach(source: pl.Source, pairs: pd.DataFrame, arch: Any, truth: pd.DataFrame, op: Any,
             measured: pd.DataFrame, optimum: float, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """Measurements until the first within 0.95 / 0.98 of the optimum: the schedule's, then more
    rounds of 5 planned the same way, up to ``--reach-cap`` (NaN: not reached)."""
    out: dict[str, float] = {}
    steps: list[float] = list(np.maximum.accumulate(perf_of(measured) / optimum))
    while len(steps) < args.reach_cap and steps[-1] < 0.98:
        plan = pl.make_plan(source, pairs, arch, PlanBudgetConfig(total=5), measured=measured,
                            options=pl.PlanOptions(min_distance=args.min_distance, seed=seed))
        new = reveal(truth, op, plan)
        measured = pd.concat([measured, new], ignore_index=True)
        steps += list(np.maximum(steps[-1], np.maximum.accumulate(perf_of(new) / optimum)))
    for level in (0.95, 0.98):
        hit = np.flatnonzero(np.asarray(steps) >= level)
        out[f"measurements to {level:g}"] = float(hit[0] + 1) if len(hit) else float("nan")
    return out


def kt_retrain(cfg: Any, op: Any, old: pd.DataFrame, measured: pd.DataFrame, source: pl.Source, pairs: pd.DataFrame,
               arch: Any, by_name: pd.Series, optimum: float, seed: int) -> dict[str, float]:
    """The second step on Kernel Tuner: each retraining's top-1 over every candidate / the optimum."""
    out: dict[str, float] = {"retrain: best measured": perf_of(measured).max() / optimum}
    pooled = pd.concat([old, measured], ignore_index=True)
    new = (pooled["arch"].astype(str) == str(arch.name)).to_numpy()
    for w in (1.0, 10.0, 100.0):
        src = fit_run(cfg, op, pooled, seed, per_arch=True, weight=np.where(new, w, 1.0))
        s = pl.model_scores(src, pairs, arch)
        out[f"retrain: pooled x{w:g} top-1"] = by_name.get(pairs["kernel_name"].iloc[int(np.argmax(s))], 0.0) / optimum
    from ckpred.models import booster

    warm = fit_run(cfg, op, measured, seed, per_arch=True,
                   init_model=booster(getattr(source.pipeline, "learner", source.pipeline)))
    s = pl.model_scores(warm, pairs, arch)
    out["retrain: warm start top-1"] = by_name.get(pairs["kernel_name"].iloc[int(np.argmax(s))], 0.0) / optimum
    return out


def kt_bound(args: argparse.Namespace) -> None:
    """How far towards a held-out GPU's optimum any order built from the other five GPUs'
    measurements gets within ``--budget`` picks: each source GPU's own order, their mean, the union
    of each one's top k, and the top of random non-negative weightings of the five (Dirichlet 0.3)."""
    path = f"[{DATA}/kernel_tuner_amd/*.json.gz,{DATA}/kernel_tuner_nvidia/*.json.gz]"
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS}]", "experiment=kernel_tuner_amd", f"data.path={path}",
                            *KT_RECIPE])
    table = cached_table(cfg, "kt").assign(perf=lambda t: perf_of(t))
    eff = table.pivot_table(index="kernel_name", columns="gpu", values="perf", aggfunc="max").fillna(0.0)
    eff = eff / eff.max()
    k = args.budget
    print(f"\n| held out | configurations >= 0.95 / 0.9 / 0.8 | rank of its optimum in each source GPU's order "
          f"(best) | best of each source GPU's top {k} | best of the union of each one's top 2 / {k} / 20 / 50 | "
          f"best of the top {k} of {args.weightings:,} weightings |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for gpu in KT_GPUS:
        new, src = eff[gpu], [g for g in KT_GPUS if g != gpu]
        orders = {g: eff[g].sort_values(ascending=False, kind="stable").index for g in src}
        ranks = {g: list(o).index(new.idxmax()) + 1 for g, o in orders.items()}
        tops = {g: new[o[:k]].max() for g, o in orders.items()}
        union = [new[list(set().union(*[set(o[:n]) for o in orders.values()]))].max() for n in (2, k, 20, 50)]
        weighted = eff[src].to_numpy() @ rng.dirichlet(np.full(len(src), 0.3), size=args.weightings).T
        top = np.argpartition(-weighted, k, axis=0)[:k]
        best_w = float(new.to_numpy()[top].max())
        print(f"| {gpu} | {(new >= .95).sum()} / {(new >= .9).sum()} / {(new >= .8).sum()} | "
              + ", ".join(f"{g} {r}" for g, r in ranks.items()) + f" ({min(ranks.values())}) | "
              + ", ".join(f"{g} {v:.3f}" for g, v in tops.items()) + " | "
              + " / ".join(f"{v:.3f}" for v in union) + f" | {best_w:.3f} |")


# ---------------------------------------------------------------------------------------------
# MIOpen: a gfx942 model, then a share of gfx90a's problems measured in rounds
# ---------------------------------------------------------------------------------------------
def miopen_main(args: argparse.Namespace) -> None:
    common = [f"hydra.searchpath=[file://{OPS}]", "experiment=miopen_gfx942", "model.n_jobs=1"]
    cfg_src = compose("train", [*common, f"data.path={DATA}/miopen_find_db/gfx942130.HIP.fdb.txt.bz2"])
    cfg_new = compose("train", [*common, "arch=gfx90a_mi210", *args.new_overrides,
                                f"data.path={DATA}/miopen_find_db/gfx90a68.HIP.fdb.txt.bz2"])
    if args.features:
        cfg_src = compose("train", [*common, f"features={args.features}",
                                    f"data.path={DATA}/miopen_find_db/gfx942130.HIP.fdb.txt.bz2"])
        cfg_new = compose("train", [*common, f"features={args.features}", "arch=gfx90a_mi210", *args.new_overrides,
                                    f"data.path={DATA}/miopen_find_db/gfx90a68.HIP.fdb.txt.bz2"])
    op = load_op(cfg_src.op)
    old = cached_table(cfg_src, "gfx942")
    truth = cached_table(cfg_new, "gfx90a_mi210")
    arch = cfg_new.arch
    log(f"gfx942 {len(old):,} rows; gfx90a {len(truth):,} rows, {op.shape_keys(truth).nunique():,} problems")
    groups = ev.ShapeGroups.from_keys(op.shape_keys(truth).to_numpy())
    perf = perf_of(truth)
    direction = truth["direction"].astype(str).to_numpy()[groups.first_rows()]
    plans = {name: [float(x) for x in spec.split("+")] for name, spec in
             (s.split("=") for s in args.plans.split(";"))}
    records = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        source = fit_run(cfg_src, op, old, seed, per_arch=False)
        pairs = pl.candidates(source, arch, truth[[*op.problem_names, *op.kernel_names]])
        zero = pl.model_scores(source, pairs, arch)
        log(f"seed {seed}: gfx942 model fitted, {len(pairs):,} candidate pairs scored ({time.perf_counter() - t0:.0f}s)")
        assert len(pairs) == len(truth) and (pairs["kernel_name"].to_numpy() == truth["kernel_name"].to_numpy()).all()
        for name, rounds in plans.items():
            t1 = time.perf_counter()
            measured = truth.iloc[:0]
            src = source
            for f in rounds:
                plan = pl.make_plan(src, pairs, arch, PlanBudgetConfig(problems=f), measured=measured,
                                    options=pl.PlanOptions(seed=seed), scores=zero if src is source else None)
                measured = pd.concat([measured, reveal(truth, op, plan)], ignore_index=True)
                src = fit_run(cfg_new, op, measured, seed, per_arch=False)
            done = op.shape_keys(truth).isin(set(op.shape_keys(measured))).to_numpy()
            finals = {"new GPU only": src}
            if name == args.retrain_plan:
                pooled = pd.concat([old, measured], ignore_index=True)
                new = (pooled["arch"].astype(str) == str(arch.name)).to_numpy()
                finals["pooled x1"] = fit_run(cfg_new, op, pooled, seed, per_arch=False)
                finals["pooled x10"] = fit_run(cfg_new, op, pooled, seed, per_arch=False, weight=np.where(new, 10., 1.))
                from ckpred.models import booster

                finals["warm start"] = fit_run(cfg_new, op, measured, seed, per_arch=False,
                                               init_model=booster(source.pipeline))
                records.append(_score(seed, name, "zero-shot (gfx942 model)", zero, perf, groups, done, direction))
                r = records[-1]
                log(f"seed {seed} {name} / zero-shot (gfx942 model): mean {r['mean']:.4f} P10 {r['p10']:.3f} "
                    f"all {r['all']:.4f}")
            for extra in args.finals:
                finals[extra] = fit_run(compose("train", [*common, *(f"features={args.features}",) * bool(args.features),
                                                          "arch=gfx90a_mi210", *FINALS[extra],
                                                          f"data.path={DATA}/miopen_find_db/gfx90a68.HIP.fdb.txt.bz2"]),
                                        op, measured, seed, per_arch=False)
            for how, model in finals.items():
                s = pl.model_scores(model, pairs, arch)
                if args.dump and how == "new GPU only":
                    _dump(args.dump, seed, name, s, perf, groups, done, truth, old, measured, op)
                records.append(_score(seed, name, how, s, perf, groups, done, direction))
                r = records[-1]
                log(f"seed {seed} {name} / {how}: mean {r['mean']:.4f} P10 {r['p10']:.3f} all {r['all']:.4f} "
                    f"({time.perf_counter() - t1:.0f}s)")
    res = pd.DataFrame(records)
    out = res.groupby(["plan", "retraining"], sort=False).agg(
        mean=("mean", "mean"), mean_sd=("mean", "std"), p10=("p10", "mean"), p10_sd=("p10", "std"),
        F=("F", "mean"), B=("B", "mean"), W=("W", "mean"), all=("all", "mean"), n=("measured", "mean"))
    print(f"\ngfx90a problems never measured; efficiency of the pick, mean ± std over seeds {args.seeds}:\n")
    print("| plan (fractions of the problems per round) | retraining | mean | P10 | F | B | W | every problem "
          "(measured = 1) | problems measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (plan_name, how), r in out.iterrows():
        print(f"| {plan_name} | {how} | {r['mean']:.4f} ± {np.nan_to_num(r.mean_sd):.4f} | {r.p10:.3f} ± "
              f"{np.nan_to_num(r.p10_sd):.3f} | {r.F:.3f} | {r.B:.3f} | {r.W:.3f} | {r['all']:.4f} | {r.n:,.0f} |")


#: Final retrainings compared with ``--finals`` (overrides of the new GPU's ranker).
FINALS = {"linear gain": ["model.label_gain=linear"],
          "600 trees of 127 leaves": ["model.n_estimators=600", "model.num_leaves=127"]}


def _dump(path: str, seed: int, plan: str, scores: np.ndarray, perf: np.ndarray, groups: ev.ShapeGroups,
          done: np.ndarray, truth: pd.DataFrame, old: pd.DataFrame, measured: pd.DataFrame, op: Any) -> None:
    """Per problem never measured: its pick's efficiency, best and picked kernel, and what the
    measurements and the source table know of them (for a look at the P10 tail)."""
    s = np.where(np.isfinite(scores), scores, -np.inf)
    order = np.lexsort((np.arange(len(s)), -s, groups.codes))
    first = order[np.r_[0, np.flatnonzero(np.diff(groups.codes[order])) + 1]]
    top = np.lexsort((np.arange(len(perf)), -perf, groups.codes))
    best_row = top[np.r_[0, np.flatnonzero(np.diff(groups.codes[top])) + 1]]
    names = truth["kernel_name"].astype(str).to_numpy()
    m_perf = perf_of(measured)
    m_codes = pd.factorize(op.shape_keys(measured))[0]
    m_best = pd.Series(m_perf).groupby(m_codes).transform("max").to_numpy()
    wins = pd.Series(measured["kernel_name"].astype(str).to_numpy()[m_perf >= m_best]).value_counts()
    seen_m = measured["kernel_name"].astype(str).value_counts()
    seen_src = set(old["kernel_name"].astype(str))
    first_rows = groups.first_rows()
    frame = pd.DataFrame({"seed": seed, "plan": plan, "measured": done[first_rows],
                          "eff": perf[first[np.argsort(groups.codes[first])]] / np.maximum(
                              perf[best_row[np.argsort(groups.codes[best_row])]], 1e-300),
                          "n_cand": np.bincount(groups.codes), "direction": truth["direction"].astype(str).to_numpy()[first_rows],
                          "dtype": truth["dtype"].astype(str).to_numpy()[first_rows],
                          "best": names[best_row[np.argsort(groups.codes[best_row])]],
                          "pick": names[first[np.argsort(groups.codes[first])]]})
    for col in ("best", "pick"):
        frame[f"{col}_in_source"] = frame[col].isin(seen_src)
        frame[f"{col}_measured"] = frame[col].map(seen_m).fillna(0).astype(int)
        frame[f"{col}_wins"] = frame[col].map(wins).fillna(0).astype(int)
    out = Path(path)
    frame.to_parquet(out.with_name(f"{out.stem}_s{seed}_{plan.replace(' ', '_')}{out.suffix}"))


def _score(seed: int, plan: str, how: str, scores: np.ndarray, perf: np.ndarray, groups: ev.ShapeGroups,
           done: np.ndarray, direction: np.ndarray) -> dict[str, Any]:
    """Efficiency of each problem's pick (the best-scored candidate; ties to the earlier row) on
    the problems never measured, and over every problem with the measured ones at 1."""
    s = np.where(np.isfinite(scores), scores, -np.inf)
    order = np.lexsort((np.arange(len(s)), -s, groups.codes))
    first = order[np.r_[0, np.flatnonzero(np.diff(groups.codes[order])) + 1]]
    best = np.zeros(groups.n_shapes)
    np.maximum.at(best, groups.codes, perf)
    eff = np.full(groups.n_shapes, np.nan)
    eff[groups.codes[first]] = np.where(best[groups.codes[first]] > 0, perf[first] / np.where(
        best[groups.codes[first]] > 0, best[groups.codes[first]], 1.0), np.nan)
    measured = done[groups.first_rows()]
    e = eff[~measured]
    ok = ~np.isnan(e)
    d = direction[~measured]
    everything = np.where(measured, 1.0, eff)
    rec = {"seed": seed, "plan": plan, "retraining": how, "mean": float(np.mean(e[ok])),
           "p10": float(np.percentile(e[ok], 10)), "all": float(np.nanmean(everything)),
           "measured": int(measured.sum())}
    rec.update({x: float(np.nanmean(e[d == x])) for x in "FBW"})
    return rec


def main(argv: list[str] | None = None) -> int:
    global CACHE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=("kt", "kt-bound", "miopen"))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--schedules", default="10,5+5,5+3+2,4+3+3,2+2+2+2+2",
                        help="kt: measurements per round, '+'-separated; several schedules comma-separated")
    parser.add_argument("--source", default="plain", choices=("plain", "recipe"),
                        help="kt: the run plans start from: plain LightGBM, or the transfer recipe (the zero-shot default)")
    parser.add_argument("--kernel-orders", default="auto,model", help="kt: plan kernel_order values to replay")
    parser.add_argument("--min-distance", type=float, default=1.0, help="kt: plan min_distance")
    parser.add_argument("--retrain-schedule", default="5+3+2", help="kt: the schedule whose measurements are retrained "
                                                                    "on and continued (rounds of 5) to 0.95 / 0.98")
    parser.add_argument("--reach-cap", type=int, default=400, help="kt: most measurements continued to")
    parser.add_argument("--plans", default="one round=0.05;two rounds=0.025+0.025;four rounds=0.025+0.00833+0.00833+0.00834",
                        help="miopen: name=fractions of the problems per round ('+'), ';'-separated")
    parser.add_argument("--retrain-plan", default="four rounds", help="miopen: the plan whose measurements every "
                                                                      "retraining is compared on")
    parser.add_argument("--features", default="", help="miopen: a feature set of the runs (default the experiment's)")
    parser.add_argument("--finals", default="", help=f"miopen: more final retrainings, ','-separated, of {list(FINALS)}")
    parser.add_argument("--new-overrides", default="", help="miopen: overrides of every retraining on the new "
                                                            "GPU's rows, ','-separated (e.g. model.label_gain=linear)")
    parser.add_argument("--dump", default="", help="miopen: write each plan's per-problem picks to this Parquet path")
    parser.add_argument("--budget", type=int, default=10, help="kt-bound: picks per order")
    parser.add_argument("--weightings", type=int, default=20000, help="kt-bound: random weightings of the sources")
    parser.add_argument("--cache", default=str(CACHE), help="where the ingested tables are cached")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.kernel_orders = [s for s in args.kernel_orders.split(",") if s]
    args.finals = [s for s in args.finals.split(",") if s]
    args.new_overrides = [s for s in args.new_overrides.split(",") if s]
    CACHE = Path(args.cache)
    t = time.perf_counter()
    {"kt": kt_main, "kt-bound": kt_bound, "miopen": miopen_main}[args.table](args)
    log(f"done in {time.perf_counter() - t:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
