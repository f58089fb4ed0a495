"""Quick recipe experiments for grouped_conv_fwd on AMD's gfx950 measurements.

``scripts/bench/conv_proof.py`` runs the real thing (``ckpred.train``, every baseline, one seed).
This script is for trying recipe *variants* the config cannot express (label gains,
lambdarank truncation, extra per-problem features, bagging, extra training data) over
several seeds fast: the ``experiment=ck_conv_gfx950`` features are computed once per protocol
and seed, then each variant fits one LightGBM ranker per fold on the same folds ``train`` uses
(:func:`ckpred.cv.make_folds`) and is scored with :func:`ckpred.evaluate.shape_metrics`.
Figures are the mean over seeds of mean / P10 / min efficiency, in %. ``base`` is the chosen
recipe; it can differ from ``train``'s report by a few hundredths, because ``train`` also
thins and orders the training rows its own way.

Usage (from the repository root)::

    python scripts/research/conv_variants.py                                  # base, protocols T and B, seeds 0-2
    python scripts/research/conv_variants.py --variants base,trunc3,bag5 --protocols T,A,B --seeds 0,1
    python scripts/research/conv_variants.py --list

Protocols as in :mod:`ckpred.data.ck_conv`: T (CV on the training table: where choices are made),
A (train on the training table, test on the benchmark), B (CV on the benchmark).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ckpred.data.ck_conv import BENCH, DIRECTORY, TRAIN, protocol_overrides

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / DIRECTORY


@dataclass
class Context:
    """What one protocol and seed needs: prepared tables, features, folds."""

    cfg: Any
    data: Any
    test: Any
    features: np.ndarray
    test_features: np.ndarray
    names: list[str]
    folds: list[Any]
    #: The fitted ``conv_tile`` group: its hardware and latency constants.
    tile_features: Any

    @property
    def index(self) -> dict[str, int]:
        """Feature name -> column of ``features``."""
        return {name: i for i, name in enumerate(self.names)}


@dataclass
class Fit:
    """One fold's training rows (contiguous per problem) and its test rows."""

    X: np.ndarray
    perf: np.ndarray
    codes: np.ndarray
    X_test: np.ndarray
    test_codes: np.ndarray
    seed: int
    ctx: Context


Variant = Callable[[Fit], np.ndarray]


def load_context(protocol: str, seed: int, data_dir: Path) -> Context:
    """Prepare the protocol's tables and compute the experiment's features once."""
    from ckpred import models
    from ckpred import cv, fitting
    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.kernels.base import load_op

    cfg = compose("train", [*protocol_overrides(protocol, data_dir, Path("unused")), f"seed={seed}"])
    op = load_op(cfg.op)
    data = fitting.prepare(load_table(cfg), op, cfg)
    test = fitting.prepare(load_table(cv.External(cfg.cv).data_config(cfg)), op, cfg) if cfg.cv.name == "external" else data
    features = models.build_pipeline(cfg, op, cfg.arch, cfg.dtype)[:-1]
    X = np.asarray(features.fit_transform(data.X), dtype=np.float64)
    X_test = X if test is data else np.asarray(features.transform(test.X), dtype=np.float64)
    names = [n.split("__", 1)[1] for n in features.get_feature_names_out()]
    return Context(cfg, data, test, X, X_test, names, cv.make_folds(cfg.cv, data, seed, test),
                   features.named_steps["features"].named_transformers["conv_tile"])


