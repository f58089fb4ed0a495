"""Offline replay of :func:`ckpred.autotune.autotune` on measured tables.

Every problem of a train run's out-of-fold predictions is "autotuned" against its own measured
table: the benchmark of a kernel returns its measured time (``1 / perf``, which orders and
scales a problem's kernels like their times) and raises for a failed row, and the search runs through the same
:func:`ckpred.autotune.autotune_ranked` the runtime uses. Per policy and candidate order (the
model's, or a uniformly random order of the valid kernels) the replay reports the efficiency of
the measured winner (its perf / the problem's best) -- mean, P10 and min over problems -- and
the average number of benchmark calls per problem.

The :class:`~ckpred.autotune.Confidence` budget is replayed *cross-fitted*: the calibration a
problem uses is fitted on the out-of-fold predictions of the other folds only (problems are
split into pseudo-folds by key when the run has one fold), or on a separate calibration run
(e.g. CV on the training table of an external-test run), never on the problem itself.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from ckpred import autotune as at

__all__ = ["ReplayData", "Hindsight", "load_run", "replay", "summarize", "replay_table", "markdown",
           "plot_curves"]

#: Pseudo-folds for cross-fitting a calibration when a run has a single test fold.
PSEUDO_FOLDS = 5


@dataclass
class ReplayData:
    """Rows of measured candidates: ``shape``, ``kernel_name``, ``perf`` (0 = failed),
    ``selectable``, ``score``, ``seconds``, ``tie`` (secondary sort key), ``fold``."""

    frame: pd.DataFrame

    def problems(self) -> list[dict[str, Any]]:
        """Per problem with a valid measured kernel: its valid candidates in model order."""
        cached = getattr(self, "_problems", None)
        if cached is not None and cached[0] is self.frame:
            return cached[1]
        out = []
        for shape, one in self.frame.groupby("shape", sort=False):
            best = float(one["perf"].max())
            if not best > 0:
                continue
            cand = one[one["selectable"]].sort_values(["score", "tie"], ascending=[False, True], kind="stable")
            out.append({"shape": shape, "fold": one["fold"].iloc[0], "best": best,
                        "names": cand["kernel_name"].tolist(), "perf": cand["perf"].to_numpy(float),
                        "seconds": cand["seconds"].to_numpy(float), "scores": cand["score"].to_numpy(float)})
        self._problems = (self.frame, out)
        return out


@dataclass(frozen=True)
class Hindsight(at.Budget):
    """Replay only: stop at the first candidate within ``within`` of the best (knows the answer).

    The least any budget can spend in the same candidate order to get within ``within``.
    """

    within: float = 0.01
    max_benchmarks: int = 10_000

    def spent(self, scores: Sequence[float], spent: Any) -> bool:  # pragma: no cover - never called
        raise NotImplementedError

    def describe(self) -> str:
        return f"hindsight(within={self.within:g})"


def load_run(run_dir: str | Path, *, score: str = "score_model") -> ReplayData:
    """Read a train run's ``oof_predictions.parquet`` as :class:`ReplayData`.

    The benchmark time of a kernel is ``1 / perf`` (perf is work / time, so within a problem
    it orders and scales kernels like their times). Equal scores are broken as the exported
    selector breaks them, by catalogue kernel id, when the run's record (``run.json``) names the
    op, arch, dtype and layout (else by row order). A run with a single test fold (external
    or holdout CV) gets pseudo-folds by problem key, for cross-fitting the calibration.

    Raises
    ------
    ckpred.errors.MissingFileError
        When the run has no ``oof_predictions.parquet``.
    """
    import json

    from ckpred.errors import MissingFileError
    from ckpred.kernels.base import load_op
    from ckpred.runs import run_record_path

    run_dir = Path(run_dir)
    path = run_dir / "oof_predictions.parquet"
    if not path.is_file():
        raise MissingFileError(str(path), "no out-of-fold predictions; is this a `python -m ckpred train` run dir?")
    oof = pd.read_parquet(path)
    if score not in oof:
        from ckpred.errors import TableSchemaError

        raise TableSchemaError(f"{path}: no column {score!r}; score columns: "
                               f"{[c for c in oof.columns if c.startswith('score_')]}")
    frame = pd.DataFrame({"shape": oof["shape"].astype(str), "kernel_name": oof["kernel_name"],
                          "perf": oof["perf"].to_numpy(float), "selectable": oof["selectable"].to_numpy(bool),
                          "score": oof[score].to_numpy(float), "fold": oof["fold"].to_numpy()})
    frame["seconds"] = np.where(frame["perf"] > 0, 1.0 / np.maximum(frame["perf"], 1e-300), np.nan)
    frame["tie"] = np.arange(len(frame))
    record = run_record_path(run_dir)
    if record.is_file():
        m = json.loads(record.read_text())
        if all(isinstance(m.get(k), str) for k in ("op", "arch", "dtype", "layout")):
            ids = load_op(m["op"]).catalogue(m["arch"], m["dtype"], m["layout"]).set_index("kernel_name")["kernel_id"]
            tie = frame["kernel_name"].map(ids)
            if tie.notna().all():
                frame["tie"] = tie.to_numpy(np.int64)
    if frame["fold"].nunique() < 2:  # one test fold (external / holdout): pseudo-folds by problem key
        frame["fold"] = frame["shape"].map(_pseudo_fold)
    return ReplayData(frame)


def _pseudo_fold(shape: Any) -> int:
    return zlib.crc32(str(shape).encode()) % PSEUDO_FOLDS


def calibrations(data: ReplayData, calibration_data: ReplayData | None = None,
                 **options: Any) -> dict[Any, at.Calibration]:
    """Calibration per fold, fitted without that fold's problems (or on ``calibration_data``)."""
    f = data.frame
    if calibration_data is not None:
        c = calibration_data.frame
        one = at.calibrate(c["shape"], c["perf"], c["score"], c["selectable"], tie_order=c["tie"], **options)
        return {fold: one for fold in pd.unique(f["fold"])}
    out = {}
    for fold in pd.unique(f["fold"]):
        rest = f[f["fold"] != fold]
        out[fold] = at.calibrate(rest["shape"], rest["perf"], rest["score"], rest["selectable"],
                                 tie_order=rest["tie"], **options)
    return out


