"""C++ selector (scripts/cpp): builds against onnxruntime, answers exactly like the Python runtime.

The build (conftest's cpp_build: scripts/cpp/build.sh into a temporary directory) needs an
onnxruntime C/C++ package (ONNXRUNTIME_ROOT or an installed onnxruntime CMake package); the
tests skip without one, or without cmake or a C++ compiler. Any other build failure fails them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ckpred.export import manifest as mf
from ckpred.export.build import ExportOptions, export_pipeline
from ckpred.runtime import KernelSelector
from export_helpers import EDGE_SHAPES, TRAIN_SHAPES, configs, export_gemm, fit_pipeline, gemm, synthetic_table

# builds and runs the C++ binaries: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CPP = REPO / "scripts" / "cpp"


@pytest.fixture(scope="module")
def binary(cpp_build: Path) -> Path:
    path = cpp_build / "ckpred_select"
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return export_gemm(tmp_path_factory.mktemp("cpp") / "gemm_universal_gfx950_fp8_rcr", n_estimators=30)


@pytest.fixture(scope="module")
def reranked_model(tmp_path_factory) -> Path:
    """The default strategy: learned candidates ranked by a small reranker of the same recipe."""
    from ckpred.config import compose
    from ckpred.export import strategies as st

    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    pipe = fit_pipeline(op, cfg, table, n_estimators=30)
    keep = st.keep_for_table(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, top_n=2)
    recipe = compose("export", ["features=minimal", "model=lgbm_regressor", "target=log1p", "model.n_jobs=1"])
    size = {"n_estimators": 15, "num_leaves": 7}
    reranker = st.fit_reranker(table, op, keep, st.Strategy(cfg.arch, cfg.dtype, cfg.layout, reranker=size,
                                                            recipe=recipe))
    d = tmp_path_factory.mktemp("cpp_reranked") / "gemm_universal_gfx950_fp8_rcr"
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                    training=mf.training_section(table, op),
                    options=ExportOptions(select="reranked", candidates=keep, reranker=reranker,
                                          selection={"top_n": 2, "reranker": size}))
    return d


def _run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("strategy", ["model", "reranked_model"])
def test_cpp_output_equals_python_runtime(binary, strategy, tmp_path, request) -> None:
    model = request.getfixturevalue(strategy)
    shapes = EDGE_SHAPES + TRAIN_SHAPES + [(100000, 1536, 7168)]
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("# m,n,k\n" + "\n".join(f"{m},{n},{k}" for m, n, k in shapes) + "\n")
    out = _run(binary, model, "--top-k", 7, "--shapes", shape_file, "--arch", "gfx950", "--dtype", "fp8")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == len(shapes)
    sel = KernelSelector.load(model, cache_size=0)
    n_ok = n_ood = 0
    for got, shape in zip(lines, shapes):
        want = sel.select(*shape, top_k=7)
        assert got["problem"] == want.problem
        assert got["ok"] == want.ok and got["num_valid"] == want.num_valid
        assert [k["id"] for k in got["kernels"]] == list(want.ids)
        assert [k["name"] for k in got["kernels"]] == list(want.kernels)
        assert [k["score"] for k in got["kernels"]] == list(want.scores)  # bit-identical doubles
        assert got["out_of_distribution"] == want.out_of_distribution
        assert got["ood_fields"] == want.to_dict()["ood_fields"]
        n_ok += want.ok
        n_ood += want.out_of_distribution
    assert n_ok >= len(TRAIN_SHAPES)  # the comparison covered real rankings, not only "no kernel"
    assert 0 < n_ood < len(shapes)  # and both flagged and unflagged problems


def test_cpp_named_fields_and_defaults(binary, model) -> None:
    a = _run(binary, model, "--top-k", 3, "m=128,n=1536,k=7168", "128,1536,7168,1", "64,1,4096")
    assert a.returncode == 0, a.stderr
    first, second, degenerate = (json.loads(x) for x in a.stdout.splitlines())
    assert first == second and first["problem"]["split_k"] == 1
    assert not degenerate["ok"] and degenerate["kernels"] == [] and "no valid kernel" in degenerate["reason"]
    assert degenerate["out_of_distribution"] and degenerate["ood_fields"] == {"n": [1, [576, 9216]]}


def test_cpp_refuses_tampered_and_mismatched_models(binary, model, tmp_path) -> None:
    wrong = _run(binary, model, "--arch", "gfx942", "128,1536,7168")
    assert wrong.returncode == 3 and "model is for arch 'gfx950', asked for 'gfx942'" in wrong.stderr
    copy = tmp_path / "m"
    shutil.copytree(model, copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[-10] ^= 0x01
    (copy / "model.onnx").write_bytes(bytes(data))
    tampered = _run(binary, copy, "128,1536,7168")
    assert tampered.returncode == 3 and "sha256" in tampered.stderr and "does not match" in tampered.stderr
    assert len(tampered.stderr.splitlines()) == 1
    bad = _run(binary, model, "1,2,3,4,5")
    assert bad.returncode == 2 and "has 5 values" in bad.stderr
    bad = _run(binary, model, "m=1,n=2")
    assert bad.returncode == 2 and "'k' is required" in bad.stderr


def test_cpp_bench_mode_reports_latency(binary, model) -> None:
    out = _run(binary, model, "--bench", 2, "128,1536,7168", "1,7168,4096")
    assert out.returncode == 0, out.stderr
    bench = json.loads(out.stdout)["bench"]
    # pass 1 is cold (2 unseen problems), pass 2 answers from the per-problem cache
    assert bench["runs"] == 2 and bench["hit_runs"] == 2
    assert 0 < bench["min_us"] <= bench["median_us"] <= bench["p99_us"]
    assert bench["hit_median_us"] < bench["median_us"]


@pytest.fixture(scope="module")
def transfer_model(tmp_path_factory) -> Path:
    """The transfer recipe of a leave-one-GPU-out run (made-up Kernel Tuner caches of five GPUs)
    exported for the H100, a GPU it never trained on: the selector blends in its static order."""
    from transfer_helpers import export_transfer, train_logo, write_caches

    root = tmp_path_factory.mktemp("cpp_transfer")
    caches = write_caches(root / "kt")
    return export_transfer(train_logo(caches, root / "run"), caches, root / "ex")


def test_cpp_answers_the_transfer_recipe_as_the_python_runtime(binary, transfer_model) -> None:
    manifest = json.loads((transfer_model / "manifest.json").read_text())
    assert 0 < manifest["transfer"]["weight"] < 1  # the rank-percentile blend is in the graph
    gpus = ["H100", "A100", "MI250X", "W6600"]
    out = _run(binary, transfer_model, "--top-k", 9, *(f"gpu={g}" for g in gpus))
    assert out.returncode == 0, out.stderr
    sel = KernelSelector.load(transfer_model, cache_size=0)
    for line, gpu in zip(out.stdout.splitlines(), gpus):
        got, want = json.loads(line), sel.select(gpu=gpu, top_k=9)
        assert [k["id"] for k in got["kernels"]] == list(want.ids)
        assert [k["score"] for k in got["kernels"]] == list(want.scores)  # bit-identical doubles
        assert got["num_valid"] == want.num_valid and len(want.ids) == 9