def evaluate(ctx: Context, variant: Variant) -> dict[str, float]:
    """Out-of-fold scores of ``variant`` on every fold; the per-problem summary."""
    from ckpred import evaluate as ev
    from ckpred import fitting

    scores = np.full(len(ctx.test.table), np.nan)
    for i, fold in enumerate(ctx.folds):
        rows = fitting.rows_of(ctx.data.groups, fold.train_shapes)
        rows = rows[np.argsort(ctx.data.groups.codes[rows], kind="stable")]  # a query's rows together
        test_rows = fitting.rows_of(ctx.test.groups, fold.test_shapes)
        fit = Fit(ctx.features[rows], ctx.data.perf[rows], ctx.data.groups.codes[rows],
                  ctx.test_features[test_rows], ctx.test.groups.codes[test_rows], int(ctx.cfg.seed) + i, ctx)
        scores[test_rows] = variant(fit)
    return ev.summarize(ev.shape_metrics(ctx.test.perf, scores, ctx.test.groups, ctx.test.selectable))


# ---------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------
def ranker(*, exponent: float | None = None, gain: str = "exp2", **params: Any) -> Variant:
    """The experiment's lambdarank with some parameters changed (LightGBM names)."""

    def fit_predict(fit: Fit) -> np.ndarray:
        from ckpred import models

        cfg = fit.ctx.cfg
        grades = int(cfg.model.relevance_grades)
        y = models.relevance_grades(fit.perf, fit.codes, n_grades=grades,
                                    exponent=float(cfg.model.relevance_exponent if exponent is None else exponent))
        model = models.build_estimator(cfg.model, cfg.target, fit.seed)  # the experiment's ranker (gain 2^g - 1)
        if gain != "exp2":
            model.set_params(label_gain={"linear": [float(g) for g in range(grades)],
                                         "square": [float(g * g) for g in range(grades)]}[gain])
        model.set_params(**params)
        model.fit(fit.X, y, group=models.query_sizes(fit.codes))
        return model.predict(fit.X_test)

    return fit_predict


def with_columns(extra: Callable[[np.ndarray, np.ndarray, Context], np.ndarray] | None = None,
                 drop: tuple[str, ...] = (), inner: Variant | None = None) -> Variant:
    """``inner`` (default: the base ranker) on the features plus ``extra(X, codes, ctx)``
    columns and without the ``drop`` features."""
    inner = inner or ranker()

    def fit_predict(fit: Fit) -> np.ndarray:
        keep = [i for i, name in enumerate(fit.ctx.names) if name not in drop]

        def view(X: np.ndarray, codes: np.ndarray) -> np.ndarray:
            return X[:, keep] if extra is None else np.column_stack([X[:, keep], extra(X, codes, fit.ctx)])

        return inner(Fit(view(fit.X, fit.codes), fit.perf, fit.codes, view(fit.X_test, fit.test_codes),
                         fit.test_codes, fit.seed, fit.ctx))

    return fit_predict


