#!/usr/bin/env python
"""Selection strategies (``export.select``): latency per shape against efficiency under CV.

One run, for ``full``, ``pruned`` at each ``--top-n`` and ``reranked`` (``--reranked-top-n``) at
each ``--reranker`` size:

* quality: mean / P10 / min per-shape efficiency of the strategy on the out-of-fold predictions
  of a finished ``train`` run (``--train-run``, same shape-grouped folds; the pruned candidate
  set of each fold is learned from that fold's training shapes only), and its ratio to ``full``;
* latency: the strategy exported from the final pipeline (parity-checked on ``--parity-shapes``
  training shapes), then per unseen shape with one thread:
  C++ selector (``scripts/cpp``) median / p99 wall and median CPU time, repeated (cached) median;
  (``reranked``: the candidate set's reranker is fitted per fold on that fold's training shapes
  for the quality figures, and on every shape for the export);
  Python ``KernelSelector.select`` median wall and CPU time without cache, and cached;
* a PNG of efficiency against C++ latency (``--plot``) and, with ``--json``, every figure.

The load average is printed before and after: the machine is shared, and wall times grow with
it; the CPU-time columns are the robust figure.

``--quality-only`` prints the quality figures alone, with each option's mean per CV fold against
``full``'s (the worst and best fold ratio) and whether its mean is at least 0.995 of ``full``'s
(the bar of a default). It takes several train runs (a ``seeds=[0,1,2]`` run's ``seed<s>``
directories; each is scored with its own seed) and then adds the mean ± std over them.
``--run-config`` takes the data and the recipe from the train run's own record instead of
overrides: that is how a run of an op declared in a config dir (``--config-dir tests/ops``) or
a ``cv=external`` run is scored (the latter's one fold trained on every shape of its training
table, and its tested shapes are its ``cv.data``).

    python scripts/bench/bench_strategies.py [hydra overrides of the export config, e.g. model=lgbm_ranker] \\
        --train-run runs/train/<time> [--top-n 1 2 3 5 8] [--shapes 200]
    python scripts/bench/bench_strategies.py --run-config --quality-only --top-n 1 --reranker 50x31 70x31 \\
        --train-run runs/train/<time>/seed0 runs/train/<time>/seed1 runs/train/<time>/seed2

Hydra overrides go before the options that take several values (``--train-run``, ``--top-n``,
``--reranker``), which would take them as values.
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
#: A strategy meets the bar when its CV mean efficiency is at least this fraction of ``full``'s.
BAR = 0.995


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def quality(oof: pd.DataFrame, table: pd.DataFrame, op, cfg, top_n: int | None,
            reranker: dict | None = None, *, seed: int | None = None,
            train_table: pd.DataFrame | None = None) -> dict[str, float]:
    """CV mean / P10 / min efficiency of one option, and its mean per fold (``fold_means``).

    ``train_table``: the training table of an external-CV run (``table`` is then the tested one).
    """
    from ckpred.export.strategies import Strategy, cv_efficiency

    m = cv_efficiency(oof, table, op, Strategy(cfg.arch, cfg.dtype, cfg.layout, top_n=top_n, reranker=reranker,
                                               recipe=cfg, seed=int(cfg.seed if seed is None else seed)),
                      train_table=train_table)
    m = m.dropna(subset=["efficiency"])
    eff = m["efficiency"].to_numpy() * 100
    return {"mean": float(eff.mean()), "p10": float(np.percentile(eff, 10)), "min": float(eff.min()),
            "shapes": int(len(eff)), "candidates_per_fold": sorted(set(int(c) for c in m["candidates"])),
            "fold_means": {str(k): float(v) * 100 for k, v in m.groupby("fold")["efficiency"].mean().items()}}


def print_quality(qual: dict[str, dict], heading: str) -> None:
    """The quality-only table: each option against ``full`` overall and fold by fold."""
    full = qual["full"]
    print(f"\n{heading}")
    print(f"{'option':<28} {'mean %':>7} {'P10 %':>6} {'min %':>6} {'mean/full':>9} {'dP10':>6} "
          f"{'fold mean/full min..max':>23} {'bar':>4}")
    for name, q in qual.items():
        ratios = [q["fold_means"][f] / full["fold_means"][f] for f in full["fold_means"]]
        ok = "ok" if q["mean"] >= BAR * full["mean"] else "MISS"
        print(f"{name:<28} {q['mean']:>7.2f} {q['p10']:>6.2f} {q['min']:>6.2f} {q['mean'] / full['mean']:>9.4f} "
              f"{q['p10'] - full['p10']:>+6.2f} {min(ratios):>11.4f}..{max(ratios):<10.4f} {ok:>4}")


def print_over_runs(per_run: list[dict[str, dict]], runs: list[str]) -> None:
    """Mean ± std over the train runs (seeds) of each option's figures."""
    print(f"\nover {len(runs)} train runs ({', '.join(runs)}): mean ± std")
    print(f"{'option':<28} {'mean %':>14} {'P10 %':>14} {'mean/full':>16} {'dP10':>13} {'bar':>4}")
    for name in per_run[0]:
        def stat(fn) -> tuple[float, float]:
            values = np.array([fn(q[name], q["full"]) for q in per_run])
            return float(values.mean()), float(values.std())

        mean, p10 = stat(lambda q, f: q["mean"]), stat(lambda q, f: q["p10"])
        ratio, dp10 = stat(lambda q, f: q["mean"] / f["mean"]), stat(lambda q, f: q["p10"] - f["p10"])
        ok = "ok" if all(q[name]["mean"] >= BAR * q["full"]["mean"] for q in per_run) else "MISS"
        print(f"{name:<28} {mean[0]:>7.2f} ± {mean[1]:<4.2f} {p10[0]:>7.2f} ± {p10[1]:<4.2f} "
              f"{ratio[0]:>7.4f} ± {ratio[1]:<6.4f} {dp10[0]:>+6.2f} ± {dp10[1]:<4.2f} {ok:>4}")


