"""``ckpred sweep-report``: one table of every job of a sweep, best first.

A sweep is what ``python -m ckpred train -m <param>=a,b,c ...`` writes (Hydra multirun, any
launcher: basic, ``hydra/launcher=joblib``, ``submitit_local`` / ``slurm``) or what
``python -m ckpred tune`` writes (``<run dir>/trials/<n>/``)::

    multirun/train/<time>/
        multirun.yaml
        0/  .hydra/overrides.yaml  metrics.json  run.json  ...
        1/  ...

Every directory under the sweep dir that holds a ``metrics.json`` is a finished job; a directory
with ``.hydra/`` but no ``metrics.json`` is a job that failed or is still running, and is listed
as such (never silently dropped). Per job the table shows the model's mean / P10 / P50 / top-1
per-shape efficiency (``metrics.json``), the reference replica's mean when it was trained, the
wall time of the job (the run record's ``timings_s.total_s``) and the overrides that differ
between jobs (the ones shared by every job are printed once, under the table).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table

from ckpred.runs import RUN_RECORD, run_record_path
from ckpred.schema import SweepReportConfig
from ckpred.util import OwnFile, atomic_path, check_replaceable, resolve_path
from ckpred.errors import InputFileError

log = logging.getLogger(__name__)


#: The table's file in the sweep folder (``csv=true``).
REPORT_FILE = "sweep_report.csv"
#: Its first columns: the file a rerun may replace is one whose header starts so.
_REPORT_HEADER = b"rank,job,status,"


def _is_sweep_report(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.readline(4096).startswith(_REPORT_HEADER)


#: A sweep report CSV: replaced only when it is one (or empty).
SWEEP_REPORT = OwnFile("a sweep report", _is_sweep_report)


@dataclass
class Job:
    """One job of a sweep, as read from its directory."""

    name: str
    path: Path
    status: str  # "ok" | "failed"
    overrides: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    reference_mean: float = math.nan
    wall_s: float = math.nan
    note: str = ""

    def metric(self, key: str) -> float:
        value = self.metrics.get(key)
        return float(value) if isinstance(value, (int, float)) else math.nan


def _job_dirs(root: Path) -> list[Path]:
    found = {p.parent for p in root.rglob("metrics.json")}
    found |= {p.parent for p in root.rglob(".hydra") if p.is_dir()}
    # A tune run dir holds .hydra/ of the tune command itself next to trials/: not a job.
    return sorted(d for d in found if not (d / "trials").is_dir())


def _read_overrides(job_dir: Path) -> list[str]:
    for candidate in (job_dir / ".hydra" / "overrides.yaml", job_dir / "overrides.yaml"):
        if candidate.exists():
            loaded = yaml.safe_load(candidate.read_text()) or []
            return [str(o) for o in loaded]
    return []


def read_job(root: Path, job_dir: Path) -> Job:
    """Read one job directory (metrics, wall time, overrides); never raises on a broken job."""
    name = job_dir.relative_to(root).as_posix() or "."
    job = Job(name=name, path=job_dir, status="failed", overrides=_read_overrides(job_dir))
    metrics_file = job_dir / "metrics.json"
    if not metrics_file.exists():
        job.note = "no metrics.json (job failed or still running)"
        return job
    try:
        metrics = json.loads(metrics_file.read_text())
        job.metrics = dict(metrics["model"])
    except (ValueError, KeyError, TypeError) as exc:
        job.note = f"unreadable metrics.json: {exc}"
        return job
    job.status = "ok"
    ref = metrics.get("reference", {})
    if isinstance(ref, dict) and isinstance(ref.get("mean"), (int, float)):
        job.reference_mean = float(ref["mean"])
    record_file = run_record_path(job_dir)
    if record_file.exists():
        try:
            job.wall_s = float(json.loads(record_file.read_text())["timings_s"]["total_s"])
        except (ValueError, KeyError, TypeError) as exc:
            job.note = f"no wall time in {record_file.name}: {exc}"
    else:
        job.note = f"no {RUN_RECORD} (no wall time)"
    return job


def collect(sweep_dir: Path, sort_by: str = "mean") -> list[Job]:
    """Every job under ``sweep_dir``: finished jobs by ``sort_by`` (descending), then failed ones.

    Raises
    ------
    ckpred.errors.InputFileError
        When ``sweep_dir`` does not exist or holds no job directory.
    """
    if not sweep_dir.is_dir():
        raise InputFileError(str(sweep_dir), "no such directory (expected a multirun dir, e.g. multirun/train/<time>)")
    jobs = [read_job(sweep_dir, d) for d in _job_dirs(sweep_dir)]
    if not jobs:
        raise InputFileError(str(sweep_dir), "no job directories (with metrics.json or .hydra/) under it; "
                                             "expected the output of `ckpred train -m ...` or `ckpred tune`")
    other = "p10" if sort_by == "mean" else "mean"

    def key(job: Job) -> tuple[Any, ...]:
        primary, secondary = job.metric(sort_by), job.metric(other)
        return (job.status != "ok", -primary if not math.isnan(primary) else math.inf,
                -secondary if not math.isnan(secondary) else math.inf, _natural(job.name))

    return sorted(jobs, key=key)


def _natural(name: str) -> tuple[Any, ...]:
    # "10" after "9": job numbers sort as numbers.
    return tuple(int(part) if part.isdigit() else part for part in name.replace("/", " / ").split())


def split_overrides(jobs: list[Job]) -> tuple[list[str], dict[str, list[str]]]:
    """(overrides every job shares, per job the overrides that vary), keeping the given order."""
    if not jobs:
        return [], {}
    common = [o for o in jobs[0].overrides if all(o in j.overrides for j in jobs[1:])]
    return common, {j.name: [o for o in j.overrides if o not in common] for j in jobs}


def report_frame(jobs: list[Job]) -> pd.DataFrame:
    """The table as a DataFrame (fractions, not percent), one row per job, in ``jobs`` order."""
    _, varying = split_overrides(jobs)
    rows = []
    for rank, job in enumerate(jobs, start=1):
        rows.append({"rank": rank if job.status == "ok" else None, "job": job.name, "status": job.status,
                     "mean": job.metric("mean"), "p10": job.metric("p10"), "p50": job.metric("p50"),
                     "min": job.metric("min"), "top1": job.metric("top1"), "reference_mean": job.reference_mean,
                     "wall_s": job.wall_s, "overrides": " ".join(varying[job.name]),
                     "all_overrides": " ".join(job.overrides), "note": job.note, "path": str(job.path)})
    frame = pd.DataFrame(rows)
    frame["rank"] = frame["rank"].astype("Int64")
    return frame


def print_report(frame: pd.DataFrame, common: list[str], sweep_dir: Path, sort_by: str) -> None:
    """Print ``frame`` as one rich table (percentages), with the shared overrides below it."""
    def pct(x: float) -> str:
        return "-" if pd.isna(x) else f"{100 * x:.2f}"

    console = Console(width=None if sys.stdout.isatty() else 160)
    ok = frame[frame["status"] == "ok"]
    table = Table(title=f"sweep {sweep_dir}: {len(ok)} of {len(frame)} jobs finished, "
                        f"sorted by model {sort_by} efficiency (%)")
    table.add_column("#", justify="right")
    table.add_column("job")
    for title in ("mean", "P10", "P50", "top1", "ref mean", "wall s"):
        table.add_column(title, justify="right")
    table.add_column("overrides", overflow="fold")
    has_ref = frame["reference_mean"].notna().any()
    for row in frame.itertuples(index=False):
        if row.status != "ok":
            table.add_row("", row.job, "failed", "", "", "", "", "", f"{row.overrides}  ({row.note})".strip(),
                          style="red")
            continue
        table.add_row(str(row.rank), row.job, pct(row.mean), pct(row.p10), pct(row.p50), pct(row.top1),
                      pct(row.reference_mean) if has_ref else "-",
                      "-" if pd.isna(row.wall_s) else f"{row.wall_s:.1f}", row.overrides,
                      style="bold" if row.rank == 1 else None)
    console.print(table)
    if common:
        console.print(f"shared by every job: {' '.join(common)}")


def sweep_report(cfg: SweepReportConfig) -> float:
    """Print (and optionally write as CSV) the table of a sweep's jobs.

    Parameters
    ----------
    cfg : SweepReportConfig
        A composed ``sweep_report`` config: ``dir`` (the sweep), ``sort_by``, ``csv``.

    Returns
    -------
    float
        The best job's ``sort_by`` efficiency (NaN when no job finished).
    """
    sweep_dir = resolve_path(str(cfg.dir))
    if cfg.csv:  # a user's file of that name in the folder is never overwritten
        check_replaceable("csv", sweep_dir / REPORT_FILE, SWEEP_REPORT)
    jobs = collect(sweep_dir, str(cfg.sort_by))
    frame = report_frame(jobs)
    common, _ = split_overrides(jobs)
    print_report(frame, common, sweep_dir, str(cfg.sort_by))
    if cfg.csv:
        with atomic_path(sweep_dir / REPORT_FILE, replaces=SWEEP_REPORT) as tmp:
            frame.drop(columns=["path"]).to_csv(tmp, index=False)
        log.info("wrote %s", sweep_dir / REPORT_FILE)
    ok = frame[frame["status"] == "ok"]
    return float(ok[str(cfg.sort_by)].iloc[0]) if len(ok) else math.nan
