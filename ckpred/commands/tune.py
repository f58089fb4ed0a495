"""``ckpred tune``: hyperparameter search with optuna, objective = CV mean efficiency of ``train``.

optuna is driven directly (hydra-optuna-sweeper pins optuna 2.x). Each trial sets the sampled
``model.<name>`` values on a copy of the composed config, validates it against the schemas and
calls :func:`ckpred.train.train` in this process — the same plain function ``ckpred train``
and sweeps run — so a trial's value is exactly the mean per-shape efficiency over the test folds
that ``python -m ckpred train <the trial's overrides>`` would report.

The config is the ``train`` config plus ``tune`` (``conf/tune.yaml``): the trial budget
(``n_trials``, optional ``timeout_s``), the TPE sampler seed and the search space (one entry per
``model.<name>``; ``enabled: false`` keeps the config's value). With a fixed seed and no time
limit the whole study is deterministic (TPESampler(seed) + LightGBM's deterministic mode).

Outputs (the run dir, ``runs/tune/<time>``)::

    trials/<n>/          each trial's train outputs (metrics.json, run.json, ...) and
                         overrides.yaml (so ``ckpred sweep-report <run dir>`` tabulates them)
    trials.csv           one row per trial: value (mean), params, p10, wall time, state
    best_params.json     best trial: value, params, the train overrides / command to reproduce it
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import optuna
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from ckpred.commands.train import train
from ckpred.config import run_dir, to_object
from ckpred.errors import ConfigValueError
from ckpred.runs import run_directory
from ckpred.schema import TuneConfig, TuneSettings, tune_param
from ckpred.util import claim_run_dir

log = logging.getLogger(__name__)


def _command_overrides() -> list[str]:
    """The overrides the tune command was started with (empty outside the CLI)."""
    try:
        return [o for o in HydraConfig.get().overrides.task
                if not o.startswith(("tune.", "out_dir=", "hydra", "~tune", "+tune"))]
    except ValueError:
        return []


def search_space(cfg: TuneConfig) -> dict[str, Any]:
    """The enabled ``tune.space`` entries as plain dicts; refuses an empty space."""
    entries = {str(name): tune_param(str(name), raw)
               for name, raw in cfg.tune.space.items()}
    space = {name: asdict(p) for name, p in entries.items() if p.enabled}
    if not space:
        raise ConfigValueError("tune.space", list(cfg.tune.space), "at least one enabled parameter "
                               "(e.g. tune.space.num_leaves.enabled=true)")
    return space


def suggest(trial: optuna.Trial, name: str, p: dict[str, Any]) -> Any:
    """Ask ``trial`` for ``model.<name>`` within ``p`` (kind, low, high, log, step, choices)."""
    if p["kind"] == "categorical":
        return trial.suggest_categorical(name, list(p["choices"]))
    step = p["step"] or None
    if p["kind"] == "int":
        return trial.suggest_int(name, int(p["low"]), int(p["high"]), step=int(step or 1), log=bool(p["log"]))
    return trial.suggest_float(name, float(p["low"]), float(p["high"]), step=step, log=bool(p["log"]))


def trial_config(cfg: TuneConfig, params: dict[str, Any], out_dir: Path, keep_outputs: bool) -> TuneConfig:
    """A copy of ``cfg`` with ``model.<name> = value`` for ``params``, validated by the schemas
    (through OmegaConf, which converts each value to its key's type as the command line does)."""
    trial = OmegaConf.structured(cfg)
    for name, value in params.items():
        OmegaConf.update(trial, f"model.{name}", value, merge=False)
    OmegaConf.update(trial, "out_dir", str(out_dir))
    OmegaConf.update(trial, "save_pipeline", bool(keep_outputs))
    OmegaConf.update(trial, "plots", bool(keep_outputs))
    OmegaConf.update(trial, "progress", False)
    out: TuneConfig = to_object(trial)  # a value outside the schema's range fails here, naming model.<name>
    return out


def _fmt(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def make_pruner(settings: TuneSettings) -> Any:
    """optuna pruner of ``tune.pruner``: ``median`` (stop a trial whose running CV mean after a
    fold is below the median of earlier trials at that fold) or ``none``."""
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(settings.pruner_startup_trials),
                                           n_warmup_steps=int(settings.pruner_warmup_folds))
    return optuna.pruners.NopPruner()


def _objective(cfg: TuneConfig, space: dict[str, Any], trials_dir: Path,
               base_overrides: list[str]) -> Callable[[Any], float]:
    """The study's objective: one ``train`` run per trial in ``trials_dir/<n>``, reporting the
    running CV mean after each fold so the pruner can stop it."""
    def objective(trial: optuna.Trial) -> float:
        params = {name: suggest(trial, name, p) for name, p in space.items()}
        # the trial's train run folder, claimed before overrides.yaml goes in (train then finds its marker)
        trial_dir = claim_run_dir("out_dir", trials_dir / f"{trial.number:03d}", run_directory("train"))
        overrides = [*base_overrides, *(f"model.{k}={_fmt(v)}" for k, v in params.items())]
        (trial_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        t = time.perf_counter()

        def report(fold: int, running_mean: float) -> None:
            # The folds are the same in every trial (same seed), so fold i's running mean is
            # comparable across trials; a pruned trial writes no outputs.
            trial.report(running_mean, fold)
            if trial.should_prune():
                trial.set_user_attr("wall_s", round(time.perf_counter() - t, 2))
                raise optuna.TrialPruned(f"fold {fold}: running mean {running_mean:.4f}")

        value = train(trial_config(cfg, params, trial_dir, bool(cfg.tune.trial_outputs)), on_fold=report)
        metrics = json.loads((trial_dir / "metrics.json").read_text())["model"]
        trial.set_user_attr("p10", metrics.get("p10"))
        trial.set_user_attr("wall_s", round(time.perf_counter() - t, 2))
        trial.set_user_attr("dir", str(trial_dir))
        if math.isnan(value):
            raise optuna.TrialPruned("train returned NaN (no test shape was evaluated)")
        return value

    return objective


def _best_result(study: optuna.Study, cfg: TuneConfig, space: dict[str, Any],
                 base_overrides: list[str]) -> dict[str, Any]:
    """``best_params.json``: the best trial, its overrides and the train command that reproduces it."""
    settings = cfg.tune
    best = study.best_trial
    overrides = [f"model.{k}={_fmt(v)}" for k, v in best.params.items()]
    return {
        "best_trial": best.number, "mean_efficiency": best.value, "p10": best.user_attrs.get("p10"),
        "params": best.params, "overrides": overrides,
        "command": " ".join(["python -m ckpred train", *base_overrides, *overrides]),
        "trial_dir": best.user_attrs.get("dir"),
        "n_trials": len(study.trials), "sampler": {"name": "TPESampler", "seed": int(settings.sampler_seed),
                                                   "n_startup_trials": int(settings.n_startup_trials)},
        "space": space, "cv": str(cfg.cv.name), "objective": "model mean per-shape efficiency over the test folds",
    }


def tune(cfg: TuneConfig) -> float:
    """Run the optuna study; write trials.csv and best_params.json; print the best trial.

    Parameters
    ----------
    cfg : TuneConfig
        A composed ``tune`` config: a train config plus the ``tune`` node.

    Returns
    -------
    float
        The best trial's mean efficiency.
    """
    settings = cfg.tune
    space = search_space(cfg)
    out_dir = run_dir(cfg.out_dir, "tune")
    base_overrides = _command_overrides()
    sampler = optuna.samplers.TPESampler(seed=int(settings.sampler_seed),
                                         n_startup_trials=int(settings.n_startup_trials))
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=make_pruner(settings),
                                study_name=f"ckpred-tune-{out_dir.name}")
    timeout = float(settings.timeout_s) or None
    log.info("tune: %d trials%s over %s -> %s", int(settings.n_trials),
             f" (or {timeout:.0f} s)" if timeout else "", ", ".join(f"model.{k}" for k in space), out_dir)
    study.optimize(_objective(cfg, space, out_dir / "trials", base_overrides), n_trials=int(settings.n_trials),
                   timeout=timeout)

    frame = study.trials_dataframe()
    frame.to_csv(out_dir / "trials.csv", index=False)
    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        raise RuntimeError(f"tune: none of the {len(study.trials)} trials finished (all pruned or failed; see "
                           f"{out_dir / 'trials.csv'}); raise tune.n_trials or set tune.pruner=none")
    result = _best_result(study, cfg, space, base_overrides)
    (out_dir / "best_params.json").write_text(json.dumps(result, indent=2) + "\n")
    print_study(study, out_dir, result)
    best = study.best_trial.value
    assert best is not None  # a complete trial has its value
    return float(best)


def print_study(study: optuna.Study, out_dir: Path, result: dict[str, Any]) -> None:
    """Rich table of the trials (best first) and the best trial's train command."""
    console = Console(width=None if sys.stdout.isatty() else 160)
    finished = [(t, float(t.value)) for t in study.trials if t.value is not None]
    done = sorted(finished, key=lambda tv: (-tv[1], tv[0].number))
    names = list(result["space"])
    pruned = sum(t.state.name == "PRUNED" for t in study.trials)
    table = Table(title=f"tune: {len(done)} of {len(study.trials)} trials finished ({pruned} pruned), best first "
                        f"(efficiency %, {result['cv']})")
    for col in ("trial", "mean", "P10", "wall s", *names):
        table.add_column(col, justify="right")
    for t, value in done:
        p10 = t.user_attrs.get("p10")
        table.add_row(str(t.number), f"{100 * value:.2f}", "-" if p10 is None else f"{100 * p10:.2f}",
                      f"{t.user_attrs.get('wall_s', float('nan')):.1f}",
                      *[_short(t.params.get(n)) for n in names], style="bold" if t is done[0][0] else None)
    console.print(table)
    console.print(f"best trial {result['best_trial']}: mean {100 * result['mean_efficiency']:.2f}%  ->  "
                  f"{result['command']}")
    console.print(f"outputs in {out_dir} (trials.csv, best_params.json, trials/)")


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