def cpp_latency(binary: Path, out: Path, shape_file: str) -> dict[str, float]:
    res = subprocess.run([str(binary), str(out), "--threads", "1", "--bench", "3", "--shapes", shape_file],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout)["bench"]


def python_latency(out: Path, shapes: pd.DataFrame) -> dict[str, float]:
    from ckpred.runtime import KernelSelector

    cold = KernelSelector.load(out, cache_size=0, threads=1)
    cold.select(*shapes.iloc[0])  # warm-up
    wall, cpu = [], []
    for r in shapes.itertuples(index=False):
        t, c = time.perf_counter(), time.process_time()
        cold.select(*r, top_k=5)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    warm = KernelSelector.load(out, cache_size=4096, threads=1)
    for r in shapes.itertuples(index=False):
        warm.select(*r, top_k=5)
    hit = []
    for r in shapes.itertuples(index=False):
        t = time.perf_counter()
        warm.select(*r, top_k=5)
        hit.append(time.perf_counter() - t)
    return {"median_us": float(np.median(wall) * 1e6), "cpu_median_us": float(np.median(cpu) * 1e6),
            "hit_median_us": float(np.median(hit) * 1e6)}


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # one series per strategy (points of a series differ in top_n or reranker size)
    families: dict[str, list[dict]] = {}
    for r in rows:
        families.setdefault(r["option"].split()[0], []).append(r)
    for (family, members), marker in zip(families.items(), "osD^v"):
        members = sorted(members, key=lambda r: r["cpp_median_ms"])
        ax.plot([r["cpp_median_ms"] for r in members], [r["mean"] for r in members], marker=marker,
                linestyle=":" if len(members) > 1 else "none", label=f"{family} (C++ median wall time)")
        for r in members:
            detail = r["option"][len(family):].strip().replace("top_n=", "n=")
            ax.annotate(f"{detail + ': ' if detail else ''}{r['candidates']} kernels", (r["cpp_median_ms"], r["mean"]),
                        textcoords="offset points", xytext=(5, -10 if family == "pruned" else 5), fontsize=7)
    full = rows[0]["mean"]
    ax.axhline(0.995 * full, color="grey", linestyle="--", linewidth=0.8, label="99.5% of full mean")
    ax.axvline(1.0, color="red", linestyle="--", linewidth=0.8, label="1 ms target")
    ax.set_xscale("log")
    ax.margins(x=0.15, y=0.12)
    ax.set_xlabel("selection latency per unseen shape, ms (one thread, log scale)")
    ax.set_ylabel("mean efficiency under CV, %")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reranker_size(text: str) -> dict[str, int]:
    """``--reranker`` value TREESxLEAVES, checked by the export config's schema."""
    from ckpred.errors import ConfigValueError
    from ckpred.schema import ExportRerankerConfig

    trees, _, leaves = text.partition("x")
    try:
        size = ExportRerankerConfig(n_estimators=int(trees), num_leaves=int(leaves))
    except (ValueError, ConfigValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TREESxLEAVES such as 100x31 ({exc})") from None
    return {"n_estimators": size.n_estimators, "num_leaves": size.num_leaves}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-run", required=True, nargs="+",
                        help="train run dir with oof_predictions.parquet; with --quality-only several "
                             "(e.g. a seeds=[0,1,2] run's seed0 seed1 seed2, each scored with its own seed)")
    parser.add_argument("--run-config", action="store_true",
                        help="take the data and the recipe from the (first) train run's own config (its run.json) "
                             "instead of composing the export config from overrides: for ops declared in a "
                             "config dir and for cv=external runs (the tested table is the run's cv.data)")
    parser.add_argument("--top-n", type=int, nargs="*", default=[1, 2, 3, 5, 8], help="pruned options to measure")
    parser.add_argument("--reranked-top-n", type=int, nargs="*", default=[1], help="candidate sets of the reranked options")
    # argparse converts string defaults only, not a list of them
    parser.add_argument("--reranker", nargs="*", type=reranker_size,
                        default=[reranker_size(s) for s in ("50x15", "70x31", "100x31", "300x127")],
                        help="reranker sizes TREESxLEAVES of the reranked options")
    parser.add_argument("--shapes", type=int, default=200, help="unseen shapes to time (default 200)")
    parser.add_argument("--parity-shapes", type=int, default=40, help="training shapes in each export's parity check")
    parser.add_argument("--out-dir", default=str(REPO / "exports" / "bench_strategies"), help="export root (git-ignored)")
    parser.add_argument("--reuse", action="store_true", help="reuse <out-dir>/pipeline.joblib from an earlier run")
    parser.add_argument("--plot", default=str(REPO / "docs" / "select_tradeoff.png"), help="trade-off PNG path")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--quality-only", action="store_true", help="print the CV quality table only (no exports)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of the export config (match the train run)")
    return parser.parse_args(argv)


