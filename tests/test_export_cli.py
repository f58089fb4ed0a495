"""``python -m ckpred export`` end to end (fit on the tiny simulated set, or a train run_dir)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import joblib
import pytest
from omegaconf import OmegaConf

from ckpred.config import compose, compose_node
from ckpred.data import load_table
from ckpred.runs import load_pipeline
from ckpred.util import sha256_file
from ckpred.data.table import data_hash
from ckpred.errors import ModelMismatchError
from ckpred.commands.export import export_command
from ckpred.runtime import KernelSelector
from export_helpers import TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table

FAST = ["shapes=tiny", "features=minimal", "model.n_estimators=15", "model.n_jobs=1"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpred", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_export_then_select_from_the_command_line(tmp_path) -> None:
    out = _cli("export", "arch=gfx950", "dtype=fp8", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    d = tmp_path / "exports" / "gemm_universal_gfx950_fp8_rcr"
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "model.onnx", "scorer.onnx"]
    assert "top-1 agreement 100.00%" in out.stdout
    # each step is named with its time as it finishes (the export used to be silent for tens of seconds)
    for step in ("loading the training table", "fitting the model on all", "learning the candidate kernels",
                 "fitting the reranker (70 trees)", "compiling the ONNX graphs, checking parity on 12 shapes"):
        assert re.search(rf"^export: {re.escape(step)}.* \(\d+\.\d s\)$", out.stdout, re.M), (step, out.stdout)
    man = json.loads((d / "manifest.json").read_text())
    assert man["parity"]["checked"] and man["parity"]["shapes"] == 12 and man["parity"]["top1_agreement"] == 1.0
    assert man["parity"]["max_abs_diff_scorer"] <= 1e-6
    assert man["source"]["kind"] == "fit" and man["source"]["config"]["model"]["n_estimators"] == 15
    assert man["training"]["shapes"] == 12 and man["training"]["problem_ranges"]["m"] == [1, 16384]
    assert man["model"]["n_trees"] == 15 and man["model"]["target"] == "rank"  # train's default model
    # default strategy: the candidates, ranked by the small reranker of the same recipe
    # (70 trees: the default size at the ranker's learning rate 0.1, see reranker_size)
    assert man["select"] == "reranked" and man["selection"]["reranker"] == {"n_estimators": 70, "num_leaves": 31}
    assert man["selector_model"]["params"]["num_leaves"] == 31 and man["selector_model"]["target"] == "rank"
    assert man["selection"]["candidates"] == len(man["selection"]["candidate_ids"]) < man["catalogue"]["count"]
    sel = _cli("select", "arch=gfx950", "dtype=fp8", "problem.m=128", "problem.n=1536", "problem.k=7168", "top_k=2",
               "json=true", cwd=tmp_path)
    assert sel.returncode == 0, sel.stderr[-3000:]
    got = json.loads(sel.stdout.strip().splitlines()[-1])
    assert got["ok"] and len(got["kernels"]) == 2
    assert got == json.loads(json.dumps(KernelSelector.load(d).select(128, 1536, 7168, top_k=2).to_dict()))


@pytest.mark.slow
def test_bad_export_option_names_key_value_allowed(tmp_path) -> None:
    out = _cli("export", "select=cascade", *FAST, cwd=tmp_path)
    assert out.returncode != 0
    assert "select" in out.stderr and "'cascade'" in out.stderr and "full" in out.stderr


@pytest.fixture()
def run_dir(tmp_path):
    """A finished train run as train writes it: pipeline.joblib, run.json, .hydra/config.yaml."""
    op, cfg = gemm(), configs()
    pipe = fit_pipeline(op, cfg, synthetic_table(op, cfg, TRAIN_SHAPES), n_estimators=10)
    run = tmp_path / "runs" / "train" / "r1"
    (run / ".hydra").mkdir(parents=True)
    joblib.dump(pipe, run / "pipeline.joblib")
    run_cfg = compose_node("export", ["shapes=tiny"])
    OmegaConf.save(run_cfg, run / ".hydra" / "config.yaml")
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)  # the simulated data cache lives under the working directory
    try:
        table_hash = data_hash(load_table(run_cfg).reset_index(drop=True))
    finally:
        os.chdir(cwd)
    (run / "run.json").write_text(json.dumps({
        "op": "gemm_universal", "arch": "gfx950", "dtype": "fp8", "layout": "rcr",
        "data": {"hash": table_hash}, "pipeline": {"sha256": sha256_file(run / "pipeline.joblib")},
        "metrics": {"model": {"mean": 0.975}}}))
    return run


@pytest.mark.slow
def test_export_of_a_train_run_dir(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex", "parity.shapes=4"]))
    man = json.loads((Path(out) / "manifest.json").read_text())
    assert Path(out) == tmp_path / "ex" / "gemm_universal_gfx950_fp8_rcr"
    assert man["source"]["kind"] == "run_dir"
    assert man["source"]["train_data_hash"] == man["training"]["data_hash"]
    assert man["source"]["pipeline_sha256"] == sha256_file(run_dir / "pipeline.joblib")
    assert man["metrics"] == {"model": {"mean": 0.975}}
    assert man["model"]["n_trees"] == 10 and man["parity"]["shapes"] == 4 and man["parity"]["top1_agreement"] == 1.0
    assert man["training"]["shapes"] == 12  # ranges of the run's own (tiny) data


@pytest.mark.slow
def test_export_of_a_run_with_oof_predictions_carries_the_autotune_calibration(run_dir, tmp_path, monkeypatch) -> None:
    import numpy as np
    import pandas as pd

    from ckpred import autotune as at

    monkeypatch.chdir(tmp_path)
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    pipe = load_pipeline(run_dir / "pipeline.joblib")
    oof = pd.DataFrame({"shape": op.shape_keys(table), "fold": np.arange(len(table)) % 3,
                        "kernel_name": table["kernel_name"], "perf": table["tflops"], "selectable": table["is_valid"],
                        "score_model": pipe.predict(op.encode_frame(table))})
    oof.to_parquet(run_dir / "oof_predictions.parquet")
    out = export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex", "parity.shapes=2", "select=full"]))
    man = json.loads((Path(out) / "manifest.json").read_text())
    cal = at.Calibration.from_dict(man["autotune"])
    assert cal.within == (0.01, 0.02, 0.05, 0.1) and sum(cal.counts) == len(TRAIN_SHAPES)
    sel = KernelSelector.load(out)
    calls = []
    result = sel.autotune({"m": 128, "n": 1536, "k": 7168}, lambda name: calls.append(name) or 1e-3,
                          at.Confidence(target=0.5, within=0.05))
    assert result.ok and len(calls) == cal.needed(sel.select(128, 1536, 7168, top_k=16).scores, 0.5, 0.05)
    reranked = export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex2", "parity.shapes=2"]))
    # this fake run tested other shapes than its table holds: no per-fold reranker scores, no table
    assert json.loads((Path(reranked) / "manifest.json").read_text())["autotune"] is None


@pytest.mark.slow
def test_run_dir_for_another_arch_is_refused(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    man = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**man, "arch": "gfx942"}))
    with pytest.raises(ModelMismatchError, match="arch is 'gfx942'.*has 'gfx950'.*pass arch=gfx942"):
        export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex"]))
    assert not (tmp_path / "ex").exists()


@pytest.mark.slow
def test_run_dir_with_other_data_or_replaced_pipeline_is_refused(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    man = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**man, "data": {"hash": "0" * 64}}))
    with pytest.raises(ModelMismatchError, match="is not the data run_dir=.* was trained on"):
        export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex"]))
    (run_dir / "run.json").write_text(json.dumps({**man, "pipeline": {"sha256": "1" * 64}}))
    with pytest.raises(ModelMismatchError, match="pipeline.joblib: sha256 .* differs from the run record"):
        export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex"]))
    assert not (tmp_path / "ex").exists()


def test_run_dir_without_pipeline_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty" / ".hydra").mkdir(parents=True)  # what Hydra leaves of a run that failed early
    (tmp_path / "empty" / "train.log").write_text("")
    with pytest.raises(FileNotFoundError, match="not a finished train run.*failed or is still running; see train.log"):
        export_command(compose("export", ["run_dir=empty"]))
    (tmp_path / "empty" / "metrics.json").write_text("{}")  # finished, without its pipeline
    with pytest.raises(FileNotFoundError, match="pipeline.joblib.*save_pipeline=true"):
        export_command(compose("export", ["run_dir=empty"]))


def _train_then_export(cv: str) -> dict:
    """A tiny train run (``cv`` override) in ./run, exported with a small reranker: the manifest's
    ``selection.cv``."""
    from ckpred.commands.train import train

    small = ["shapes=tiny", "model.n_estimators=8", "model.num_leaves=7", "model.n_jobs=1", "rows.max_per_shape=192",
             "rows.keep_top=32"]
    train(compose("train", [*small, cv, "progress=false", "plots=false", "out_dir=run",
                            "baselines.reference.enabled=false"]))
    out = export_command(compose("export", [*small, "run_dir=run", "out_dir=ex", "parity.shapes=3",
                                            "reranker.n_estimators=10", "reranker.num_leaves=7"]))
    return json.loads((Path(out) / "manifest.json").read_text())["selection"]["cv"]


@pytest.mark.slow
def test_export_of_a_train_run_reports_the_strategy_under_the_runs_cv(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cv = _train_then_export("cv.n_splits=3")
    reported = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert cv["folds"] == 3 and cv["full"]["shapes"] == cv["reranked"]["shapes"] == 12
    # "full" is the run's own out-of-fold result, recomputed: it must equal what train reported
    assert cv["full"]["mean"] == pytest.approx(reported["model"]["mean"], abs=1e-12)
    assert 0.3 < cv["reranked"]["mean"] <= 1.0 and cv["reranked"]["p10"] <= cv["reranked"]["mean"]


@pytest.mark.slow
def test_run_dir_without_run_record_is_compiled_from_its_hydra_config(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (run_dir / "run.json").unlink()  # e.g. a run copied without it: the pipeline alone still exports
    out = export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex", "parity.shapes=2", "select=full"]))
    man = json.loads((Path(out) / "manifest.json").read_text())
    assert man["source"]["pipeline_sha256"] == sha256_file(run_dir / "pipeline.joblib")
    assert man["source"]["train_data_hash"] is None and man["metrics"] is None
    assert man["training"]["shapes"] == 12  # the run's .hydra/config.yaml (tiny shapes), not this config's data


@pytest.mark.slow
def test_run_dir_written_before_the_rename_is_read_through_its_manifest_json(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (run_dir / "run.json").rename(run_dir / "manifest.json")
    out = export_command(compose("export", [f"run_dir={run_dir}", "out_dir=ex", "parity.shapes=2", "select=full"]))
    man = json.loads((Path(out) / "manifest.json").read_text())
    assert man["metrics"] == {"model": {"mean": 0.975}} and man["source"]["train_data_hash"] is not None


@pytest.mark.slow
def test_export_of_a_holdout_run_says_why_it_has_no_cv_report(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cv = _train_then_export("cv=holdout")
    assert "1 fold(s)" in cv["skipped"] and "k-fold CV" in cv["skipped"]  # holdout tests a part of the shapes


@pytest.mark.slow
def test_reranked_export_of_a_run_with_two_cv_groups(tmp_path, monkeypatch) -> None:
    """Two CV groups: each fold trains on one shape, whose winner is the fold's only candidate;
    nothing is left to rerank there, so the fold keeps the full model's scores (the reranker is
    still fitted on the whole table, where the two shapes give two candidates)."""
    import gzip

    from ckpred.cli import main
    from test_user_op_end_to_end import USER_CONF, write_table

    monkeypatch.chdir(tmp_path)
    lines = gzip.open(write_table(tmp_path / "t.csv.gz", n_shapes=2), "rt").read().splitlines()
    (tmp_path / "t.csv").write_text("\n".join(line for line in lines if ",fp16," in line or line.startswith("M,")))
    common = ["--config-dir", str(USER_CONF), "op=tmm", "features=tmm_feats", "data=path", "data.path=t.csv"]
    assert main(["train", *common, "cv.n_splits=2", "model.n_estimators=10", "model.n_jobs=1", "plots=false",
                 "progress=false", "out_dir=run"]) == 0
    folds = json.loads((tmp_path / "run" / "folds.json").read_text())["folds"]
    assert [len(f["test_shapes"]) for f in folds] == [1, 1]
    assert main(["export", *common, "run_dir=run", "out_dir=ex"]) == 0
    man = json.loads((tmp_path / "ex" / "tmm_gfx950_fp8_rcr" / "manifest.json").read_text())
    assert man["select"] == "reranked" and man["parity"]["top1_agreement"] == 1.0
    cv = man["selection"]["cv"]
    assert cv["folds"] == 2 and cv["reranked"]["shapes"] == cv["full"]["shapes"] == 2
    # one shape: its winner is the only candidate, so the export says so and compiles select=pruned
    one = [line for line in lines if line.startswith("64,128,256,fp16,")]
    (tmp_path / "one.csv").write_text("\n".join(lines[:1] + one))
    assert main(["export", *common[:-1], "data.path=one.csv", "out_dir=ex1", "model.n_estimators=5"]) == 0
    man = json.loads((tmp_path / "ex1" / "tmm_gfx950_fp8_rcr" / "manifest.json").read_text())
    assert man["select"] == "pruned" and man["selection"]["candidates"] == 1 and "reranker" not in man["selection"]


@pytest.mark.slow  # a whole train and export
def test_a_run_exports_from_another_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Train with the table's file inside the working directory (``source`` names it relative to
    it), export from elsewhere (``source`` is then absolute): the same rows, so the export goes
    ahead; a file changed since training is still refused."""
    from ckpred.commands.export import export_command
    from ckpred.config import compose
    from ckpred.cv.driver import cross_validate
    from ckpred.errors import ModelMismatchError
    from tests.test_yaml_ops_train import OPS_DIR, write_find_db

    (tmp_path / "work").mkdir()
    fdb = write_find_db(tmp_path / "work" / "small.fdb.txt")
    monkeypatch.chdir(tmp_path / "work")
    run = tmp_path / "work" / "run"
    run.mkdir()
    common = [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx942", "dtype=fp16", "data=path",
              f"data.path={fdb}"]
    cross_validate(compose("train", [*common, f"out_dir={run}", "model.n_estimators=10", "model.n_jobs=1",
                                     "baselines.plain.model.n_estimators=5", "cv.n_splits=3", "plots=false",
                                     "progress=false"]), run)
    assert json.loads((run / "run.json").read_text())["data"]["content_hash"]
    monkeypatch.chdir(tmp_path)
    out = export_command(compose("export", [*common, f"run_dir={run}", "out_dir=ex", "parity.shapes=20"]))
    assert json.loads((Path(out) / "manifest.json").read_text())["parity"]["top1_agreement"] == 1.0
    fdb.write_text(fdb.read_text().replace("GemmFwd1x1_0_2:", "GemmFwd1x1_0_2:1", 1))
    with pytest.raises(ModelMismatchError, match="is not the data run_dir="):
        export_command(compose("export", [*common, f"run_dir={run}", "out_dir=ex", "parity.shapes=20"]))


