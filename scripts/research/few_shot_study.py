"""Few-shot on a new GPU: what a plan of a few measurements on it achieves, replayed offline.

The caches reveal only what a plan asks for (the held-out GPU's measured perf of the planned
rows); every other figure is computed on rows the plan never saw.

* ``kt``: Kernel Tuner convolution, each of the six GPUs held out. The transferred scores are
  those of ``transfer_study.py``'s recipe (plain LightGBM on the op's features with each GPU's
  own constants, blended with the static order at the weight an inner leave-one-GPU-out split
  chose) and of its parts. A plan is k configurations to time on the new GPU; the result is
  the best of them (perf / the GPU's optimum; a configuration that fails to run is a wasted
  measurement). Plans: the top k of a score; the top k with a minimum distance between the
  picks (diversity in standardised parameter space, sizes on a log2 scale); a portfolio of
  each training GPU's own best configurations topped up from the score; two rounds (half the
  budget from the transferred ranking, then a model refitted with those measurements — pooled
  with the training GPUs, the new GPU's rows weighted — picks the rest); and the guided search
  of :mod:`ckpred.guided_search` (sequential, re-ranked after every measurement).
* ``miopen``: a gfx942 model, then 5% of gfx90a's problems measured (MIOpen's find on them:
  every solver the find-db lists) as the plan chooses, evaluated on the other 95%. Selection:
  random; stratified (direction, dtype and the set of solvers listed); uncertainty (disagreement of the transferred models' picks, and problems listing a
  solver never seen in training); uncertainty within diversity clusters (k-means over the
  problem features, the most uncertain of each cluster). Retraining: target only (the 5%),
  pooled (gfx942 + the 5%, the new rows weighted) and warm start (the gfx942 booster continued
  on the 5%).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python scripts/research/few_shot_study.py kt --budget 10
    OMP_NUM_THREADS=1 python scripts/research/few_shot_study.py miopen --fraction 0.05 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transfer_study as ts  # noqa: E402  (the sibling research script: data, learners, blends)

from ckpred import guided_search as gs  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Kernel Tuner: k measurements on the held-out GPU
# ---------------------------------------------------------------------------------------------
def _standardised(st: ts.Study, rows: np.ndarray) -> np.ndarray:
    params = st.table.loc[rows, ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y", "read_only",
                                 "use_padding", "use_shmem"]].to_numpy(float)
    return gs._standardised(params)


def diverse_top(score: np.ndarray, z: np.ndarray, k: int, min_dist: float) -> list[int]:
    """The best-scored first, then in score order each one at least ``min_dist`` (standardised
    units) from every pick so far; filled in score order when the distance leaves too few."""
    order = np.argsort(-score, kind="stable")
    picks: list[int] = []
    for i in order:
        if len(picks) == k:
            break
        if not picks or np.sqrt(((z[picks] - z[i]) ** 2).sum(1)).min() >= min_dist:
            picks.append(int(i))
    for i in order:
        if len(picks) == k:
            break
        if i not in picks:
            picks.append(int(i))
    return picks


def kt_main(args: argparse.Namespace) -> None:
    st = ts.load_study("kt")
    gpus = list(st.archs)
    k = args.budget
    recipe_args = argparse.Namespace(recipe="plain:base", learners=[])
    results: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, Any]] = {}
    for test in gpus:
        train = [g for g in gpus if g != test]
        tq = st.queries_of(train)
        rows = st.rows_of(st.queries_of([test]))
        perf = st.perf[rows]
        best = perf.max()
        z = _standardised(st, rows)
        static = ts.static_scores(st, tq, rows)
        plain = ts.fit_learner(st, "plain", ts.feature_set(st, "base"), tq, 0)(rows)
        inner = ts.inner_scores(st, train, 0, recipe_args)
        w = ts.choose_weight(inner, ["plain:base"])[1]
        recipe = ts.blend(st, rows, plain, static, w) if w > 0 else plain
        scores = {"recipe": recipe, "plain": plain, "static": np.where(np.isfinite(static), static, -1e9)}

        def eff(picks: list[int]) -> float:
            return float(perf[picks].max() / best)

        res: dict[str, float] = {}
        for name, s in scores.items():
            res[f"top{k} {name}"] = eff(list(np.argsort(-s, kind="stable")[:k]))
            for d in args.min_dist:
                res[f"diverse(d={d:g}) {name}"] = eff(diverse_top(s, z, k, d))
        # portfolio: each training GPU's best configuration, then the recipe's order
        kernel = st.kernel[rows]
        port: list[int] = []
        for g in train:
            gr = st.rows_of(st.queries_of([g]))
            name = st.kernel[gr][int(np.argmax(st.perf[gr]))]
            i = int(np.flatnonzero(kernel == name)[0])
            if i not in port:
                port.append(i)
        for i in np.argsort(-recipe, kind="stable"):
            if len(port) >= k:
                break
            if int(i) not in port:
                port.append(int(i))
        res["portfolio + recipe"] = eff(port[:k])
        # two rounds: half from the recipe (diverse), then plain refitted with them (pooled)
        first = diverse_top(recipe, z, k // 2, args.min_dist[0])
        refit = refit_pooled(st, tq, rows[first], rows, weight=args.kt_weight)
        second = [int(i) for i in np.argsort(-refit, kind="stable") if int(i) not in first][: k - len(first)]
        res["two rounds (recipe, refit pooled)"] = eff(first + second)
        # sequential guided search (re-ranked after each measurement), prior = the recipe's order
        t = np.where(perf > 0, 1.0 / np.where(perf > 0, perf, 1), np.nan)
        prior = -within_rank(recipe)
        order = gs.guided_search(st.table.loc[rows, ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y",
                                                     "read_only", "use_padding", "use_shmem"]].to_numpy(float),
                                 prior, lambda i: t[i], k)
        res["guided search (sequential)"] = eff(order)
        # the switches (use_shmem x read_only) as strata: the recipe's best of each, then diverse top-up
        strata = st.table.loc[rows, ["use_shmem", "read_only"]].astype(str).agg("".join, axis=1).to_numpy()
        strat: list[int] = []
        for value in pd.unique(strata):
            idx = np.flatnonzero(strata == value)
            strat += [int(i) for i in idx[np.argsort(-recipe[idx], kind="stable")[:max(1, k // 5)]]]
        for i in diverse_top(recipe, z, k, args.min_dist[0]):
            if len(strat) >= k:
                break
            if i not in strat:
                strat.append(i)
        res["strata (use_shmem x read_only) + diverse recipe"] = eff(strat[:k])
        results[test] = res
        long = gs.guided_search(st.table.loc[rows, ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y",
                                                    "read_only", "use_padding", "use_shmem"]].to_numpy(float),
                                prior, lambda i: t[i], 400)
        counts[test] = {"w": w, "within 2%": int((perf >= best / 1.02).sum()),
                        "guided to 0.95": gs.evaluations_to_reach(long, t, 1 / 0.95 - 1),
                        "guided to 0.98": gs.evaluations_to_reach(long, t, 1 / 0.98 - 1),
                        "recipe order to 0.98": gs.evaluations_to_reach(list(np.argsort(-recipe, kind="stable")), t,
                                                                        1 / 0.98 - 1)}
        ts.log(f"{test}: " + " ".join(f"{m} {v:.3f}" for m, v in res.items()))
    frame = pd.DataFrame(results)
    frame["min"] = frame.min(1)
    frame["mean"] = frame[gpus].mean(1)
    print(f"\nBest of the k = {k} planned measurements / the held-out GPU's optimum:\n")
    print("| plan | " + " | ".join(gpus) + " | min | mean |")
    print("|" + "---|" * (len(gpus) + 3))
    for m, r in frame.iterrows():
        print(f"| {m} | " + " | ".join(f"{r[g]:.3f}" for g in gpus) + f" | {r['min']:.3f} | {r['mean']:.3f} |")
    print("\nper GPU: the recipe's w, configurations within 2% of the optimum, measurements until the first "
          "within 0.95 / 0.98 of it (guided search with the recipe's prior, at most 400; the recipe's order):")
    for g, c in counts.items():
        print(f"- {g}: {c}")


def within_rank(score: np.ndarray) -> np.ndarray:
    return pd.Series(score).rank(pct=True).to_numpy()


def refit_pooled(st: ts.Study, train_q: np.ndarray, measured_rows: np.ndarray, rows: np.ndarray, *,
                 weight: float) -> np.ndarray:
    """Plain LightGBM refitted on the training GPUs plus the new GPU's measured rows (weighted),
    scoring ``rows``; the measured rows' target is their measured perf."""
    from ckpred.models import build_estimator

    F = st.feature_matrix(st.cfg.features.name)
    base = st.rows_of(train_q)
    X = np.vstack([F[base], F[measured_rows]])
    y = np.concatenate([st.perf[base], st.perf[measured_rows]])
    sw = np.concatenate([np.ones(len(base)), np.full(len(measured_rows), weight)])
    from omegaconf import OmegaConf

    est = build_estimator(OmegaConf.merge(st.cfg.baselines.plain.model, {"early_stopping_rounds": 0}),
                          st.cfg.baselines.plain.target, 0)
    est.fit(X, y, sample_weight=sw)
    return np.asarray(est.predict(F[rows]), dtype=float)


