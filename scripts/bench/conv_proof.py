"""Real-data proof for grouped_conv_fwd on gfx950 (bf16): Protocols A and B beside AMD's figures.

Runs :func:`ckpred.commands.train.train` with ``experiment=ck_conv_gfx950`` on AMD's public CK
Tile measurements (:mod:`ckpred.data.ck_conv`, shipped in data/ck_grouped_conv_fwd_bf16_gfx950)
once per protocol of :func:`ckpred.data.ck_conv.protocol_overrides`: A (train on the 20-kernel
training table, select among the benchmark's 30 kernels) and B (GroupKFold over the benchmark)
by default; T (GroupKFold over the training table, where recipes are chosen) with
``--protocols T``, and prints one table: the model, the reference replica (log1p regressor), best static kernel
(learned on the training side only; in Protocol A it can only be one of the 20 seen kernels),
the analytical roofline heuristic on the implicit GEMM (computed here when ``train`` has no
analytical baseline for the op), random choice (exact expectation) and AMD's published
LightGBM heuristic on the same problems (``comparison_summary_300.csv``). Under it, a table by
regime of the best measured kernel time shows where each protocol's misses are, beside the
timing noise there (:func:`problem_noise`, :func:`regime_table`).

Usage (from the repository root)::

    python scripts/bench/conv_proof.py                         # full run, writes runs/conv_proof/
    python scripts/bench/conv_proof.py --out /tmp/p model.n_estimators=50   # extra Hydra overrides

Extra arguments are Hydra overrides applied to both runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpred.data.ck_conv import AMD_SUMMARY, BENCH, DIRECTORY, TRAIN, protocol_overrides

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / DIRECTORY
COLUMNS = ("mean", "p10", "p50", "min", "top1", "top5", "efficiency@2", "efficiency@5")
LABELS = {"model_selector": "ckpred ({features}, {model}), selector tie order",
          "model": "ckpred, ties in table order (train's report)", "reference": "reference replica (log1p regressor)",
          "best_static": "best static kernel", "analytical": "analytical (roofline, implicit GEMM)",
          "random": "random choice"}


def analytical_summary(cfg: Any) -> dict[str, float]:
    """The roofline heuristic of :func:`ckpred.evaluate.analytical_scores` on the implicit GEMM
    (M = n*ho*wo, N = k, K = c*y*x) of every problem of the *test* table."""
    from ckpred import evaluate as ev
    from ckpred.data import load_table
    from ckpred.kernels.base import load_op

    op = load_op(cfg.op)
    test_cfg = dataclasses.replace(cfg, data=cfg.cv.data) if cfg.cv.name == "external" else cfg
    table = load_table(test_cfg)
    m, n, k = op.gemm_view(table)
    frame = pd.DataFrame({"m": m, "n": n, "k": k, "tile_m": table.tile_m, "tile_n": table.tile_n,
                          "tile_k": table.tile_k})
    scores = ev.analytical_scores(frame, cus=int(cfg.arch.compute_units), peak_tflops=float(cfg.arch.peak_tflops[cfg.dtype.name]),
                                  bandwidth_gbs=float(cfg.arch.memory_bandwidth_gbs),
                                  bytes_per_element=int(cfg.dtype.bytes_per_element), c_bytes=2)
    groups = ev.ShapeGroups.from_keys(op.shape_keys(table))
    perf = ev.measured_perf(table.tflops.to_numpy(), table.is_valid.to_numpy())
    return ev.summarize(ev.shape_metrics(perf, scores, groups))


def selector_order_summary(run_dir: Path, cfg: Any) -> dict[str, float]:
    """The model's out-of-fold scores evaluated with ties broken as the exported selector breaks
    them: by catalogue kernel id (TopK keeps the lower index first). ``train`` breaks ties in
    table (input file) order; the two differ only where the model scores kernels exactly equal,
    which is systematic for a pipeline it never saw (compv5 in Protocol A scores as its compv3
    twin) — see ``CATALOGUE_PIPELINES`` in ckpred/kernels/grouped_conv_fwd.py."""
    from ckpred import evaluate as ev
    from ckpred.kernels.base import load_op

    op = load_op(cfg.op)
    ids = op.catalogue(cfg.arch, cfg.dtype, cfg.layout).set_index("kernel_name")["kernel_id"]
    oof = pd.read_parquet(run_dir / "oof_predictions.parquet")
    oof = oof.assign(kernel_id=oof["kernel_name"].map(ids)).sort_values(["shape", "kernel_id"], kind="stable")
    groups = ev.ShapeGroups.from_keys(oof["shape"].to_numpy())
    return ev.summarize(ev.shape_metrics(oof["perf"].to_numpy(), oof["score_model"].to_numpy(), groups,
                                         oof["selectable"].to_numpy()))


#: Regimes of the best measured kernel time per problem, microseconds (lower edges; last is open).
REGIMES_US: tuple[float, ...] = (0.0, 5.0, 10.0, 20.0)
PROBLEM_CSV_COLUMNS: tuple[str, ...] = ("N", "C", "K", "G", "Hi", "Wi", "Y", "X", "stride_h", "stride_w",
                                        "pad_h", "pad_w")


#: The issue's goals for the model (fractions): protocol -> metric -> bar.
GOALS: dict[str, dict[str, float]] = {"A": {"mean": 0.97, "p10": 0.92, "min": 0.80},
                                      "B": {"mean": 0.985, "p10": 0.96, "min": 0.80}}


def goal_lines(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """One line per protocol: each goal metric of the model, its bar and met / missed."""
    lines = []
    for protocol, bars in GOALS.items():
        model = results.get(protocol, {}).get("model_selector")
        if model is None:
            continue
        cells = [f"{metric} {100 * model[metric]:.1f} (goal >= {100 * bar:g}: {'met' if model[metric] >= bar else 'missed'})"
                 for metric, bar in bars.items()]
        lines.append(f"{protocol}: " + ", ".join(cells))
    return lines


def problem_noise(bench: pd.DataFrame) -> pd.DataFrame:
    """Per distinct problem of the benchmark table: best time, twin spread and two noise oracles.

    compv3 and compv5 of the same tile are *twins*: above 20 us their times differ by a median
    0.1% (no systematic difference), so their spread at a given time scale is an upper bound on
    the timing noise of one measurement pair there. ``oracle`` is the efficiency of a selector
    that knows each problem's best tile and pipeline class in hindsight but treats the twins
    as one class (it picks either with equal chance): what timing noise alone costs a selector
    that, like any model trained on other problems, cannot see which twin timed luckier. Below
    ~5 us compv5 is also systematically faster (median 3%), so there the oracle is a pessimistic
    reading, not a bound.

    ``remeasured`` treats the twins as two runs of the same ten tiles: it picks the tile that was
    fastest in the compv3 run and scores it by the compv5 run, and the reverse, and averages
    the two efficiencies. That is a selector that knows everything one complete re-measurement
    of the test problem itself can tell — far more than a model trained on other problems — so
    its misses say how much of a per-problem efficiency goal timing noise leaves reachable.
    Under ~5 us it is pessimistic for the same reason as ``oracle``.
    """
    from ckpred.kernels.grouped_conv_fwd import OP

    # the op's own name grammar (a bad name raises KernelNameError naming it and the rule)
    names = pd.unique(bench["kernel"])
    kernels = pd.DataFrame([OP.parse_name(name) for name in names], index=names)
    tile = kernels["tile_m"].astype(str) + "x" + kernels["tile_n"].astype(str) + "x" + kernels["tile_k"].astype(str)
    table = bench.assign(us=bench["latency_ms"] * 1e3, tile=bench["kernel"].map(tile),
                         pipeline=bench["kernel"].map(kernels["pipeline"]))
    first = table.groupby(list(PROBLEM_CSV_COLUMNS))["problem_idx"].transform("min")
    table = table[table["problem_idx"] == first]  # one measurement of a repeated problem
    rows = []
    for key, one in table.groupby(list(PROBLEM_CSV_COLUMNS), sort=False):
        times = one.pivot_table(index="tile", columns="pipeline", values="us")
        best = float(times.min().min())
        twins = times[["compv3", "compv5"]].dropna()
        classes = [(float(pair.min()), float((best / pair).mean())) for _, pair in twins.iterrows()]
        classes += [(float(t), best / float(t)) for t in times.get("compv4", pd.Series(dtype=float)).dropna()]
        v3, v5 = twins["compv3"], twins["compv5"]
        remeasured = (v5.min() / v5[v3.idxmin()] + v3.min() / v3[v5.idxmin()]) / 2
        rows.append((*key, best, float(np.median(np.abs(np.log(v5 / v3)))), min(classes)[1], float(remeasured)))
    return pd.DataFrame(rows, columns=[*PROBLEM_CSV_COLUMNS, "best_us", "twin_spread", "oracle", "remeasured"])


def repeated_problems(bench: pd.DataFrame) -> list[str]:
    """For every convolution measured under several problem_idx values (143 and 212 in AMD's
    set), each later run against the first: the efficiency of the kernel that was fastest in
    one run, scored by the other run, both ways — the only direct reading of run-to-run timing
    noise the data hold."""
    lines = []
    for key, one in bench.groupby(list(PROBLEM_CSV_COLUMNS), sort=False):
        runs = one.pivot_table(index="kernel", columns="problem_idx", values="latency_ms")
        first, a = runs.columns[0], runs[runs.columns[0]]
        for second in runs.columns[1:]:
            b = runs[second]
            difference = np.abs(np.log(b / a))
            lines.append(f"problem_idx {first} / {second} ({dict(zip(PROBLEM_CSV_COLUMNS, key))}, best "
                         f"{1e3 * min(a.min(), b.min()):.1f} us): fastest in {first} scores "
                         f"{100 * b.min() / b[a.idxmin()]:.1f}% in {second}; fastest in {second} scores "
                         f"{100 * a.min() / a[b.idxmin()]:.1f}% in {first}; median per-kernel difference "
                         f"{100 * float(difference.median()):.2f}%, largest {100 * float(difference.max()):.1f}%")
    return lines


def regime_table(noise: pd.DataFrame, per_shape: dict[str, pd.DataFrame]) -> str:
    """Markdown: per regime of best kernel time, the twin spread, the twin-blind and re-measured
    oracles and each protocol's model (mean efficiency / problems under 96%), from the runs' per_shape.csv."""
    keys = list(PROBLEM_CSV_COLUMNS)
    frame = noise.copy()
    for protocol, ps in per_shape.items():
        ps = ps.rename(columns={c.lower(): c for c in keys})[[*keys, "model_efficiency"]]
        frame = frame.merge(ps.rename(columns={"model_efficiency": protocol}), on=keys, how="left")
    edges = [*REGIMES_US, np.inf]
    frame["regime"] = pd.cut(frame["best_us"], edges, right=False)
    head = ["best kernel time", "problems", "twin spread, median (p90)", "twin-blind oracle",
            "re-measured oracle", *(f"{p} ckpred" for p in per_shape)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def mean_under(v: pd.Series) -> str:
        return f"{100 * v.mean():.1f} / {int((v < 0.96).sum())}"

    for regime, part in [*frame.groupby("regime", observed=True), ("all", frame)]:
        label = regime if regime == "all" else (f">= {regime.left:g} us" if np.isinf(regime.right)
                                                else f"{regime.left:g}-{regime.right:g} us")
        spread = part["twin_spread"]
        lines.append("| " + " | ".join([label, str(len(part)),
                                        f"{100 * spread.median():.1f}% ({100 * spread.quantile(0.9):.1f}%)",
                                        mean_under(part["oracle"]), mean_under(part["remeasured"]),
                                        *(mean_under(part[p]) for p in per_shape)]) + " |")
    return "\n".join(lines)


def amd_figures(data_dir: Path) -> dict[str, float]:
    """AMD's published per-problem summary of its heuristic on the 300-problem set."""
    summary = pd.read_csv(data_dir / AMD_SUMMARY).set_index("metric")["value"]
    return {"n_shapes": int(summary["total_problems"]), "mean": summary["mean_efficiency"] / 100,
            "p10": summary["p10_efficiency"] / 100, "p50": summary["p50_efficiency"] / 100,
            "min": summary["min_efficiency"] / 100, "top1": summary["top1_accuracy"] / 100,
            "top5": summary["top5_hit_rate"] / 100}