def test_a_model_for_a_gpu_the_table_lacks_is_exported_from_its_train_run(tmp_path: Path) -> None:
    """An export that fits here fits the config's own recipe; for a GPU none of the table's rows
    come from, ``train`` fits the transfer recipe and its CV scores that one, so the export refuses
    (naming the arch, the table's GPUs and the run_dir route) instead of deploying an unscored model."""
    from ckpred.errors import ConfigValueError
    from tests.test_plan import KT_GPUS, SEARCH, write_kt_cache

    files = [write_kt_cache(tmp_path / f"{d.split()[-1]}.json", d) for d in list(KT_GPUS)[:3]]
    common = [SEARCH, "experiment=kernel_tuner_gpus", f"data.path=[{','.join(map(str, files))}]",
              "model.n_estimators=5", f"out_dir={tmp_path / 'out'}"]
    with pytest.raises(ConfigValueError, match=r"'arch' has invalid value 'sm90_h100'.*\(gfx1032, gfx1100, gfx90a\)"
                                               r".*run_dir="):
        export_command(compose("export", [*common, "arch=sm90_h100"]))
    assert not (tmp_path / "out").exists()
    exported = Path(export_command(compose("export", [*common, "arch=gfx1100"])))  # a GPU of the table
    assert json.loads((exported / "manifest.json").read_text())["arch"] == "gfx1100"
