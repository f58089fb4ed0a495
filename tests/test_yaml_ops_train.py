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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _export(tmp_path: Path, *overrides: str) -> Path:
    from ckpred.commands.export import export_command

    cfg = compose("export", [f"hydra.searchpath=[file://{OPS_DIR}]", "model.n_estimators=8", "model.n_jobs=1",
                             "parity.shapes=3", f"out_dir={tmp_path / 'ex'}", *overrides])
    return Path(export_command(cfg))


def _autotune_by_category(model: Path, problems: list[dict], store: Path) -> None:
    """F08: autotune takes category fields by their value, as select does, benchmarks in the
    model's order and serves the stored winner the next time."""
    from ckpred.autotune import FixedK
    from ckpred.runtime import KernelSelector

    sel = KernelSelector.load(model, cache_size=0)
    for problem in problems:
        ranked = sel.select(problem, top_k=16)
        calls: list[str] = []
        result = sel.autotune(problem, lambda name: calls.append(name) or 1e-3 / len(calls), FixedK(2), store=store)
        assert result.ok and result.stored and calls == list(ranked.kernels[:2])
        assert result.kernel == calls[-1]  # the faster of the two (the second)
        again = sel.autotune(problem, lambda name: 1.0, FixedK(2), store=store)
        assert again.from_store and again.kernel == result.kernel


@pytest.mark.slow
def test_autotune_a_miopen_export_by_category_values(tmp_path: Path) -> None:
    data = write_find_db(tmp_path / "small.fdb.txt")
    model = _export(tmp_path, "op=miopen_conv", "arch=gfx942", "data=path", f"data.path={data}")
    geometry = dict(n=1, c=16, hi=7, wi=7, k=32, ho=7, wo=7, y=1, x=1, pad_h=0, pad_w=0, stride_h=1, stride_w=1,
                    dilation_h=1, dilation_w=1, groups=1, bias=0, layout="NCHW")
    _autotune_by_category(model, [{**geometry, "dtype": d, "direction": w} for d in ("FP32", "FP16")
                                  for w in ("F", "W")], tmp_path / "s.jsonl")


def test_autotune_a_kernel_tuner_export_by_gpu(tmp_path: Path) -> None:
    source = json.loads((REPO / "tests" / "fixtures" / "kernel_tuner_small.json").read_text())
    for name in ("AMD Instinct MI250X", "AMD Radeon PRO W6600", "AMD Radeon PRO W7800"):
        (tmp_path / f"{name.split()[-1]}.json").write_text(json.dumps({**source, "device_name": name}))
    model = _export(tmp_path, "op=kernel_tuner_conv", "features=kernel_tuner_conv", "arch=gfx90a", "dtype=fp32",
                    "model=lgbm_ranker", "data=path", f"data.path={tmp_path}/*.json")
    _autotune_by_category(model, [{"gpu": "W6600"}, {"gpu": "MI250X"}], tmp_path / "s.jsonl")