def run_protocol(protocol: str, data_dir: Path, out: Path, extra: list[str]) -> dict[str, dict[str, float]]:
    """Train and evaluate one protocol; per-method summaries (fractions)."""
    from ckpred.config import compose
    from ckpred.commands.train import train

    cfg = compose("train", [*protocol_overrides(protocol, data_dir, out), *extra])
    t = time.perf_counter()
    train(cfg)
    metrics = json.loads((out / protocol / "metrics.json").read_text())
    rows = {name: {key: value for key, value in m.items() if not isinstance(value, dict)}
            for name, m in metrics.items() if isinstance(m, dict)}
    rows["model_selector"] = selector_order_summary(out / protocol, cfg)
    if rows.get("analytical", {}).get("mean") is None:
        rows["analytical"] = analytical_summary(cfg)
    rows["_seconds"] = {"mean": time.perf_counter() - t}
    rows["_info"] = {"features": cfg.features.name, "model": cfg.model.name}
    return rows


def format_table(results: dict[str, dict[str, dict[str, float]]], amd: dict[str, float]) -> str:
    """Markdown table: one row per protocol x method, percentages."""
    head = ["protocol", "method", "shapes", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(value: Any) -> str:
        return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{100 * value:.1f}"

    for protocol, rows in results.items():
        for method, label in LABELS.items():
            m = rows.get(method)
            if m is None or m.get("mean") is None:
                continue
            label = label.format(**rows["_info"])
            lines.append("| " + " | ".join([protocol, label, str(m.get("n_shapes", "")),
                                            *(cell(m.get(c)) for c in COLUMNS)]) + " |")
        if protocol == "T":  # AMD's figures are on the benchmark's problems, not the training table's
            continue
        lines.append("| " + " | ".join([protocol, "AMD heuristic (published)", str(amd["n_shapes"]),
                                        *(cell(amd.get(c)) for c in COLUMNS)]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="AMD conv data folder")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "conv_proof", help="output folder")
    parser.add_argument("--protocols", default="A,B", help="comma-separated subset of A,B,T (T: CV on the training table, for model selection)")
    args, extra = parser.parse_known_args(argv)
    if not (args.data_dir / BENCH).exists():
        parser.error(f"AMD's conv measurements not found in {args.data_dir} (need {BENCH}, {TRAIN})")
    results = {}
    for protocol in args.protocols.split(","):
        results[protocol] = run_protocol(protocol, args.data_dir, args.out.resolve(), extra)
        print(f"protocol {protocol}: {results[protocol]['_seconds']['mean']:.0f} s", flush=True)
    table = format_table(results, amd_figures(args.data_dir))
    goals = goal_lines(results)
    if goals:
        table += "\n\nGoals (ckpred, selector tie order):\n\n" + "\n".join(f"- {line}" for line in goals)
    per_shape = {p: pd.read_csv(args.out.resolve() / p / "per_shape.csv") for p in results if p in ("A", "B")}
    if per_shape:
        bench = pd.read_csv(args.data_dir / BENCH)
        noise = problem_noise(bench)
        table += ("\n\nBy regime (best measured kernel time per problem; cells: mean efficiency % / "
                  "problems under 96%):\n\n" + regime_table(noise, per_shape))
        ceiling = noise["remeasured"]
        table += (f"\n\nRe-measured oracle over all {len(ceiling)} problems: mean {100 * ceiling.mean():.1f}, "
                  f"P10 {100 * ceiling.quantile(0.1):.1f}, min {100 * ceiling.min():.1f}")
        table += "\n\nRepeated problems (run-to-run noise):\n\n" + "\n".join(f"- {line}" for line in repeated_problems(bench))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv_proof.md").write_text(table + "\n")
    (args.out / "conv_proof.json").write_text(json.dumps(results, indent=2, default=float))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