Option = tuple[str, "int | None", "dict | None"]


def strategy_options(args: argparse.Namespace) -> list[Option]:
    """(label, top_n, reranker size) of every option measured: full, pruned, reranked."""
    options: list[Option] = [("full", None, None)]
    options += [(f"pruned top_n={n}", n, None) for n in args.top_n]
    for n in args.reranked_top_n:
        for size in args.reranker:
            options.append((f"reranked top_n={n} {size['n_estimators']}x{size['num_leaves']}", n, size))
    return options


def final_pipeline(args: argparse.Namespace, cfg, table: pd.DataFrame, op):
    """The export config's final pipeline, fitted here (and saved) or ``--reuse``d."""
    import joblib

    from ckpred.fitting import fit_final
    from ckpred.runs import load_pipeline

    root = Path(args.out_dir)
    saved = root / "pipeline.joblib"
    if args.reuse and saved.is_file():
        return load_pipeline(saved)  # runs nothing a tampered file names
    pipe = fit_final(cfg, table, op)
    root.mkdir(parents=True, exist_ok=True)
    joblib.dump(pipe, saved, compress=3)
    return pipe


def build_cpp_selector() -> Path | None:
    """Build scripts/cpp and return the selector binary (None, with the build log, on failure)."""
    build = subprocess.run(["bash", str(REPO / "scripts" / "cpp" / "build.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
    if build.returncode != 0:
        print(build.stdout[-2000:], build.stderr[-2000:], file=sys.stderr)
        return None
    return REPO / "build" / "cpp" / "ckpred_select"


def export_and_time(option: Option, *, pipe, cfg, table: pd.DataFrame, op, root: Path, parity: pd.DataFrame,
                    binary: Path, shape_file: str, shapes: pd.DataFrame) -> tuple[dict, dict, dict]:
    """Export one option and time it in C++ and Python; (manifest, C++ figures, Python figures)."""
    from ckpred.export import manifest as mf
    from ckpred.export.build import ExportOptions, export_pipeline
    from ckpred.export.manifest import export_name
    from ckpred.export.strategies import Strategy, fit_reranker, keep_for_table

    name, n, rr = option
    out = root / (name.replace(" ", "_").replace("=", "")) / export_name(op.name, cfg.arch.name, cfg.dtype.name,
                                                                         cfg.layout.name)
    keep = None if n is None else keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype,
                                                 layout=cfg.layout, top_n=n)
    reranker = None if rr is None else fit_reranker(table, op, keep, Strategy(cfg.arch, cfg.dtype, cfg.layout,
                                                                              reranker=rr, recipe=cfg,
                                                                              seed=int(cfg.seed)))
    options = ExportOptions(parity_problems=parity,
                            select="full" if n is None else "pruned" if rr is None else "reranked",
                            candidates=keep, reranker=reranker,
                            selection=None if n is None else {"top_n": n, **({"reranker": rr} if rr else {})},
                            # the bar is checked below and printed in the table, not enforced here,
                            # so a parity miss of the model itself still shows every figure
                            max_abs_diff=float("inf"))
    man = export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=out,
                          training=mf.training_section(table, op), options=options)
    return man, cpp_latency(binary, out, shape_file), python_latency(out, shapes)


def print_table(rows: list[dict], heading: str) -> None:
    full = rows[0]
    print()
    print(heading)
    head = (f"{'option':<28} {'cands':>6} {'C++ med ms':>10} {'C++ p99 ms':>10} {'C++ cpu ms':>10} {'C++ hit us':>10} "
            f"{'Py med ms':>9} {'Py cpu ms':>9} {'Py hit us':>9} {'mean %':>7} {'P10 %':>6} {'min %':>6} "
            f"{'mean/full':>9} {'dP10':>6} {'parity':>13}")
    print(head)
    for r in rows:
        print(f"{r['option']:<28} {r['candidates']:>6} {r['cpp_median_ms']:>10.3f} {r['cpp_p99_ms']:>10.3f} "
              f"{r['cpp_cpu_ms']:>10.3f} {r['cpp_hit_us']:>10.2f} {r['py_median_ms']:>9.3f} {r['py_cpu_ms']:>9.3f} "
              f"{r['py_hit_us']:>9.2f} {r['mean']:>7.2f} {r['p10']:>6.2f} {r['min']:>6.2f} "
              f"{r['mean'] / full['mean']:>9.4f} {r['p10'] - full['p10']:>+6.2f} "
              f"{r['parity_top1']:>6.0%} {r['parity_max_diff']:>6.1e}")
    print("(pruned candidates: the final export's set, learned on every training shape; under CV each fold's set "
          "is learned on its training shapes: " + "; ".join(f"{r['option']}: {r['candidates_per_fold']}"
                                                            for r in rows[1:]) + ")")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from ckpred.config import compose
    from ckpred.data import load_table
    from ckpred.data.shapes import unseen_shapes
    from ckpred.kernels.base import load_op
    from ckpred.kernels.declared import bind_training_catalogue

    print(f"load average (1/5/15 min) at start: {load()}", flush=True)
    if len(args.train_run) > 1 and not args.quality_only:
        raise SystemExit("several --train-run dirs need --quality-only (the exports time one final pipeline)")
    if args.run_config:
        if args.overrides:
            raise SystemExit(f"--run-config takes the train run's own config; drop the overrides {args.overrides}")
        from ckpred.schema import saved_recipe

        cfg = saved_recipe(json.loads((Path(args.train_run[0]) / "run.json").read_text())["config"])
    else:
        cfg = compose("export", list(args.overrides))
    op = load_op(cfg.op)
    table = load_table(cfg)
    bind_training_catalogue(op, table, cfg)
    train_table = None
    if args.run_config and cfg.cv["name"] == "external":
        # the OOF shapes are the tested table's; the one fold trained on every shape of `table`
        from dataclasses import replace

        from ckpred.schema import DataConfig, from_mapping

        if cfg.cv.get("arch") is not None:
            raise SystemExit("a cv=external run tested on another arch (cv.arch) is not supported here")
        # the test table: cv.data in place of data (what External.data_config does for a train config)
        train_table, table = table, load_table(replace(cfg, data=from_mapping(DataConfig, cfg.cv["data"])))
    options = strategy_options(args)
    per_run = []
    for run in args.train_run:
        oof = pd.read_parquet(Path(run) / "oof_predictions.parquet")
        missing = set(pd.unique(oof["shape"])) - set(pd.unique(np.asarray(op.shape_keys(table))))
        if missing:
            raise SystemExit(f"{run}: {len(missing)} OOF shapes are not in this config's data; "
                             "pass the train run's data/model overrides (or --run-config)")
        n_folds = oof["fold"].nunique()
        seed = int(json.loads((Path(run) / "run.json").read_text())["seed"])
        print(f"{run}: seed {seed}; data: {len(table):,} rows; OOF: {oof['shape'].nunique()} shapes in {n_folds} "
              "folds", flush=True)
        qual = {}
        for name, n, rr in options:
            t0, c0 = time.perf_counter(), time.process_time()
            qual[name] = quality(oof, table, op, cfg, n, rr, seed=seed, train_table=train_table)
            print(f"{name}: CV quality {qual[name]['mean']:.2f} / {qual[name]['p10']:.2f} "
                  f"({time.perf_counter() - t0:.0f} s, {time.process_time() - c0:.0f} CPU s)", flush=True)
        per_run.append(qual)
        if args.quality_only:
            print_quality(qual, f"{run} (seed {seed}, {n_folds} folds, {qual['full']['shapes']} shapes; "
                                f"candidates per fold: " + "; ".join(f"{k}: {q['candidates_per_fold']}"
                                                                   for k, q in list(qual.items())[1:]) + ")")
    if args.quality_only:
        if len(per_run) > 1:
            print_over_runs(per_run, args.train_run)
        if args.json:
            Path(args.json).write_text(json.dumps(dict(zip(args.train_run, per_run)), indent=1))
        return 0
    qual = per_run[0]

    t0 = time.perf_counter()
    pipe = final_pipeline(args, cfg, table, op)
    model = pipe.named_steps["model"]
    inner = getattr(model, "regressor_", model)
    trees, leaves = inner.booster_.num_trees(), inner.get_params()["num_leaves"]
    print(f"final pipeline: {trees} trees x {leaves} leaves ({time.perf_counter() - t0:.0f} s)", flush=True)

    binary = build_cpp_selector()
    if binary is None:
        return 1
    problems = table[list(op.problem_names)].drop_duplicates()
    parity = problems.sample(min(args.parity_shapes, len(problems)), random_state=0)
    shapes = unseen_shapes(problems, args.shapes)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        for r in shapes.itertuples(index=False):
            fh.write(",".join(str(int(v)) for v in r) + "\n")

    rows = []
    for option in options:
        man, cpp, py = export_and_time(option, pipe=pipe, cfg=cfg, table=table, op=op, root=Path(args.out_dir),
                                       parity=parity, binary=binary, shape_file=fh.name, shapes=shapes)
        name = option[0]
        rows.append({"option": name, "candidates": man["selection"]["candidates"], **qual[name],
                     "cpp_median_ms": cpp["median_us"] / 1e3, "cpp_p99_ms": cpp["p99_us"] / 1e3,
                     "cpp_cpu_ms": cpp["cpu_median_us"] / 1e3, "cpp_hit_us": cpp["hit_median_us"],
                     "py_median_ms": py["median_us"] / 1e3, "py_cpu_ms": py["cpu_median_us"] / 1e3,
                     "py_hit_us": py["hit_median_us"], "parity_top1": man["parity"]["top1_agreement"],
                     "parity_max_diff": max(man["parity"]["max_abs_diff_scorer"],
                                            man["parity"]["max_abs_diff_selector"])})
        print(f"{name}: done (load {load()})", flush=True)

    print_table(rows, f"Selection per unseen shape: {len(shapes)} shapes, "
                      f"{len(op.catalogue(cfg.arch, cfg.dtype, cfg.layout))} catalogue kernels, 1 thread, {trees} "
                      f"trees x {leaves} leaves ({cfg.model.name}, features {cfg.features.name}); efficiency under "
                      f"{n_folds}-fold shape-grouped CV ({rows[0]['shapes']} shapes, {args.train_run[0]}); "
                      f"load average at end {load()}")
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    plot(rows, Path(args.plot), f"{trees} trees x {leaves} leaves, {len(shapes)} unseen shapes, 1 thread, "
                                f"load {load()}")
    print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
