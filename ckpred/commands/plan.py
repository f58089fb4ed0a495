"""``python -m ckpred plan``: the (problem, kernel) pairs to benchmark first on a new GPU."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from ckpred import plan as pl
from ckpred.commands.export import Steps
from ckpred.config import CONF_DIR
from ckpred.data.mapping import InputMapping
from ckpred.schema import PlanConfig
from ckpred.util import check_replaceable, resolve_path


def plan_command(cfg: PlanConfig) -> str:
    """Task function of ``python -m ckpred plan``: write the plan CSV, print what was chosen and
    how to read the measurements back; returns the plan's path."""
    check_replaceable("out", cfg.out, pl.PLAN_FILE)  # before any work: a filled plan holds measurements
    arch = cfg.arch
    measured_paths = cfg.measured_paths()
    with Steps("plan") as steps:
        steps.step("loading the run and its training table")
        source = pl.load_source(cfg.run_dir)
        steps.step("reading the candidate problems")
        problems = pl.read_problems(cfg.problems, source.op) if cfg.problems else None
        pairs = pl.candidates(source, arch, problems)
        measured = None
        if measured_paths:
            steps.step(f"reading the measurements so far ({len(measured_paths)} file(s))")
            measured = pl.read_measured(measured_paths, source, arch)
        steps.step(f"scoring {len(pairs):,} candidate pairs on {arch.name}")
        scores = pl.model_scores(source, pairs, arch)
        steps.step("choosing")
        options = pl.PlanOptions(cfg.problem_order, cfg.kernel_order, float(cfg.min_distance), int(cfg.seed))
        plan = pl.make_plan(source, pairs, arch, cfg.budget, measured=measured, options=options, scores=scores)
        out = pl.write_plan(plan, cfg.out, source.op)
    _report(plan, source, measured, out, cfg)
    return str(out)


def _report(plan: pl.Plan, source: pl.Source, measured: pd.DataFrame | None, out: Path, cfg: PlanConfig) -> None:
    op = source.op
    print(f"plan for {cfg.arch.name} from {source.run_dir} ({', '.join(source.archs)}): {len(plan.rows):,} "
          f"measurement(s) of {plan.problems:,} of {plan.candidate_problems:,} problem(s); {plan.candidate_pairs:,} "
          f"candidate pairs, {plan.measured_pairs:,} measured before")
    print(f"problems in {plan.problem_order} order, kernels in {plan.kernel_order} order"
          + (" (source GPU weights " + ", ".join(f"{a} {w:.2f}" for a, w in plan.weights.items()) + ")"
             if plan.weights else ""))
    if measured is not None and len(measured):
        best = pl.best_measured(source, measured)
        print(f"best measured so far ({len(best):,} problem(s); first 5):")
        for _, row in best.head(5).iterrows():
            problem = " ".join(f"{k}={row[k]}" for k in op.problem_names)
            print(f"  {problem}: {row['kernel_name']} ({int(row['measured'])} measured)")
    fill = pl.fill_columns(op)
    mapping = InputMapping.of_op(op) or InputMapping()
    what = f"{fill[0]} in {mapping.unit}"
    if mapping.valid_column:
        what += (f" and {mapping.valid_column} ({'/'.join(mapping.true_values)} when it ran, one of "
                 f"{'/'.join(mapping.false_values)} when it failed)")
    print(f"wrote {out}: fill in {what} on each row (one more row per repeated measurement), then read it back with")
    config_dir = _config_dir(source.record.get("argv") or [])
    measured_table = resolve_path(cfg.out).with_suffix(".parquet")
    overrides = [*([f"--config-dir {shlex.quote(config_dir)}"] if config_dir else []), f"op={op.name}",
                 f"arch={cfg.arch.name}", f"dtype={source.cfg.dtype.name}", f"layout={source.cfg.layout.name}",
                 *(["op.input.format=csv"] if mapping.format not in ("auto", "csv") else []),
                 f"data.path={shlex.quote(str(out))}", f"out={shlex.quote(str(measured_table))}"]
    print("  python -m ckpred ingest " + " ".join(overrides))
    print(f"  (or pass it as measured={out} to the next round of plan)")
    _report_next_step(plan, source, cfg, config_dir, [*_tables_of(cfg.measured_paths()), measured_table])


