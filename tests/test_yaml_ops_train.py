"""Training and evaluating ops declared by YAML alone (tests/ops: op, features, experiment)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ckpred.config import compose
from ckpred.cv.driver import cross_validate
from tests.conftest import REPO, shared_file

OPS_DIR = REPO / "tests" / "ops"
SMALL = ["model.n_estimators=8", "model.n_jobs=1", "baselines.plain.model.n_estimators=8",
         "plots=false", "progress=false", "save_pipeline=false"]
SOLVERS = {"F": ["ConvAsmImplicitGemmGTCDynamicFwdXdlopsNHWC", "GemmFwd1x1_0_2", "ConvBinWinogradRxSf3x2"],
           "B": ["ConvAsmImplicitGemmGTCDynamicBwdXdlopsNHWC", "GemmBwd1x1_stride2", "GemmBwdRest"],
           "W": ["ConvAsmImplicitGemmGTCDynamicWrwXdlopsNHWC", "GemmWrw1x1_stride1", "GemmWrwUniversal"]}


def write_find_db(path: Path, n_convs: int = 12, seed: int = 0) -> Path:
    """A made-up MIOpen find-db in the real format: F, B and W lines of each convolution in two
    dtypes (B and W keys list the forward output first), three solvers each, one solver best on
    small channel counts and another on large ones."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_convs):
        c, k, hw, n = 16 << (i % 4), 32 << (i % 3), 7 * (1 + i % 3), 1 << (i % 5)
        for dtype in ("FP32", "FP16"):
            for d in "FBW":
                first, second = (f"{c}-{hw}-{hw}", f"{k}-{hw}-{hw}") if d == "F" else (f"{k}-{hw}-{hw}", f"{c}-{hw}-{hw}")
                key = f"{first}-1x1-{second}-{n}-0x0-1x1-1x1-0-NCHW-{dtype}-{d}"
                work = c * k * hw * hw * n / 1e6
                times = [0.01 + work * (2.0 if c < 64 else 0.5), 0.01 + work, 0.02 + work * (0.6 if c < 64 else 3.0)]
                entries = [f"{s}:{t * rng.uniform(0.95, 1.05):.6f},0,algo" for s, t in zip(SOLVERS[d], times)]
                lines.append(f"{key}={';'.join(entries)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(tmp_path: Path, data: Path, *extra: str) -> dict:
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "op=miopen_conv", "arch=gfx942", "data=path",
                            f"data.path={data}", f"out_dir={tmp_path / 'run'}", *SMALL, *extra])
    (tmp_path / "run").mkdir()
    cross_validate(cfg, tmp_path / "run")
    return json.loads((tmp_path / "run" / "metrics.json").read_text())


def test_miopen_conv_trains_end_to_end_through_its_yaml_op_and_features(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    metrics = _train(tmp_path, write_find_db(tmp_path / "small.fdb.txt"), "cv.n_splits=3")
    # the op has no reference feature set: the run says so and trains without it
    assert "baseline reference skipped: op 'miopen_conv' has no features/reference_miopen_conv" in capsys.readouterr().out
    assert {"model", "plain", "random", "best_static"} <= set(metrics) and "reference" not in metrics
    for name in ("model", "plain", "random", "best_static"):
        assert 0 < metrics[name]["mean"] <= 1
    # 12 convolutions x 2 dtypes x 3 directions = 72 queries, out of fold
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["features"] == "miopen_conv" and record["data"]["shapes"] == 72
    assert record["data"]["shape_ranges"]["direction"] == ["B", "F", "W"]
    # folds hold out whole convolutions: all six problems of one geometry are in one fold
    folds = json.loads((tmp_path / "run" / "folds.json").read_text())["folds"]
    assert len(folds) == 3
    fold_of_geometry: dict[str, set[int]] = {}
    for i, fold in enumerate(folds):
        for key in fold["test_shapes"]:
            fold_of_geometry.setdefault(key.rsplit("x", 4)[0], set()).add(i)
    assert len(fold_of_geometry) == 12 and all(len(f) == 1 for f in fold_of_geometry.values())


def test_best_static_by_a_field_the_op_lacks_is_refused_naming_it(tmp_path: Path) -> None:
    from ckpred.errors import ConfigValueError

    with pytest.raises(ConfigValueError, match="baselines.best_static_by.*'layuot'.*a problem field of op miopen_conv"):
        _train(tmp_path, write_find_db(tmp_path / "small.fdb.txt", n_convs=4), "cv.n_splits=2",
               "baselines.best_static_by=[layuot]")


def test_the_experiment_yaml_composes() -> None:
    cfg = compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "experiment=miopen_gfx942",
                            "data.path=tests/fixtures/miopen_small.fdb.txt"])
    assert cfg.op.name == "miopen_conv" and cfg.features.name == "miopen_conv" and cfg.arch.name == "gfx942"
    assert cfg.cv.n_splits == 5 and list(cfg.baselines.best_static_by) == ["direction", "dtype"]


def test_real_find_db_sample_trains_with_its_baselines(tmp_path: Path) -> None:
    """A smoke run on the first 600 lines of the real gfx942 find-db."""
    import bz2

    src = shared_file("miopen_find_db", "gfx942130.HIP.fdb.txt.bz2")
    with bz2.open(src, "rt") as f:
        head = [next(f) for _ in range(600)]
    sample = tmp_path / "gfx942_head.fdb.txt"
    sample.write_text("".join(head))
    metrics = _train(tmp_path, sample, "cv.n_splits=3")
    assert {"model", "plain", "random", "best_static"} <= set(metrics)
    assert metrics["model"]["mean"] > metrics["random"]["mean"]
