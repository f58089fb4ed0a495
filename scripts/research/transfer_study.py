"""Zero-shot transfer to a GPU never trained on: leave-one-GPU-out recipes across tables.

Tables (each GPU is one domain; a fold trains on some domains and selects on another):

* ``kt``: Kernel Tuner's convolution caches on six GPUs (MI250X, W6600, W7800, A100, A4000,
  A6000): one problem per GPU, 4,362 configurations; 6 folds, each holding one GPU out.
* ``miopen``: MIOpen's find-dbs of gfx942 (MI300X) and gfx90a (MI210): train on one whole
  find-db, select on the other (both directions), per-problem efficiency.

Every method picks among the same candidates (the held-out problem's rows, the op's validity
rules) and is scored by the efficiency of its pick (best perf / perf of the pick; a failed pick
scores 0). Methods:

* ``random`` (expected), ``static`` (the ``best_static`` order ranked on the training GPUs,
  per the experiment's ``best_static_by``), ``plain`` (the project's plain LightGBM: the log1p
  regressor, early-stopped as the experiment says) and ``model`` (the experiment's ranker), both
  on the op's feature set;
* ``--learners`` (``kind:features``): the ranker (``model``), plain or ``rel`` (plain's trees on
  the per-GPU normalised target log(perf / the problem's best on that GPU)) on the op's set
  (``base``) or the transfer set (``tf`` = ``tests/ops/features/<op>_transfer.yaml``), alone and
  blended half-and-half with the static order (``+static``: the mean of the two within-problem
  rank percentiles);
* ``recipe``: the ``--recipe`` learner blended with the static order, score = (1 - w) * its rank
  percentile + w * the static order's, w in {0, .25, .5, .75, 1} chosen by an inner
  leave-one-GPU-out split of the training GPUs (w = 0 with one training GPU);
* ``auto``: the learner and w chosen together by the inner split.

Features of each GPU's rows use that GPU's own arch config (``hw.*``). Prints markdown tables:
per held-out GPU (and, for MIOpen, per direction and for the problems whose best kernel is
unseen in training) the mean and P10 of the efficiency, mean ± std over seeds.

Usage (from the repository root; ``runs/`` caches the ingested tables)::

    OMP_NUM_THREADS=1 python scripts/research/transfer_study.py kt --seeds 0,1,2
    OMP_NUM_THREADS=1 python scripts/research/transfer_study.py miopen --sample 0.2 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ckpred import evaluate as ev
from ckpred.config import compose
from ckpred.features import build_features
from ckpred.kernels.base import load_op
from ckpred.models import build_estimator, query_sizes, relative_target, relevance_grades
from ckpred.schema import arch_config

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
CACHE = REPO / "runs" / "transfer_study"
OPS = REPO / "tests" / "ops"
KT_GPUS = ("MI250X", "W6600", "W7800", "A100", "A4000", "A6000")
#: MIOpen find-db -> (file, arch config: the GPU the find-db was timed on).
FINDDBS = {"gfx942": ("gfx942130.HIP.fdb.txt.bz2", "gfx942"), "gfx90a": ("gfx90a68.HIP.fdb.txt.bz2", "gfx90a_mi210")}
BLEND_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Data: one table of several domains (GPUs), rows contiguous per query
# ---------------------------------------------------------------------------------------------
@dataclass
class Study:
    name: str
    cfg: Any
    op: Any
    table: pd.DataFrame
    domain: np.ndarray             # per row
    archs: dict[str, Any]          # domain -> arch config
    q: np.ndarray                  # per row: query code 0..nq-1, rows sorted by query
    q_domain: np.ndarray           # per query
    q_first: np.ndarray            # first row of each query
    perf: np.ndarray
    selectable: np.ndarray
    kernel: np.ndarray
    strata: np.ndarray             # per row: the best-static key (kernel@stratum)
    X: pd.DataFrame
    q_cv_group: np.ndarray         # per query: its CV group (what an early-stopping split keeps together)
    features: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nq(self) -> int:
        return len(self.q_first)

    def rows_of(self, queries: np.ndarray) -> np.ndarray:
        mask = np.zeros(self.nq, bool)
        mask[queries] = True
        return np.flatnonzero(mask[self.q])

    def queries_of(self, domains: list[str]) -> np.ndarray:
        return np.flatnonzero(np.isin(self.q_domain, domains))

    def feature_matrix(self, name: str) -> np.ndarray:
        """The feature set ``name`` of every row, each domain's rows with its own arch."""
        if name not in self.features:
            fcfg = compose("train", [f"hydra.searchpath=[file://{OPS}]", f"experiment={self.cfg.experiment_name}",
                                     f"features={name}", "data.path=x"]).features
            out = None
            for d, arch in self.archs.items():
                rows = np.flatnonzero(self.domain == d)
                union = build_features(fcfg, self.op, arch, self.cfg.dtype).fit(self.X.head(8))
                part = np.asarray(union.transform(self.X.iloc[rows]), dtype=np.float32)
                if out is None:
                    out = np.zeros((len(self.X), part.shape[1]), np.float32)
                out[rows] = part
            self.features[name] = out
            log(f"features {name}: {out.shape[1]} columns")
        return self.features[name]


