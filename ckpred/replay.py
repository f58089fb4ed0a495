"""Offline replay of :func:`ckpred.autotune.autotune` on measured tables.

Every problem of a train run's out-of-fold predictions is "autotuned" against its own measured
table: the benchmark of a kernel returns its measured time (``1 / perf``, which orders and
scales a problem's kernels like their times) and raises for a failed row, and the search runs through the same
:func:`ckpred.autotune.autotune_ranked` the runtime uses. The candidates are those the exported
selector ranks: the out-of-fold rows hold every rule-valid catalogue kernel of a problem, the
unmeasured ones too (``measured=False``), and ``selectable`` is the rules narrowed by the
applicability mask of an op whose table lists only the applicable kernels. Benchmarking an
unmeasured candidate costs a benchmark and yields nothing, as a failed one. Per policy and candidate order (the
model's, or a uniformly random order of the valid kernels) the replay reports the efficiency of
the measured winner (its perf / the problem's best) -- mean, P10 and min over problems -- and
the average number of benchmark calls per problem.

The :class:`~ckpred.autotune.Confidence` budget is replayed *cross-fitted*: the calibration a
problem uses is fitted on the out-of-fold predictions of the other folds only (problems are
split into pseudo-folds by key when the run has one fold), or on a separate calibration run
(e.g. CV on the training table of an external-test run), never on the problem itself.
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ckpred import autotune as at
from ckpred import evaluate as ev
from ckpred.errors import InputFileError, MissingFileError
from ckpred.kernels.base import load_op
from ckpred.runs import run_record_path

__all__ = ["ReplayData", "Hindsight", "Learned", "load_run", "replay", "summarize", "replay_table", "markdown",
           "plot_curves", "problem_features", "learned_probabilities", "learned_plans", "signal_auc"]

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

    def spent(self, scores: Sequence[float], spent: object) -> bool:  # pragma: no cover - never called
        raise NotImplementedError

    def describe(self) -> str:
        return f"hindsight(within={self.within:g})"


@dataclass(frozen=True)
class Learned(at.Budget):
    """The confidence budget with the logistic calibration (what ``export`` writes with
    ``autotune.kind=logistic``) instead of the score-gap table, replayed.

    Per problem, as many candidates as the first j whose predicted P(best of the top j within
    ``within`` of the best) reaches ``target``; the predictions come from :func:`learned_plans`
    (nested: never fitted on the problem's own fold).
    """

    target: float = 0.9
    within: float = 0.02
    max_benchmarks: int = at.MAX_BENCHMARKS

    def spent(self, scores: Sequence[float], spent: object) -> bool:  # pragma: no cover - replaced per problem
        raise NotImplementedError

    def describe(self) -> str:
        return f"logistic(target={self.target:g},within={self.within:g})"


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
    ckpred.errors.InputFileError
        When the predictions are not readable Parquet, lack a column, hold no row or no score
        (every score NaN), or the run record is not a JSON object.
    """
    run_dir = Path(run_dir)
    path = run_dir / "oof_predictions.parquet"
    if not path.is_file():
        raise MissingFileError(str(path), "no out-of-fold predictions; is this a `python -m ckpred train` run dir?")
    oof = _read_predictions(path, score)
    frame = pd.DataFrame({"shape": oof["shape"].astype(str), "kernel_name": oof["kernel_name"],
                          "perf": oof["perf"].to_numpy(float), "selectable": oof["selectable"].to_numpy(bool),
                          "score": oof[score].to_numpy(float), "fold": oof["fold"].to_numpy()})
    frame["seconds"] = np.where(frame["perf"] > 0, 1.0 / np.maximum(frame["perf"], 1e-300), np.nan)
    frame["tie"] = np.arange(len(frame))
    record = run_record_path(run_dir)
    if record.is_file():
        m = _read_record(record)
        if all(isinstance(m.get(k), str) for k in ("op", "arch", "dtype", "layout")):
            # a declared op (e.g. from --config-dir) is rebuilt from the run's own op config
            op = load_op((m.get("config") or {}).get("op") or m["op"])
            if not getattr(op, "catalogue_from_data", False):  # else its ids come from the training table
                ids = op.catalogue(m["arch"], m["dtype"], m["layout"]).set_index("kernel_name")["kernel_id"]
                tie = frame["kernel_name"].map(ids)
                if tie.notna().all():
                    frame["tie"] = tie.to_numpy(np.int64)
    if frame["fold"].nunique() < 2:  # one test fold (external / holdout): pseudo-folds by problem key
        frame["fold"] = frame["shape"].map(_pseudo_fold)
    return ReplayData(frame)


#: Columns of ``oof_predictions.parquet`` the replay reads (besides the score column).
_OOF_COLUMNS = ("shape", "kernel_name", "perf", "selectable", "fold")


def _read_predictions(path: Path, score: str) -> pd.DataFrame:
    """The out-of-fold predictions of a train run, refusing a file the replay cannot use."""
    try:
        oof = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a truncated or foreign file
        raise InputFileError(str(path), f"not a readable Parquet file ({type(exc).__name__}: {exc}); rerun "
                                        "`python -m ckpred train` to write it again") from None
    missing = [c for c in (*_OOF_COLUMNS, score) if c not in oof.columns]
    if missing:
        raise InputFileError(str(path), f"lacks column(s) {missing}; allowed: out-of-fold predictions with "
                                        f"{list(_OOF_COLUMNS)} and score columns "
                                        f"{[c for c in oof.columns if c.startswith('score_')]}")
    if not len(oof):
        raise InputFileError(str(path), "holds no prediction (0 rows); allowed: a train run's out-of-fold "
                                        "predictions, one row per measured candidate")
    scores = pd.to_numeric(oof[score], errors="coerce")
    if scores.isna().all():
        raise InputFileError(str(path), f"column {score!r} holds no score (every value NaN): the model ranked "
                                        "nothing, and a replay would order candidates by row alone")
    if scores.isna().any():
        logging.getLogger(__name__).warning("%s: %d of %d %s values are NaN (those candidates rank last)",
                                            path, int(scores.isna().sum()), len(scores), score)
    return oof


def _read_record(path: Path) -> dict[str, Any]:
    """A run record (``run.json``) as a mapping, refusing one that is not a JSON object."""
    try:
        record = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # not JSON, or nested past the parser's depth
        raise InputFileError(str(path), f"not a JSON run record ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(record, dict):
        raise InputFileError(str(path), f"a run record is a JSON object, not a {type(record).__name__}")
    return record


def _pseudo_fold(shape: object) -> int:
    return zlib.crc32(str(shape).encode()) % PSEUDO_FOLDS


def calibrations(data: ReplayData, calibration_data: ReplayData | None = None,
                 **options: Any) -> dict[Any, at.Calibration]:
    """Calibration per fold, fitted without that fold's problems (or on ``calibration_data``)."""
    f = data.frame
    if calibration_data is not None:
        c = calibration_data.frame
        one = at.calibrate(at.OofRows(c["shape"], c["perf"], c["score"], c["selectable"], c["tie"]), **options)
        return {fold: one for fold in pd.unique(f["fold"])}
    out = {}
    for fold in pd.unique(f["fold"]):
        rest = f[f["fold"] != fold]
        out[fold] = at.calibrate(at.OofRows(rest["shape"], rest["perf"], rest["score"], rest["selectable"], rest["tie"]),
                                 **options)
    return out


def replay(data: ReplayData, budget: at.Budget, *, order: str = "model", seed: int = 0,
           calibration: dict[Any, at.Calibration] | None = None,
           plans: dict[tuple[float, float], dict[Any, int]] | None = None) -> pd.DataFrame:
    """Autotune every problem against its measured table.

    ``calibration`` (fold -> table) serves :class:`~ckpred.autotune.Confidence` budgets and
    ``plans`` (:func:`learned_plans`) :class:`Learned` ones.

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
        if isinstance(budget, Learned):
            use = at.FixedK(plans[(budget.target, budget.within)][p["shape"]],  # type: ignore[index]
                            budget.max_benchmarks)
        elif isinstance(budget, at.Confidence):
            use = at.Confidence(budget.target, budget.within, calibration[p["fold"]],  # type: ignore[index]
                                budget.max_benchmarks)
        # the budget sees the model's scores, best first, whatever order is measured
        result = at.autotune_ranked(order_idx, [str(i) for i in order_idx], p["scores"], bench, use, pass_id=True)
        eff = perf[result.kernel_id] / p["best"] if result.ok else 0.0
        rows.append((p["shape"], float(eff), result.benchmarks))
    return pd.DataFrame(rows, columns=["shape", "efficiency", "benchmarks"])


def _key_values(problems: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[float]]]:
    """The numbers of each problem key as its field values (``key0``, ``key1``, ...), when every
    key holds the same count of numbers; else no fields."""
    numbers = [[float(v) for v in re.findall(r"\d+(?:\.\d+)?", str(p["shape"]))] for p in problems]
    if not numbers or len({len(v) for v in numbers}) != 1:
        return [], [[] for _ in problems]
    return [f"key{i}" for i in range(len(numbers[0]))], numbers


def problem_features(problems: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """:func:`ckpred.autotune.signal_features` of each problem (as :meth:`ReplayData.problems`).

    What a runtime knows before it benchmarks: the model's ranked scores and the problem's
    size. The replay reads a problem's values from its key (the numbers in it, ``key0``...:
    for the CK conv set the problem fields in order; for a MIOpen key its geometry); an export
    uses the manifest's integer problem fields.
    """
    fields, values = _key_values(problems)
    names = [*at.SCORE_FEATURES, *(f"log2_{f}" for f in fields), "log2_size"]
    return pd.DataFrame([at.signal_features(p["scores"], v) for p, v in zip(problems, values)], columns=names)


def _top_j(problems: Sequence[dict[str, Any]], max_k: int) -> np.ndarray:
    """[problem, j - 1]: efficiency of the best of the model's top j (valid candidates)."""
    return np.vstack([at.top_j_efficiency(p["perf"], p["best"], max_k) for p in problems]) if problems \
        else np.zeros((0, max_k))


def _lightgbm(x_train: pd.DataFrame, hit: np.ndarray, x_test: pd.DataFrame, seed: int) -> np.ndarray:
    """P(hit) for the test problems from a small LightGBM classifier (a constant when one class)."""
    import lightgbm as lgb  # lazy: ~1-2 s to import, only this signal needs it

    rate = (hit.sum() + 0.0) / (len(hit) + 1.0)  # one pseudo-miss, as the table's bins
    if hit.all() or not hit.any() or len(hit) < 20:
        return np.full(len(x_test), rate)
    clf = lgb.LGBMClassifier(n_estimators=100, learning_rate=0.05, num_leaves=4, min_child_samples=10,
                             subsample=0.8, subsample_freq=1, colsample_bytree=0.8, random_state=seed, n_jobs=1,
                             verbose=-1)
    clf.fit(x_train, hit)
    return np.asarray(clf.predict_proba(x_test[x_train.columns]))[:, 1]


def _logistic(x_train: pd.DataFrame, y_train: np.ndarray, x_test: pd.DataFrame, w: float) -> np.ndarray:
    """[test problem, j - 1]: P_j of :func:`ckpred.autotune.fit_logistic` fitted on the training problems."""
    fields = [c[len("log2_"):] for c in x_train.columns[len(at.SCORE_FEATURES):-1]]
    cal = at.fit_logistic(x_train.to_numpy(), y_train, fields, within=(w,))
    return cal.predict(x_test[x_train.columns].to_numpy(), w)


def learned_probabilities(data: ReplayData, calibration_data: ReplayData | None = None, *,
                          within: Iterable[float] = (0.02,), max_k: int = 10, model: str = "logistic",
                          seed: int = 0) -> dict[float, pd.DataFrame]:
    """Nested out-of-fold P(best of the model's top j within ``within`` of the best), j = 1..max_k.

    For each fold of ``data``, the model (``"logistic"``: :func:`ckpred.autotune.fit_logistic`,
    what an export carries; ``"lightgbm"``: a small classifier per j) is fitted on the *other*
    folds' problems (or on every problem of ``calibration_data``) with :func:`problem_features`,
    and predicts that fold's problems: no problem's own measurements reach the model that sizes
    its budget. The probabilities are made non-decreasing in j.

    Returns
    -------
    dict
        within -> DataFrame indexed by problem key, columns 1..max_k.
    """
    if model not in ("logistic", "lightgbm"):
        raise at.AutotuneError(f"learned_probabilities model={model!r}; allowed: 'logistic', 'lightgbm'")
    problems = data.problems()
    x = problem_features(problems)
    folds = np.asarray([p["fold"] for p in problems], dtype=object)
    keys = [p["shape"] for p in problems]
    if calibration_data is not None:
        c_problems = calibration_data.problems()
        xc, yc = problem_features(c_problems), _top_j(c_problems, max_k)
        if list(xc.columns) != list(x.columns):
            raise at.AutotuneError(f"calibration run's problem keys hold other fields ({list(xc.columns)}) than the "
                                   f"replayed run's ({list(x.columns)})")
        splits = [(np.ones(len(problems), bool), xc, yc)]
    else:
        y = _top_j(problems, max_k)
        splits = [(folds == f, x[folds != f], y[folds != f]) for f in pd.unique(folds)]
    out = {}
    for w in within:
        prob = np.zeros((len(problems), max_k))
        for test, x_train, y_train in splits:
            if model == "logistic":
                prob[test] = _logistic(x_train, y_train, x[test], float(w))
                continue
            for j in range(max_k):
                prob[test, j] = _lightgbm(x_train, y_train[:, j] >= 1 - w - 1e-12, x[test], seed)
        out[float(w)] = pd.DataFrame(np.maximum.accumulate(prob, axis=1), index=keys,
                                     columns=range(1, max_k + 1))
    return out


def learned_plans(data: ReplayData, calibration_data: ReplayData | None, wanted: Sequence[tuple[float, float]], *,
                  max_k: int = 10, seed: int = 0) -> dict[tuple[float, float], dict[Any, int]]:
    """Per (target, within): problem key -> benchmarks planned by :func:`learned_probabilities`
    (the first j whose probability reaches the target; ``max_k`` when none does)."""
    probs = learned_probabilities(data, calibration_data, within=sorted({w for _, w in wanted}), max_k=max_k,
                                  seed=seed)
    out = {}
    for target, w in wanted:
        p = probs[float(w)].to_numpy()
        reach = p >= target
        j = np.where(reach.any(axis=1), reach.argmax(axis=1) + 1, max_k)
        out[(target, w)] = dict(zip(probs[float(w)].index, j.tolist()))
    return out


def signal_auc(data: ReplayData, calibration_data: ReplayData | None = None, *, within: float = 0.02,
               max_k: int = 10, **calibrate_options: Any) -> dict[str, float]:
    """ROC AUC of each uncertainty signal for "the model's top-1 is within ``within`` of the best".

    ``table``: the score-gap calibration's P(top-1 within), cross-fitted as the replay fits it;
    ``learned``: :func:`learned_probabilities`' P(top-1 within) (nested, the logistic model an
    export carries); ``lightgbm``: the same with small LightGBM classifiers; ``gap2``/``gap3``:
    the raw score gaps. 0.5 is no signal. Also the share of problems whose top-1 is within.
    """
    # lazy: sklearn.metrics costs ~1-2 s to import (replay does not load scikit-learn otherwise)
    from sklearn.metrics import roc_auc_score

    problems = data.problems()
    hit = _top_j(problems, 1)[:, 0] >= 1 - within - 1e-12
    out: dict[str, float] = {"top1_within": float(hit.mean())}
    if hit.all() or not hit.any():
        return out
    cals = calibrations(data, calibration_data, within=(within,), max_k=max_k, **calibrate_options)
    table = [cals[p["fold"]].probability[0][cals[p["fold"]].bin_of(at.score_gap(p["scores"], cals[p["fold"]].gap_to))][0]
             for p in problems]
    learned = learned_probabilities(data, calibration_data, within=(within,), max_k=max_k)[float(within)][1]
    trees = learned_probabilities(data, calibration_data, within=(within,), max_k=max_k,
                                  model="lightgbm")[float(within)][1]
    feats = problem_features(problems)
    out.update(table=float(roc_auc_score(hit, table)), learned=float(roc_auc_score(hit, learned.to_numpy())),
               lightgbm=float(roc_auc_score(hit, trees.to_numpy())),
               gap2=float(roc_auc_score(hit, feats["gap2"].fillna(np.inf).clip(upper=1e300))),
               gap3=float(roc_auc_score(hit, feats["gap3"].fillna(np.inf).clip(upper=1e300))))
    return out


def auc_line(auc: dict[str, float], within: float) -> str:
    """One markdown line of :func:`signal_auc`'s result."""
    head = (f"Top-1 within {within:g} of the best on {100 * auc['top1_within']:.1f}% of the problems. "
            f"ROC AUC for it (0.5 = no signal):")
    if len(auc) == 1:
        return head + " undefined (one class)."
    names = {"table": "score-gap table", "learned": "logistic model", "lightgbm": "LightGBM classifiers",
             "gap2": "gap to the 2nd score",
             "gap3": "gap to the 3rd score"}
    return head + " " + ", ".join(f"{names[k]} {auc[k]:.2f}" for k in names) + "."


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
    cal = plans = None
    if any(isinstance(p, at.Confidence) for p in policies):
        cal = calibrations(data, calibration_data, within=tuple(within), **calibrate_options)
    learned = [p for p in policies if isinstance(p, Learned)]
    if learned:
        plans = learned_plans(data, calibration_data, [(p.target, p.within) for p in learned],
                              max_k=int(calibrate_options.get("max_k", 10)))
    rows = []
    for policy in policies:
        rows.append({"policy": policy.describe(), "order": "model",
                     **summarize(replay(data, policy, order="model", calibration=cal, plans=plans))})
        if isinstance(policy, Hindsight) or random_seeds <= 0:
            continue
        runs = [summarize(replay(data, policy, order="random", seed=s, calibration=cal, plans=plans))
                for s in range(random_seeds)]
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
    plt = ev.pyplot()
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