def replay(data: ReplayData, budget: at.Budget, *, order: str = "model", seed: int = 0,
           calibration: dict[Any, at.Calibration] | None = None) -> pd.DataFrame:
    """Autotune every problem against its measured table.

    Returns
    -------
    DataFrame
        One row per problem with a valid measured kernel: ``shape``, ``efficiency`` (perf of
        the measured winner / best; 0 when every benchmark failed) and ``benchmarks``.
    """
    if order not in ("model", "random"):
        raise at.AutotuneError(f"replay order={order!r}; allowed: 'model', 'random'")
    rng = np.random.default_rng(seed)
    rows = []
    for p in data.problems():
        order_idx = np.arange(len(p["names"])) if order == "model" else rng.permutation(len(p["names"]))
        perf, seconds = p["perf"], p["seconds"]
        rel = perf[order_idx] / p["best"]
        if isinstance(budget, Hindsight):
            hit = np.flatnonzero(rel >= 1 - budget.within - 1e-12)
            n = int(hit[0]) + 1 if len(hit) else len(rel)
            rows.append((p["shape"], float(rel[:n].max()) if n else 0.0, n))
            continue

        def bench(i: int) -> float:
            if not perf[i] > 0:
                raise RuntimeError("failed in the measured table")
            return float(seconds[i])

        use = budget
        if isinstance(budget, at.Confidence):
            use = at.Confidence(budget.target, budget.within, calibration[p["fold"]],  # type: ignore[index]
                                budget.max_benchmarks)
        # the budget sees the model's scores, best first, whatever order is measured
        result = at.autotune_ranked(order_idx, [str(i) for i in order_idx], p["scores"], bench, use, pass_id=True)
        eff = perf[result.kernel_id] / p["best"] if result.ok else 0.0
        rows.append((p["shape"], float(eff), result.benchmarks))
    return pd.DataFrame(rows, columns=["shape", "efficiency", "benchmarks"])