def _cached_table(cfg: Any, name: str) -> pd.DataFrame:
    from ckpred.data import load_table

    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    table = load_table(cfg)
    table.to_parquet(path)
    return table


def load_study(name: str, sample: float = 1.0, sample_seed: int = 0) -> Study:
    if name == "kt":
        path = f"[{DATA}/kernel_tuner_amd/*.json.gz,{DATA}/kernel_tuner_nvidia/*.json.gz]"
        cfg = compose("train", [f"hydra.searchpath=[file://{OPS}]", "experiment=kernel_tuner_amd",
                                f"data.path={path}", "model.n_jobs=1"])
        table = _cached_table(cfg, "kt")
        table["domain"] = table["gpu"].astype(str)
        archs = {g: arch_config(str(table.loc[table.domain == g, "arch"].iloc[0])) for g in KT_GPUS}
        experiment = "kernel_tuner_amd"
    elif name == "miopen":
        parts = []
        for d, (file, _) in FINDDBS.items():
            cfg = compose("train", [f"hydra.searchpath=[file://{OPS}]", "experiment=miopen_gfx942",
                                    f"data.path={DATA}/miopen_find_db/{file}", "model.n_jobs=1"])
            parts.append(_cached_table(cfg, d).assign(domain=d))
        table = pd.concat(parts, ignore_index=True)
        archs = {d: arch_config(a) for d, (_, a) in FINDDBS.items()}
        experiment = "miopen_gfx942"
    else:
        raise SystemExit(f"unknown table {name!r}: kt or miopen")
    cfg.experiment_name = experiment  # type: ignore[attr-defined]  # the study's label, beside the config
    op = load_op(cfg.op)
    if sample < 1.0:
        # a seeded sample of each domain's CV groups (a convolution's problems stay together)
        group = op.cv_group_keys(table).astype(str) + "|" + table["domain"]
        keys = pd.unique(group)
        rng = np.random.default_rng(sample_seed)
        keep = set(rng.choice(keys, size=max(1, int(round(sample * len(keys)))), replace=False))
        table = table[group.isin(keep).to_numpy()]
    qkey = op.shape_keys(table).astype(str).to_numpy() + "|" + table["domain"].to_numpy()
    codes, _ = pd.factorize(qkey)
    order = np.argsort(codes, kind="stable")
    table = table.iloc[order].reset_index(drop=True)
    q = codes[order].astype(np.int64)
    # renumber queries in row order
    q = pd.factorize(q)[0].astype(np.int64)
    q_first = np.r_[0, np.flatnonzero(np.diff(q)) + 1]
    domain = table["domain"].to_numpy(dtype=object)
    perf = ev.measured_perf(table["tflops"].to_numpy(), table["is_valid"].to_numpy())
    selectable = np.ones(len(table), bool)
    for d, arch in archs.items():
        rows = np.flatnonzero(domain == d)
        sub = table.iloc[rows]
        ok, _ = op.validity(sub[list(op.problem_names)], sub[list(op.kernel_names)], arch=arch, dtype=cfg.dtype,
                            layout=cfg.layout)
        selectable[rows] = ok
    by = ev.best_static_by(cfg.baselines, op)
    strata = ev.static_keys(table, np.arange(len(table)), by)
    X = op.encode_frame(table)
    q_cv_group = pd.factorize(op.cv_group_keys(table.iloc[q_first]).astype(str).to_numpy()
                              + "|" + domain[q_first])[0]
    log(f"{name}: {len(table):,} rows, {len(q_first):,} problems, domains "
        + ", ".join(f"{d} {int((domain[q_first] == d).sum()):,}" for d in archs))
    return Study(name, cfg, op, table, domain, archs, q, domain[q_first], q_first, perf, selectable,
                 table["kernel_name"].to_numpy(dtype=object), np.asarray(strata, dtype=object), X, q_cv_group)