def _minus_query_min(values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    return values - pd.Series(values).groupby(codes).transform("min").to_numpy()


def _per_problem_z(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Scores standardised within each problem (mean 0, std 1), so two models can be added."""
    s = pd.Series(scores)
    by = s.groupby(codes)
    return ((s - by.transform("mean")) / (by.transform("std") + 1e-12)).to_numpy()


def _gemm_view(X: np.ndarray, at: dict[str, int]) -> dict[str, np.ndarray]:
    """The implicit-GEMM sizes of each row, from conv_problem's feature columns."""
    return {"m": X[:, at["gemm_m"]], "n": X[:, at["gemm_n"]], "k": X[:, at["gemm_k"]], "g": X[:, at["g"]]}


def occupancy_columns(X: np.ndarray, codes: np.ndarray, ctx: Context) -> np.ndarray:
    """Waves, wave efficiency, K-loop iterations and the estimate (log2, minus the problem's
    best) with 2 and 4 blocks resident per CU instead of 1: conv_tile's own
    :func:`~ckpred.features.conv.tile_estimates` and constants, over ``blocks x cus`` slots
    (resident blocks share a CU's throughput, so that is the same per-slot arithmetic)."""
    from ckpred.features.base import NumpyOps
    from ckpred.features.conv import tile_estimates

    at, tile = ctx.index, ctx.tile_features
    gemm = _gemm_view(X, at)
    out = []
    for blocks in (2, 4):
        slots = tile.cus * blocks
        est = tile_estimates(gemm, (X[:, at["tile_m"]], X[:, at["tile_n"]], X[:, at["tile_k"]]), NumpyOps(len(X)),
                             dataclasses.replace(tile.estimate_constants(), cus=slots))
        out += [est["waves"], est["output_tiles"] / (est["waves"] * slots), np.log2(est["iterations"]),
                _minus_query_min(np.log2(est["est_us"]), codes)]
    return np.column_stack(out)


def rank_columns(X: np.ndarray, codes: np.ndarray, ctx: Context) -> np.ndarray:
    """Each kernel's analytical estimate ranked within its problem, and distance to the median."""
    at = ctx.index
    est = pd.Series(X[:, at["log2_est_us"]])
    by = est.groupby(codes)
    return np.column_stack([by.rank(pct=True).to_numpy(), (est - by.transform("median")).to_numpy(),
                            _minus_query_min(X[:, at["log2_iterations"]], codes),
                            _minus_query_min(X[:, at["waves"]], codes)])


def alignment_columns(X: np.ndarray, codes: np.ndarray, ctx: Context) -> np.ndarray:
    """gcd of the channels per group (c) and of the filters (k) with 8: vector-load width."""
    at = ctx.index
    return np.column_stack([np.gcd(X[:, at["c"]].astype(np.int64), 8), np.gcd(X[:, at["k"]].astype(np.int64), 8)])


def gather_columns(X: np.ndarray, codes: np.ndarray, ctx: Context) -> np.ndarray:
    """How contiguous a tile's input gathers are: channels per K tile (log2 c / tile_k, whether
    tile_k divides c, the filled share of a K tile by channels) and output rows per M tile
    (log2 and ceil of tile_m / wo), and K-tile over channels for spatial filters."""
    at = ctx.index
    c, tk, tm, wo = X[:, at["c"]], X[:, at["tile_k"]], X[:, at["tile_m"]], X[:, at["wo"]]
    return np.column_stack([np.log2(c / tk), (np.mod(c, tk) == 0).astype(float), np.log2(np.minimum(c, tk) / tk),
                            np.log2(tm / wo), np.ceil(tm / wo), np.log2(tk / c) * (X[:, at["y"]] > 1)])


PIPELINE_COLUMNS = ("lds_buffers", "prefetch_stages", "lds_bytes_est", "lds_ratio")


def two_stage() -> Variant:
    """Tile first, then pipeline: a ranker over each problem's tiles (label: the tile's best
    pipeline, pipeline columns dropped) orders the tiles; the base ranker orders the kernels
    within a tile."""
    inner = ranker()

    def fit_predict(fit: Fit) -> np.ndarray:
        at = fit.ctx.index
        keep = [i for name, i in at.items() if name not in PIPELINE_COLUMNS]
        tile = fit.X[:, at["tile_m"]] * 1e6 + fit.X[:, at["tile_n"]] * 1e3 + fit.X[:, at["tile_k"]]
        rows = pd.DataFrame({"q": fit.codes, "t": tile, "perf": fit.perf, "row": np.arange(len(tile))})
        tiles = rows.groupby(["q", "t"], sort=False).agg(perf=("perf", "max"), row=("row", "first")).reset_index()
        tiles = tiles.sort_values("q", kind="stable")
        tile_score = inner(Fit(fit.X[tiles["row"].to_numpy()][:, keep], tiles["perf"].to_numpy(),
                               tiles["q"].to_numpy(), fit.X_test[:, keep], fit.test_codes, fit.seed, fit.ctx))
        tile_rank = pd.Series(tile_score).groupby(fit.test_codes).rank(method="dense").to_numpy()
        return tile_rank * 1e3 + inner(fit)  # base scores span far less than 1e3

    return fit_predict


def bag(members: int = 5, **params: Any) -> Variant:
    """Mean of ``members`` rankers on different seeds, each score standardised per problem."""
    parts = [ranker(**params) for _ in range(members)]

    def fit_predict(fit: Fit) -> np.ndarray:
        total = np.zeros(len(fit.X_test))
        for j, part in enumerate(parts):
            total += _per_problem_z(part(Fit(fit.X, fit.perf, fit.codes, fit.X_test, fit.test_codes,
                                             fit.seed * 101 + j, fit.ctx)), fit.test_codes)
        return total

    return fit_predict


def plus_training_table(data_dir: Path) -> Variant:
    """The base ranker with every problem of AMD's 20-kernel training table added to each fold's
    training problems (not Protocol B: it asks whether more problems would help B)."""
    cache: dict[int, Context] = {}
    inner = ranker()

    def fit_predict(fit: Fit) -> np.ndarray:
        seed = int(fit.ctx.cfg.seed)
        if seed not in cache:
            cache[seed] = load_context("T", seed, data_dir)
        extra = cache[seed]
        offset = fit.codes.max() + 1
        return inner(Fit(np.vstack([fit.X, extra.features]), np.concatenate([fit.perf, extra.data.perf]),
                         np.concatenate([fit.codes, extra.data.groups.codes + offset]), fit.X_test, fit.test_codes,
                         fit.seed, fit.ctx))

    return fit_predict


def relative_regressor() -> Variant:
    """The experiment's tree shape as a regressor of log(perf / best of the problem)."""

    def fit_predict(fit: Fit) -> np.ndarray:
        from omegaconf import OmegaConf

        from ckpred import models

        cfg = fit.ctx.cfg
        model_cfg = OmegaConf.merge(cfg.model, {"name": "lgbm_regressor"})
        model = models.build_estimator(model_cfg, cfg.target, fit.seed)
        model.fit(fit.X, models.relative_target(fit.perf, fit.codes, floor=float(cfg.target.floor)))
        return model.predict(fit.X_test)

    return fit_predict


def ranker_plus_regressor() -> Variant:
    """Sum of the base ranker's and the relative regressor's per-problem standardised scores."""
    rank, regress = ranker(), relative_regressor()
    return lambda fit: _per_problem_z(rank(fit), fit.test_codes) + _per_problem_z(regress(fit), fit.test_codes)


def monotone_estimate() -> Variant:
    """The base ranker constrained to score a kernel no higher as its analytical slowdown
    against the problem's best tile (``est_vs_best``) grows."""

    def fit_predict(fit: Fit) -> np.ndarray:
        constraints = [0] * fit.X.shape[1]
        constraints[fit.ctx.index["est_vs_best"]] = -1
        return ranker(monotone_constraints=constraints, monotone_constraints_method="advanced")(fit)

    return fit_predict


def _kernel_ids(X: np.ndarray, at: dict[str, int]) -> np.ndarray:
    """One number per kernel: its tile and its pipeline's LDS buffers and prefetch stages."""
    return ((X[:, at["tile_m"]] * 1e3 + X[:, at["tile_n"]]) * 1e3 + X[:, at["tile_k"]]) * 100 \
        + X[:, at["lds_buffers"]] * 10 + X[:, at["prefetch_stages"]]


def per_kernel_cost() -> Variant:
    """The base ranker plus a cost model fitted on the fold's training problems: each kernel's
    median measured time per K-loop iteration of the busiest CU, times its iterations on the
    problem (log2, and log2 over the problem's smallest): the per-tile throughput that the
    peak-based estimate assumes, measured instead."""
    inner = ranker()

    def fit_predict(fit: Fit) -> np.ndarray:
        at = fit.ctx.index
        us = 2.0 ** fit.X[:, at["log2_flops"]] / (fit.perf * 1e6)  # perf is TFLOPS
        ids, test_ids = _kernel_ids(fit.X, at), _kernel_ids(fit.X_test, at)
        per_iteration = pd.Series(us / 2.0 ** fit.X[:, at["log2_iterations"]]).groupby(ids).median()

        def columns(X: np.ndarray, kernels: np.ndarray, codes: np.ndarray) -> np.ndarray:
            cost = np.log2(pd.Series(kernels).map(per_iteration).to_numpy()) + X[:, at["log2_iterations"]]
            return np.column_stack([X, cost, _minus_query_min(cost, codes)])

        return inner(Fit(columns(fit.X, ids, fit.codes), fit.perf, fit.codes,
                         columns(fit.X_test, test_ids, fit.test_codes), fit.test_codes, fit.seed, fit.ctx))

    return fit_predict


def tile_context_columns(X: np.ndarray, codes: np.ndarray, ctx: Context) -> np.ndarray:
    """The problem as every catalogue tile sees it, on each of its kernels' rows: per tile the
    analytical estimate (log2 over the best tile's), log2 of its waves and its wave efficiency —
    so a tree can compare this kernel's tile with the others directly."""
    from ckpred.features.base import NumpyOps
    from ckpred.features.conv import tile_estimates
    from ckpred.kernels.grouped_conv_fwd import TILES_2BYTE

    at, tile = ctx.index, ctx.tile_features
    gemm = _gemm_view(X, at)
    estimates, waves, efficiency = [], [], []
    for rm, rn, rk in TILES_2BYTE:
        est = tile_estimates(gemm, (float(rm), float(rn), float(rk)), NumpyOps(len(X)), tile.estimate_constants())
        estimates.append(np.log2(est["est_us"]))
        waves.append(np.log2(est["waves"]))
        efficiency.append(est["output_tiles"] / (est["waves"] * tile.cus))
    estimates_ = np.column_stack(estimates)
    return np.column_stack([estimates_ - estimates_.min(axis=1, keepdims=True), *waves, *efficiency])


def stacked(inner_folds: int = 4) -> Variant:
    """Two stages: the base ranker's out-of-fold scores on the training problems (``inner_folds``
    folds by problem) become features of a second ranker — the score, its gap to the problem's
    top score, its rank and its per-problem z-score — so the second stage sees each kernel
    against its competitors."""
    base = ranker()

    def context(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
        s = pd.Series(scores)
        by = s.groupby(codes)
        return np.column_stack([scores, (s - by.transform("max")).to_numpy(),
                                by.rank(ascending=False).to_numpy(), _per_problem_z(scores, codes)])

    def fit_predict(fit: Fit) -> np.ndarray:
        problems = np.unique(fit.codes)
        np.random.default_rng(fit.seed).shuffle(problems)
        oof = np.zeros(len(fit.X))
        for part in np.array_split(problems, inner_folds):
            held = np.isin(fit.codes, part)
            oof[held] = base(Fit(fit.X[~held], fit.perf[~held], fit.codes[~held], fit.X[held], fit.codes[held],
                                 fit.seed, fit.ctx))
        first = base(fit)
        return base(Fit(np.column_stack([fit.X, context(oof, fit.codes)]), fit.perf, fit.codes,
                        np.column_stack([fit.X_test, context(first, fit.test_codes)]), fit.test_codes,
                        fit.seed + 1, fit.ctx))

    return fit_predict


SIZE_FIELDS = ("n", "c", "k", "g", "y", "x", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
               "ho", "wo")


def variants(data_dir: Path) -> dict[str, tuple[str, Variant]]:
    """Named variants: (what it changes, fit-predict)."""
    return {
        "base": ("the experiment's recipe", ranker()),
        "linear_gain": ("label gain = grade, exponent 1", ranker(exponent=1.0, gain="linear")),
        "square_gain": ("label gain = grade^2, exponent 1", ranker(exponent=1.0, gain="square")),
        "trunc1": ("lambdarank_truncation_level 1", ranker(lambdarank_truncation_level=1)),
        "trunc3": ("lambdarank_truncation_level 3", ranker(lambdarank_truncation_level=3)),
        "trunc5": ("lambdarank_truncation_level 5", ranker(lambdarank_truncation_level=5)),
        "occupancy": ("+ waves/estimate at 2 and 4 blocks per CU", with_columns(occupancy_columns)),
        "occupancy_rank": ("+ occupancy + estimate ranked within the problem",
                           with_columns(lambda X, c, ctx: np.column_stack([occupancy_columns(X, c, ctx),
                                                                           rank_columns(X, c, ctx)]))),
        "no_sizes": ("- the raw size fields", with_columns(drop=SIZE_FIELDS)),
        "alignment": ("+ gcd(c, 8), gcd(k, 8)", with_columns(alignment_columns)),
        "gather": ("+ input-gather contiguity (channels per K tile, output rows per M tile)",
                   with_columns(gather_columns)),
        "two_stage": ("tile ranker first, the base ranker within a tile", two_stage()),
        "bag5": ("mean of 5 rankers, 80% rows and columns", bag(5, subsample=0.8, subsample_freq=1,
                                                             colsample_bytree=0.8)),
        "extra_trees": ("extra_trees", ranker(extra_trees=True)),
        "leaves7": ("7 leaves, 1000 trees", ranker(num_leaves=7, n_estimators=1000)),
        "path_smooth": ("path_smooth 10", ranker(path_smooth=10.0)),
        "xendcg": ("objective rank_xendcg instead of lambdarank", ranker(objective="rank_xendcg")),
        "ranker_plus_regressor": ("sum of the ranker's and a log(perf/best) regressor's per-problem z-scores",
                                  ranker_plus_regressor()),
        "monotone_estimate": ("score monotone decreasing in est_vs_best", monotone_estimate()),
        "per_kernel_cost": ("+ each kernel's measured time per K iteration (fold's training problems) x iterations",
                            per_kernel_cost()),
        "tile_context": ("+ every catalogue tile's estimate, waves and wave efficiency on the problem",
                         with_columns(tile_context_columns)),
        "stacked": ("a second ranker on the first's out-of-fold scores against the problem's others", stacked()),
        "plus_training_table": ("+ the training table's problems (B only: not a protocol)",
                                plus_training_table(data_dir)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="AMD conv data folder")
    parser.add_argument("--variants", default="base", help="comma-separated names (see --list)")
    parser.add_argument("--protocols", default="T,B", help="comma-separated subset of T,A,B")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (B's folds follow the seed)")
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    args = parser.parse_args(argv)
    known = variants(args.data_dir)
    if args.list:
        for name, (what, _) in known.items():
            print(f"{name:22s} {what}")
        return 0
    names = args.variants.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {', '.join(known)}")
    protocols = args.protocols.split(",")
    if set(protocols) - {"T", "A", "B"}:
        parser.error(f"--protocols {args.protocols!r}: allowed T, A, B")
    if "plus_training_table" in names and protocols != ["B"]:
        parser.error("plus_training_table adds the training table's problems: only with --protocols B "
                     "(T and A already train on that table)")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: allowed comma-separated integers, e.g. 0,1,2")
    if not (args.data_dir / BENCH).exists():
        parser.error(f"AMD's conv measurements not found in {args.data_dir} (need {BENCH}, {TRAIN})")
    contexts = {(p, s): load_context(p, s, args.data_dir) for p in protocols for s in seeds}
    print("| variant | " + " | ".join(f"{p} mean / P10 / min" for p in protocols) + " | seconds |")
    print("|---|" + "---|" * (len(protocols) + 1))
    for name in names:
        t = time.perf_counter()
        cells = []
        for p in protocols:
            runs = [evaluate(contexts[p, s], known[name][1]) for s in seeds]
            cells.append(" / ".join(f"{100 * np.mean([r[k] for r in runs]):.2f}" for k in ("mean", "p10", "min")))
        print(f"| {name} | " + " | ".join(cells) + f" | {time.perf_counter() - t:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