def summarize(per_problem: pd.DataFrame) -> dict[str, float]:
    """Mean, P10 and min efficiency and the mean number of benchmarks per problem."""
    eff = per_problem["efficiency"].to_numpy()
    return {"problems": int(len(eff)), "benchmarks": float(per_problem["benchmarks"].mean()),
            "mean": float(eff.mean()), "p10": float(np.percentile(eff, 10)), "min": float(eff.min())}


def default_policies(ks: Iterable[int] = (1, 2, 3, 5), targets: Iterable[float] = (0.5, 0.7, 0.8, 0.9, 0.95),
                     within: float = 0.02, time_s: Iterable[float] = ()) -> list[at.Budget]:
    """Fixed k, confidence targets at one tolerance, optional kernel-time budgets."""
    out: list[at.Budget] = [at.FixedK(k) for k in ks]
    out += [at.TimeBudget(t) for t in time_s]
    out += [at.Confidence(target=t, within=within) for t in targets]
    return out


def replay_table(data: ReplayData, policies: Sequence[at.Budget], *, calibration_data: ReplayData | None = None,
                 random_seeds: int = 20, within: Iterable[float] = (0.01, 0.02, 0.05),
                 **calibrate_options: Any) -> pd.DataFrame:
    """:func:`summarize` of every policy in model order and in random order (mean over seeds).

    Returns
    -------
    DataFrame
        Columns ``policy``, ``order``, ``problems``, ``benchmarks``, ``mean``, ``p10``, ``min``
        (the random-order figures are the means over ``random_seeds`` orders). ``calibrate_options``
    go to :func:`ckpred.autotune.calibrate` (``gap_to``, ``bins``, ...).
    """
    cal = None
    if any(isinstance(p, at.Confidence) for p in policies):
        cal = calibrations(data, calibration_data, within=tuple(within), **calibrate_options)
    rows = []
    for policy in policies:
        rows.append({"policy": policy.describe(), "order": "model",
                     **summarize(replay(data, policy, order="model", calibration=cal))})
        if isinstance(policy, Hindsight) or random_seeds <= 0:
            continue
        runs = [summarize(replay(data, policy, order="random", seed=s, calibration=cal)) for s in range(random_seeds)]
        rows.append({"policy": policy.describe(), "order": "random",
                     **{k: float(np.mean([r[k] for r in runs])) for k in runs[0]}})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, title: str = "") -> str:
    """The replay table as markdown (efficiencies in %)."""
    extra = [c for c in table.columns if c not in ("policy", "order", "problems", "benchmarks", "mean", "p10", "min")]
    head = ["policy", *extra, "order", "benchmarks / problem", "mean %", "P10 %", "min %"]
    lines = ([f"**{title}**", ""] if title else []) + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.to_dict("records"):
        cells = [r["policy"], *(str(r[c]) for c in extra), r["order"], f"{r['benchmarks']:.2f}",
                 f"{100 * r['mean']:.2f}", f"{100 * r['p10']:.2f}", f"{100 * r['min']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(tables: dict[str, pd.DataFrame], path: str | Path) -> None:
    """Mean (top row) and min (bottom row) efficiency against benchmarks per problem, one column
    per table: a line per (budget family, order), the hindsight bound as stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(tables), figsize=(6.5 * len(tables), 8), squeeze=False)
    colours: dict[str, Any] = {}
    for col, (name, table) in enumerate(tables.items()):
        family = table["policy"].str.extract(r"^(\w+)")[0]
        for (fam, order), part in table.assign(family=family).groupby(["family", "order"], sort=False):
            part = part.sort_values("benchmarks")
            colour = colours.setdefault(fam, f"C{len(colours)}")
            for row, metric in enumerate(("mean", "min")):
                ax = axes[row][col]
                if fam == "hindsight":
                    ax.plot(part["benchmarks"], 100 * part[metric], "*", ms=12, color=colour,
                            label="hindsight bound (model order)")
                else:
                    ax.plot(part["benchmarks"], 100 * part[metric], "-" if order == "model" else ":", marker="o",
                            color=colour, label=f"{fam}, {order} order")
        for row, metric in enumerate(("mean", "min")):
            ax = axes[row][col]
            ax.set_xlabel("benchmarks per problem (mean)")
            ax.set_ylabel(f"{metric} efficiency of the measured winner, %")
            ax.set_title(f"{name}: {metric}")
            ax.set_ylim(top=100.5)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