# ---------------------------------------------------------------------------------------------
# MIOpen: 5% of the new GPU's problems measured
# ---------------------------------------------------------------------------------------------
def miopen_main(args: argparse.Namespace) -> None:
    from omegaconf import OmegaConf
    from sklearn.cluster import MiniBatchKMeans

    from ckpred.models import build_estimator, query_sizes, relevance_grades

    st = ts.load_study("miopen", args.sample)
    src_q, tgt_q = st.queries_of(["gfx942"]), st.queries_of(["gfx90a"])
    tgt_rows = st.rows_of(tgt_q)
    feats = ts.feature_set(st, args.features)
    F = st.feature_matrix(feats)
    seen = set(st.kernel[st.rows_of(src_q)])
    records = []
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        # the transferred models (trained on gfx942 only) and their picks on every gfx90a problem
        preds = {lr: ts.fit_learner(st, lr.split(":")[0], ts.feature_set(st, lr.split(":")[1]), src_q, seed)(tgt_rows)
                 for lr in ("plain:base", "rel:tf", "model:tf")}
        q = st.q[tgt_rows]
        picks = {}
        for lr, s in preds.items():
            qs, _ = ts.pick_efficiency(st, tgt_rows, s)
            order = np.lexsort((np.arange(len(tgt_rows)), -s, q))
            first = order[np.r_[0, np.flatnonzero(np.diff(q[order])) + 1]]
            picks[lr] = pd.Series(st.kernel[tgt_rows][first], index=q[first])
        pk = pd.DataFrame(picks).reindex(tgt_q)
        disagree = (pk.nunique(axis=1) - 1).to_numpy(float)  # 0 = all three transferred models agree
        unseen = pd.Series(~np.isin(st.kernel[tgt_rows], list(seen))).groupby(q).any().reindex(tgt_q).to_numpy()
        n_cand = pd.Series(q).value_counts().reindex(tgt_q).to_numpy()
        uncertainty = disagree + 1.0 * unseen + 0.01 * n_cand + 1e-3 * rng.random(len(tgt_q))
        n_pick = int(round(args.fraction * len(tgt_q)))
        # problem features for diversity: the query's first row, standardised
        Pf = F[st.q_first[tgt_q]].astype(np.float64)
        Pf = (Pf - Pf.mean(0)) / np.where(Pf.std(0) > 0, Pf.std(0), 1)
        km = MiniBatchKMeans(n_clusters=n_pick // 4, random_state=seed, n_init=3, batch_size=4096).fit(Pf)
        # strata: direction, dtype and the set of solvers the problem lists; a systematic sample
        # of the stratum-sorted (randomly ordered within stratum) problems is proportional to them
        solver_set = pd.Series(st.kernel[tgt_rows]).groupby(q).agg(lambda x: "|".join(sorted(x))).reindex(tgt_q)
        first_rows = st.q_first[tgt_q]
        stratum = (st.table["direction"].to_numpy()[first_rows].astype(str) + "|"
                   + st.table["dtype"].to_numpy()[first_rows].astype(str) + "|" + solver_set.to_numpy().astype(str))
        order = np.lexsort((rng.random(len(tgt_q)), stratum))
        step = len(tgt_q) / n_pick
        stratified = order[(np.floor(rng.random() * step + step * np.arange(n_pick))).astype(int)]
        # one problem of each of n_pick convolutions drawn at random (the most geometries covered)
        # (its own generator: the other selections draw what they drew before it was added)
        conv_rng = np.random.default_rng([seed, 1])
        conv = st.q_cv_group[tgt_q]
        convs = conv_rng.permutation(np.unique(conv))[:n_pick]
        one_per_conv = np.flatnonzero(np.isin(conv, convs))
        one_per_conv = pd.Series(one_per_conv).groupby(conv[one_per_conv]).agg(
            lambda x: conv_rng.choice(x)).to_numpy()
        selections = {
            "random": rng.choice(len(tgt_q), n_pick, replace=False),
            "one problem per convolution": one_per_conv,
            "stratified (direction, dtype, solver set)": stratified,
            "uncertainty": np.argsort(-uncertainty, kind="stable")[:n_pick],
            "uncertainty within clusters": _per_cluster(km.labels_, uncertainty, n_pick),
        }
        ts.log(f"seed {seed}: {n_pick} of {len(tgt_q)} gfx90a problems; mean disagreement {disagree.mean():.3f}, "
               f"problems with an unseen solver {unseen.mean():.1%}")
        zero_shot_done = False
        for sel_name, sel in selections.items():
            if args.selections and sel_name not in args.selections:
                continue
            measured_q = tgt_q[np.sort(sel)]
            eval_q = np.setdiff1d(tgt_q, measured_q)
            ev_rows = st.rows_of(eval_q)
            m_rows = st.rows_of(measured_q)
            src_rows = st.rows_of(src_q)

            def score(name: str, s: np.ndarray) -> None:
                qs, e = ts.pick_efficiency(st, ev_rows, s)
                d = st.table["direction"].to_numpy()[st.q_first[qs]]
                rec = {"seed": seed, "selection": sel_name, "method": name, "mean": np.nanmean(e),
                       "p10": np.nanpercentile(e, 10)}
                rec.update({f"mean {x}": np.nanmean(e[d == x]) for x in "FBW"})
                records.append(rec)
                ts.log(f"  {sel_name:28s} {name:34s} mean {rec['mean']:.4f} P10 {rec['p10']:.3f}")

            if not zero_shot_done:  # the zero-shot models on the 95% of the first selection
                zero_shot_done = True
                for lr, s in preds.items():
                    score(f"zero-shot {lr}", s[np.isin(tgt_rows, ev_rows)])
            for kind in args.kinds:
                mcfg = OmegaConf.merge(st.cfg.model, dict(args.model_set)) if kind == "model" else OmegaConf.merge(st.cfg.baselines.plain.model,
                                                                            {"early_stopping_rounds": 0})
                tcfg = st.cfg.target if kind == "model" else st.cfg.baselines.plain.target

                def y_of(rows: np.ndarray) -> np.ndarray:
                    if kind == "model":
                        return relevance_grades(st.perf[rows], st.q[rows], n_grades=int(mcfg.relevance_grades),
                                                exponent=float(mcfg.relevance_exponent))
                    return st.perf[rows]

                def fit(rows: np.ndarray, weight: np.ndarray | None = None, init: Any = None) -> Any:
                    est = build_estimator(mcfg, tcfg, seed)
                    kw: dict[str, Any] = {"sample_weight": weight}
                    if kind == "model":
                        kw["group"] = query_sizes(st.q[rows])
                    if init is not None:
                        kw["init_model"] = init
                    est.fit(F[rows], y_of(rows), **kw)
                    return est

                target_only = fit(m_rows)
                score(f"{kind}: target only", target_only.predict(F[ev_rows]))
                pooled_rows = np.concatenate([src_rows, m_rows])
                for wt in args.pool_weights:
                    wts = np.concatenate([np.ones(len(src_rows)), np.full(len(m_rows), wt)])
                    score(f"{kind}: pooled (new rows x{wt:g})", fit(pooled_rows, wts).predict(F[ev_rows]))
                src = fit(src_rows)
                booster = src.booster_ if kind == "model" else src.regressor_.booster_
                if kind == "model":
                    warm = fit(m_rows, init=booster)
                else:
                    warm = build_estimator(mcfg, tcfg, seed)
                    warm.fit(F[m_rows], st.perf[m_rows], init_model=booster)
                score(f"{kind}: warm start", warm.predict(F[ev_rows]))
    res = pd.DataFrame(records)
    out = res.groupby(["selection", "method"]).agg(
        mean=("mean", "mean"), mean_std=("mean", "std"), p10=("p10", "mean"), p10_std=("p10", "std"),
        F=("mean F", "mean"), B=("mean B", "mean"), W=("mean W", "mean")).reset_index()
    print(f"\ngfx90a problems not measured ({1 - args.fraction:.0%}), efficiency of the pick; mean ± std over seeds "
          f"{args.seeds}:\n")
    print("| selection | method | mean | P10 | F | B | W |")
    print("|---|---|---|---|---|---|---|")
    for _, r in out.sort_values(["selection", "mean"], ascending=[True, False]).iterrows():
        print(f"| {r.selection} | {r.method} | {r['mean']:.4f} ± {np.nan_to_num(r.mean_std):.4f} | "
              f"{r.p10:.3f} ± {np.nan_to_num(r.p10_std):.3f} | {r.F:.3f} | {r.B:.3f} | {r.W:.3f} |")


def _per_cluster(labels: np.ndarray, uncertainty: np.ndarray, n_pick: int) -> np.ndarray:
    """Round-robin over clusters, the most uncertain remaining problem of each, until n_pick."""
    frame = pd.DataFrame({"c": labels, "u": uncertainty, "i": np.arange(len(labels))})
    frame = frame.sort_values(["c", "u"], ascending=[True, False])
    frame["r"] = frame.groupby("c").cumcount()
    return frame.sort_values(["r", "u"], ascending=[True, False])["i"].to_numpy()[:n_pick]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=("kt", "miopen"))
    parser.add_argument("--budget", type=int, default=10, help="kt: measurements on the held-out GPU")
    parser.add_argument("--min-dist", default="1.0,1.5,2.0", help="kt: minimum standardised distances to try")
    parser.add_argument("--kt-weight", type=float, default=100.0, help="kt: weight of the new GPU's rows when pooled")
    parser.add_argument("--fraction", type=float, default=0.05, help="miopen: share of gfx90a problems measured")
    parser.add_argument("--sample", type=float, default=1.0, help="miopen: fraction of each find-db's convolutions")
    parser.add_argument("--features", default="tf", help="miopen: feature set of the retrained models")
    parser.add_argument("--pool-weights", default="1,10", help="miopen: weights of the new rows when pooled")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--selections", default="", help="miopen: ;-separated selection names (default all)")
    parser.add_argument("--kinds", default="model,plain", help="miopen: retrained learners")
    parser.add_argument("--model-set", default="", help="miopen: ranker overrides, key=value,key=value")
    args = parser.parse_args(argv)
    args.min_dist = [float(x) for x in args.min_dist.split(",")]
    args.pool_weights = [float(x) for x in args.pool_weights.split(",")]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.selections = [x for x in args.selections.split(";") if x]
    args.kinds = [x for x in args.kinds.split(",") if x]
    args.model_set = [(k, float(v) if "." in v else int(v)) for k, v in
                      (kv.split("=") for kv in args.model_set.split(",") if kv)]
    t = time.perf_counter()
    kt_main(args) if args.table == "kt" else miopen_main(args)
    ts.log(f"done in {time.perf_counter() - t:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