# ---------------------------------------------------------------------------------------------
# Scores and their evaluation
# ---------------------------------------------------------------------------------------------
def pick_efficiency(st: Study, rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, efficiency of the pick) over the queries of ``rows`` (``scores`` row-aligned
    with ``rows``); ties keep table order, NaN ranks last, unselectable rows are never picked."""
    q = st.q[rows]
    s = np.where(np.isnan(scores), -np.inf, scores)
    s = np.where(st.selectable[rows], s, -np.inf)
    order = np.lexsort((np.arange(len(rows)), -s, q))
    starts = np.r_[0, np.flatnonzero(np.diff(q[order])) + 1]
    picked = order[starts]
    best = pd.Series(st.perf[rows]).groupby(q).max()
    qs = q[picked]
    b = best.loc[qs].to_numpy()
    eff = np.where(b > 0, st.perf[rows][picked] / np.where(b > 0, b, 1), np.nan)
    return qs, eff


def random_efficiency(st: Study, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = st.q[rows]
    frame = pd.DataFrame({"q": q, "p": st.perf[rows]})
    best = frame.groupby("q")["p"].transform("max")
    frame["e"] = np.where(best > 0, frame["p"] / best.where(best > 0, 1), np.nan)
    out = frame.groupby("q")["e"].mean()
    return out.index.to_numpy(), out.to_numpy()


def within_query_rank(q: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Percentile rank of each score among its query's rows (1 = best; -inf and NaN lowest)."""
    s = np.where(np.isfinite(scores), scores, -1e300)
    return pd.Series(s).groupby(q).rank(method="average", pct=True).to_numpy()


