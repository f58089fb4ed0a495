"""Sweeps: ``train -m`` through the joblib and submitit launchers, the SLURM launcher config as
the sbatch script it produces, and ``sweep-report`` over the jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ckpred.cli import _positional_to_override, run_command
from ckpred.config import compose
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.commands.sweep_report import collect, report_frame, sweep_report

# runs Hydra sweeps through their launchers: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

#: The smallest train job that still exercises CV + evaluation (2 folds of the tiny shape set).
TINY_JOB = ["shapes=tiny", "model.n_estimators=4", "model.n_jobs=1", "rows.max_per_shape=64",
            "rows.keep_top=16", "cv.n_splits=2", "progress=false", "plots=false", "save_pipeline=false",
            "baselines.reference.enabled=false", "baselines.analytical=false"]


def _sweep(sweep_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckpred", "train", "-m", *TINY_JOB, *args,
                           f"hydra.sweep.dir={sweep_dir}"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=env)


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    sweep_dir = tmp_path_factory.mktemp("sweep") / "multirun"
    proc = _sweep(sweep_dir, "model.num_leaves=3,15", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, proc.stdout + proc.stderr


def test_sweep_with_out_dir_gives_each_job_its_own_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _sweep(tmp_path / "multirun", "model.num_leaves=3,4", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["0", "1"]
    leaves = sorted(json.loads((out / job / "run.json").read_text())["config"]["model"]["num_leaves"]
                    for job in ("0", "1"))
    assert leaves == [3, 4]  # nothing overwritten: each job's own run


def _job_mean_from_log(job_dir: Path) -> float:
    # train() logs the value it returns to the sweeper.
    match = re.search(r"model mean efficiency (\d\.\d+)", (job_dir / "train.log").read_text())
    assert match, (job_dir / "train.log").read_text()[-1000:]
    return float(match.group(1))


def test_joblib_sweep_one_dir_and_config_per_job(joblib_sweep: tuple[Path, str]) -> None:
    sweep_dir, output = joblib_sweep
    assert "Joblib.Parallel(n_jobs=2" in output
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
    leaves = {}
    for job in ("0", "1"):
        job_dir = sweep_dir / job
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
        manifest = json.loads((job_dir / "run.json").read_text())
        metrics = json.loads((job_dir / "metrics.json").read_text())
        (value,) = [o.split("=")[1] for o in overrides if o.startswith("model.num_leaves=")]
        assert manifest["config"]["model"]["num_leaves"] == int(value)  # each job ran its own config
        assert manifest["timings_s"]["total_s"] > 0
        assert round(metrics["model"]["mean"], 4) == _job_mean_from_log(job_dir)
        leaves[job] = int(value)
    assert sorted(leaves.values()) == [3, 15]
    assert yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["hydra"]["job"]["name"] == "train"


def test_sweep_report_cli_positional(joblib_sweep: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, _ = joblib_sweep
    run_command("sweep-report", [str(sweep_dir)])  # the bare positional dir, as typed on the CLI
    out = capsys.readouterr().out
    means = {job: json.loads((sweep_dir / job / "metrics.json").read_text())["model"]
             for job in ("0", "1")}
    order = sorted(means, key=lambda j: -means[j]["mean"])
    assert sweep_report(compose("sweep_report", [f"dir={sweep_dir}", "csv=false"])) == \
        pytest.approx(means[order[0]]["mean"])  # the value the task function returns
    assert "2 of 2 jobs finished" in out and "shared by every job" in out
    # rows in descending mean with their P10 and the override that varies
    lines = [line for line in out.splitlines() if "model.num_leaves=" in line]
    assert [re.search(r"num_leaves=(\d+)", line).group(1) for line in lines] == \
        [_leaves(sweep_dir / j) for j in order]  # type: ignore[union-attr]
    assert f"{100 * means[order[0]]['mean']:.2f}" in lines[0] and f"{100 * means[order[0]]['p10']:.2f}" in lines[0]
    csv = pd.read_csv(sweep_dir / "sweep_report.csv")
    assert csv["job"].astype(str).tolist() == order
    assert csv["mean"].tolist() == pytest.approx([means[j]["mean"] for j in order])
    assert csv["overrides"].str.fullmatch(r"model\.num_leaves=\d+").all()
    assert (csv["wall_s"] > 0).all()


def _leaves(job_dir: Path) -> str:
    overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
    return next(o.split("=")[1] for o in overrides if o.startswith("model.num_leaves="))


def test_sweep_report_lists_failed_jobs_last(joblib_sweep: tuple[Path, str], tmp_path: Path) -> None:
    sweep_dir, _ = joblib_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    broken = copy / "2" / ".hydra"
    broken.mkdir(parents=True)
    (broken / "overrides.yaml").write_text("- model.num_leaves=255\n")
    (copy / "1" / "metrics.json").write_text("{not json")
    jobs = collect(copy)
    assert [j.name for j in jobs][0] == "0" and {j.name for j in jobs[1:]} == {"1", "2"}
    assert [j.status for j in jobs] == ["ok", "failed", "failed"]
    frame = report_frame(jobs)
    assert "unreadable metrics.json" in frame.loc[frame["job"] == "1", "note"].item()
    assert "no metrics.json" in frame.loc[frame["job"] == "2", "note"].item()
    assert frame["rank"].isna().tolist() == [False, True, True]


def test_sweep_report_refuses_missing_or_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such directory") as err:
        collect(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(err.value)
    with pytest.raises(InputFileError, match="no job directories"):
        collect(tmp_path)
    with pytest.raises(ConfigValueError, match="sort_by"):
        compose("sweep_report", ["dir=x", "sort_by=median"])


def test_positional_argument_translation() -> None:
    assert _positional_to_override(["multirun/train/a b", "csv=false"], "dir") == ["dir='multirun/train/a b'",
                                                                                  "csv=false"]
    assert _positional_to_override(["--cfg", "job", "x"], "dir") == ["--cfg", "job", "dir='x'"]
    assert _positional_to_override(["it's"], "dir") == ["dir='it\\'s'"]
    assert _positional_to_override(["dir=x"], "dir") == ["dir=x"]
    assert _positional_to_override(["x"], "") == ["x"]


def test_submitit_local_launcher_runs_a_job(tmp_path: Path) -> None:
    """``hydra/launcher=slurm_local``: submitit's LocalExecutor, the cluster code path, one job."""
    sweep_dir = tmp_path / "multirun"
    proc = _sweep(sweep_dir, "model.num_leaves=7", "hydra/launcher=slurm_local")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Submitit 'local' sweep output dir" in proc.stdout + proc.stderr
    metrics = json.loads((sweep_dir / "0" / "metrics.json").read_text())
    assert 0 < metrics["model"]["mean"] <= 1
    results = list((sweep_dir / ".submitit").rglob("*_result.pkl"))
    assert len(results) == 1  # the job ran through submitit, which pickled its JobReturn


def test_slurm_launcher_config_becomes_this_sbatch_script(tmp_path: Path) -> None:
    """No cluster here: a stand-in ``sbatch`` records the script submitit generates, then refuses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\nfor a in "$@"; do last="$a"; done\ncp "$last" "$SBATCH_RECORD"\n'
                                    'echo "sbatch: refused by the test stand-in" >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")  # submitit checks that srun exists
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "submitted.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_RECORD": str(record)}
    proc = _sweep(tmp_path / "multirun", "model.num_leaves=7,15", "hydra/launcher=slurm",
                  "hydra.launcher.partition=cpu", "hydra.launcher.timeout_min=30", env=env)
    assert proc.returncode != 0 and "refused by the test stand-in" in proc.stderr
    script = record.read_text()
    for line in ("#SBATCH --partition=cpu", "#SBATCH --time=30", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --mem=16GB", "#SBATCH --array=0-1%2", "#SBATCH --job-name=train"):
        assert line in script, script
    assert f"{tmp_path / 'multirun'}/.submitit/" in script