def _tables_of(paths: list[str]) -> list[Path]:
    """The ingested tables of earlier rounds: a filled plan CSV is read back to the Parquet of the
    same name (what the printed ``ingest`` command writes); a table is itself."""
    return [resolve_path(p).with_suffix(".parquet") for p in paths]


def _report_next_step(plan: pl.Plan, source: pl.Source, cfg: PlanConfig, config_dir: str, tables: list[Path]) -> None:
    """Print the guide's step after the measurements (docs/guide.md, "A new GPU", step 6)."""
    if plan.problems <= 1:
        print("one problem: its pick is the best kernel measured (printed by the next plan with measured=); "
              "see docs/guide.md, 'A new GPU', step 6")
        return
    print("then retrain on the new GPU's measurements alone and plan the next round from that run "
          "(docs/guide.md, 'A new GPU', step 6):")
    print("  python -m ckpred train " + " ".join(retrain_arguments(source, cfg, config_dir, tables)))


def retrain_arguments(source: pl.Source, cfg: PlanConfig, config_dir: str, tables: list[Path]) -> list[str]:
    """The shell-quoted arguments of ``train`` on the new GPU's ingested ``tables`` alone: the run's
    own overrides (its command line, when it was trained by ``python -m ckpred train``), the new
    arch, the op's transfer feature set when it has one (``<op>_transfer``) and, for a ranker, the
    linear label gain (a pick earns in proportion to its efficiency, so few measurements teach
    what a badly wrong pick costs)."""
    argv = list(source.record.get("argv") or [])
    own = ([shlex.quote(a) for a in _own_overrides(argv[1:])] if argv and str(argv[0]).endswith("train")
           else ["<the run's overrides>"])
    transfer_set = f"{source.op.name}_transfer"
    features = transfer_set if _has_feature_set(transfer_set, config_dir) else str(source.cfg.features.name)
    gain = ["model.label_gain=linear"] if source.cfg.model.name == "lgbm_ranker" else []
    paths = ",".join(str(t) for t in tables)
    return [*(["--config-dir", shlex.quote(config_dir)] if config_dir else []), *own,
            f"arch={cfg.arch.name}", f"features={features}", *gain, shlex.quote(f"data.path=[{paths}]"),
            f"out_dir=runs/{cfg.arch.name}_{Path(cfg.out).stem}"]


def _own_overrides(args: list[str]) -> list[str]:
    """A train command line's overrides but the ones the retraining sets (config dir, multirun,
    arch, data, features, output and Hydra's own)."""
    replaced = ("arch", "data.path", "out_dir", "warm_start", "features")
    out = []
    for i, arg in enumerate(args):
        key = arg.split("=", 1)[0].lstrip("+~")
        if (arg in ("--config-dir", "-cd", "-m", "--multirun") or arg.startswith("--config-dir=")
                or (i and args[i - 1] in ("--config-dir", "-cd")) or key in replaced or key.startswith("hydra.")):
            continue
        out.append(arg)
    return out


def _has_feature_set(name: str, config_dir: str) -> bool:
    """Whether ``features=<name>`` composes: a file in the packaged configs or the run's config dir."""
    return any((root / "features" / f"{name}.yaml").is_file()
               for root in (CONF_DIR, *([resolve_path(config_dir)] if config_dir else [])))


def _config_dir(argv: list[str]) -> str:
    """The ``--config-dir`` the run was trained with (an op declared in a user's dir needs it again)."""
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config-dir="):
            return arg.split("=", 1)[1]
    return ""