def static_scores(st: Study, train_q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    train_rows = st.rows_of(train_q)
    groups = ev.ShapeGroups.from_keys(st.q[train_rows])
    s, _ = ev.best_static_scores(st.strata[train_rows], st.perf[train_rows], groups, st.strata[rows])
    return s


def fit_learner(st: Study, kind: str, feats: str, train_q: np.ndarray, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """Fit ``kind`` (model | plain | rel) on the training queries; returns rows -> scores."""
    cfg = st.cfg
    F = st.feature_matrix(feats)
    rows = st.rows_of(train_q)
    # a query without any valid kernel carries no ranking signal (as ckpred.fitting.training_rows)
    best = pd.Series(st.perf[rows]).groupby(st.q[rows]).transform("max").to_numpy()
    rows = rows[best > 0]
    codes = st.q[rows]
    if kind == "model":
        model_cfg, target_cfg = cfg.model, cfg.target
        y = relevance_grades(st.perf[rows], codes, n_grades=int(model_cfg.relevance_grades),
                             exponent=float(model_cfg.relevance_exponent))
        est = build_estimator(model_cfg, target_cfg, seed)
        est.fit(F[rows], y, group=query_sizes(codes))
    elif kind in ("plain", "rel"):
        # the project's plain LightGBM (baselines.plain: early-stopped on a seeded share of the
        # training CV groups when the experiment says so); rel = the same trees on the per-GPU
        # normalised target log(perf / best of the problem)
        model_cfg = cfg.baselines.plain.model
        if kind == "plain":
            target_cfg, y = cfg.baselines.plain.target, st.perf[rows]
        else:
            from omegaconf import OmegaConf

            target_cfg = OmegaConf.create({"name": "relative", "floor": 1e-3})
            y = relative_target(st.perf[rows], codes, floor=1e-3)
        est = build_estimator(model_cfg, target_cfg, seed)
        rounds = int(model_cfg.early_stopping_rounds)
        if rounds > 0 and len(np.unique(st.q_cv_group[train_q])) >= 2:
            import lightgbm as lgb
            from sklearn.model_selection import GroupShuffleSplit

            qs = np.unique(codes)
            split = GroupShuffleSplit(n_splits=1, test_size=float(model_cfg.validation_fraction), random_state=seed)
            _, val_pos = next(split.split(qs, groups=st.q_cv_group[qs]))
            val = np.isin(codes, qs[val_pos])
            yv = np.log1p(np.maximum(y[val], 0)) if target_cfg.name == "log1p" else y[val]
            est.fit(F[rows[~val]], y[~val], eval_X=(F[rows[val]],), eval_y=(yv,),
                    callbacks=[lgb.early_stopping(rounds, first_metric_only=True, verbose=False)])
        else:
            est.fit(F[rows], y)
    else:
        raise ValueError(kind)
    return lambda test_rows: np.asarray(est.predict(F[test_rows]), dtype=np.float64)


def blend(st: Study, rows: np.ndarray, model: np.ndarray, static: np.ndarray, w: float) -> np.ndarray:
    q = st.q[rows]
    return (1 - w) * within_query_rank(q, model) + w * within_query_rank(q, static)


# ---------------------------------------------------------------------------------------------
# Folds
# ---------------------------------------------------------------------------------------------
@dataclass
class FoldResult:
    test: str
    queries: np.ndarray
    eff: dict[str, np.ndarray]           # method -> efficiency per test query (queries order)
    chosen: dict[str, Any] = field(default_factory=dict)


def run_fold(st: Study, train: list[str], test: str, seed: int, args: argparse.Namespace) -> FoldResult:
    train_q = st.queries_of(train)
    test_q = st.queries_of([test])
    rows = st.rows_of(test_q)
    out: dict[str, np.ndarray] = {}
    chosen: dict[str, Any] = {}

    def put(name: str, scores: np.ndarray | None = None, pair: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        qs, eff = pair if pair is not None else pick_efficiency(st, rows, scores)
        out[name] = pd.Series(eff, index=qs).reindex(test_q).to_numpy()

    put("random", pair=random_efficiency(st, rows))
    static = static_scores(st, train_q, rows)
    put("static", static)
    fits: dict[str, np.ndarray] = {}
    for learner in dict.fromkeys(["plain:base", "model:base", args.recipe, *args.learners]):
        kind, feats = learner.split(":")
        fits[learner] = fit_learner(st, kind, feature_set(st, feats), train_q, seed)(rows)
        put({"plain:base": "plain", "model:base": "model"}.get(learner, learner), fits[learner])
    for learner in args.learners:
        put(f"{learner}+static", blend(st, rows, fits[learner], static, 0.5))
    # the recipe: its learner blended with the static order, w by an inner leave-one-GPU-out
    # split of the training GPUs; with one training GPU there is no split and w = 0
    inner = inner_scores(st, train, seed, args) if len(train) >= 2 else None
    w = choose_weight(inner, [args.recipe])[1] if inner is not None else 0.0
    chosen["recipe_w"] = w
    put("recipe", blend(st, rows, fits[args.recipe], static, w) if w > 0 else fits[args.recipe])
    # for comparison: learner and w chosen together by the inner split
    if inner is not None:
        learner, w = choose_weight(inner, list(dict.fromkeys([args.recipe, *args.learners])))
        chosen["auto"] = (learner, w)
        put("auto", blend(st, rows, fits[learner], static, w))
    return FoldResult(test, test_q, out, chosen)


def feature_set(st: Study, short: str) -> str:
    """``base`` = the experiment's feature set, ``tf`` = ``<op>_transfer``, else the name itself."""
    return {"base": st.cfg.features.name, "tf": f"{st.op.name}_transfer"}.get(short, short)


def inner_scores(st: Study, train: list[str], seed: int, args: argparse.Namespace) -> dict[tuple[str, float], float]:
    """Mean efficiency of each (learner, w) over an inner leave-one-GPU-out split of ``train``."""
    per: dict[tuple[str, float], list[float]] = {}
    for held in train:
        inner_train = [d for d in train if d != held]
        tq = st.queries_of(inner_train)
        rows = st.rows_of(st.queries_of([held]))
        static = static_scores(st, tq, rows)
        for learner in dict.fromkeys([args.recipe, *args.learners]):
            kind, feats = learner.split(":")
            pred = fit_learner(st, kind, feature_set(st, feats), tq, seed)(rows)
            for w in BLEND_WEIGHTS:
                _, eff = pick_efficiency(st, rows, blend(st, rows, pred, static, w))
                per.setdefault((learner, w), []).append(float(np.nanmean(eff)))
    return {k: float(np.mean(v)) for k, v in per.items()}


def choose_weight(inner: dict[tuple[str, float], float], kinds: list[str]) -> tuple[str, float]:
    # the best inner mean; among equals (within 1e-9) the smaller w (the model over the static order)
    cands = [(k, w) for (k, w) in inner if k in kinds]
    top = max(inner[c] for c in cands)
    return min((c for c in cands if inner[c] >= top - 1e-9), key=lambda c: (c[1], kinds.index(c[0])))


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------
def summary(values: np.ndarray) -> tuple[float, float]:
    v = values[~np.isnan(values)]
    return (float(v.mean()), float(np.percentile(v, 10))) if len(v) else (float("nan"), float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=("kt", "miopen"))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--sample", type=float, default=1.0, help="MIOpen: fraction of each find-db's convolutions")
    parser.add_argument("--learners", default="model:tf,rel:tf,plain:tf",
                        help="learners of the recipe as kind:features (kind model = the ranker, rel = relative "
                             "regressor, plain; features base = the op's set, tf = <op>_transfer, or a set's name)")
    parser.add_argument("--recipe", default="plain:base", help="the recipe's learner (kind:features)")
    parser.add_argument("--tasks", default="", help="MIOpen: gfx942>gfx90a,gfx90a>gfx942 (default both)")
    parser.add_argument("--out", type=Path, default=None, help="write per-query efficiencies (parquet) here")
    args = parser.parse_args(argv)
    args.learners = [s for s in args.learners.split(",") if s]
    seeds = [int(s) for s in args.seeds.split(",")]
    st = load_study(args.table, args.sample)
    domains = list(st.archs)
    if args.table == "kt":
        tasks = [([d for d in domains if d != t], t) for t in domains]
    else:
        pairs = [s.split(">") for s in (args.tasks or "gfx942>gfx90a,gfx90a>gfx942").split(",")]
        tasks = [([a], b) for a, b in pairs]
    records = []
    for seed in seeds:
        for train, test in tasks:
            t0 = time.perf_counter()
            r = run_fold(st, train, test, seed, args)
            log(f"seed {seed} {'+'.join(train) if len(train) < 3 else 'others'} -> {test}: "
                + " ".join(f"{m} {np.nanmean(e):.3f}" for m, e in r.eff.items()) + f"  chosen {r.chosen} "
                f"({time.perf_counter() - t0:.0f}s)")
            frame = pd.DataFrame(r.eff)
            frame.insert(0, "query", r.queries)
            frame.insert(0, "test", test)
            frame.insert(0, "seed", seed)
            frame["chosen"] = json.dumps({k: v for k, v in r.chosen.items()})
            records.append(frame)
    res = pd.concat(records, ignore_index=True)
    # per-query context: direction, dtype, best kernel seen in training?
    qf = st.q_first[res["query"].to_numpy()]
    for col in ("direction", "dtype"):
        if col in st.table:
            res[col] = st.table[col].to_numpy()[qf]
    res["best_unseen"] = _best_unseen(st, res, tasks)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        res.to_parquet(args.out)
    report(res, args.table)
    return 0


def _best_unseen(st: Study, res: pd.DataFrame, tasks: list[tuple[list[str], str]]) -> np.ndarray:
    out = np.zeros(len(res), bool)
    best_row = pd.Series(st.perf).groupby(st.q).idxmax().to_numpy()
    for train, test in tasks:
        seen = set(st.kernel[st.rows_of(st.queries_of(train))])
        sel = (res["test"] == test).to_numpy()
        out[sel] = [st.kernel[best_row[q]] not in seen for q in res.loc[sel, "query"]]
    return out


def report(res: pd.DataFrame, table: str) -> None:
    methods = [c for c in res.columns if c not in ("seed", "test", "query", "chosen", "direction", "dtype",
                                                   "best_unseen")]
    seeds = sorted(res["seed"].unique())

    def cell(sub: pd.DataFrame, m: str, over: str) -> str:
        per_seed = []
        for s in seeds:
            x = sub[sub["seed"] == s]
            if over == "gpu":  # mean over held-out GPUs of each GPU's mean
                per_seed.append((x.groupby("test")[m].mean().mean(), float("nan")))
            else:
                per_seed.append(summary(x[m].to_numpy(dtype=float)))
        means = np.array([p[0] for p in per_seed])
        p10s = np.array([p[1] for p in per_seed])
        txt = f"{means.mean():.4f} ± {means.std():.4f}"
        if over != "gpu":
            txt += f" (P10 {p10s.mean():.3f})"
        return txt

    if table == "kt":
        print("\n| method | " + " | ".join(KT_GPUS) + " | mean over GPUs (± over seeds) | min over seeds of the mean |")
        print("|" + "---|" * (len(KT_GPUS) + 3))
        for m in methods:
            per_gpu = [f"{res[res.test == g][m].mean():.3f}" for g in KT_GPUS]
            seed_means = res.groupby(["seed", "test"])[m].mean().groupby("seed").mean()
            print(f"| {m} | " + " | ".join(per_gpu) + f" | {cell(res, m, 'gpu')} | {seed_means.min():.4f} |")
        print("\nchosen (learner, w) per fold and seed:", res.groupby(["seed", "test"])["chosen"].first().to_dict())
        return
    for test in sorted(res["test"].unique()):
        sub = res[res["test"] == test]
        cols = ["all"] + sorted(sub["direction"].unique()) + ["best unseen", "best seen"]
        print(f"\n**-> {test}** ({sub[sub.seed == seeds[0]].shape[0]:,} problems; best kernel unseen in training on "
              f"{sub[sub.seed == seeds[0]]['best_unseen'].mean():.1%})\n")
        print("| method | " + " | ".join(cols) + " |")
        print("|" + "---|" * (len(cols) + 1))
        for m in methods:
            cells = [cell(sub, m, "all")]
            cells += [cell(sub[sub["direction"] == d], m, "all") for d in cols[1:-2]]
            cells += [cell(sub[sub["best_unseen"]], m, "all"), cell(sub[~sub["best_unseen"]], m, "all")]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print("chosen:", sub.groupby("seed")["chosen"].first().to_dict())


if __name__ == "__main__":
    raise SystemExit(main())
