"""A kernel family ckpred has never seen, onboarded by YAML alone, end to end.

The op (unfamiliar field names, a dtype column mixing fp16/bf16/fp32, times in milliseconds,
``inf`` for configurations that failed) and its feature set live in a user config dir
(``tests/fixtures/user_op``, passed with Hydra's ``--config-dir``); the table is a gzipped CSV.
Ingest, train, export and select run through the CLI, and the C++ selector gives the Python
runtime's answers bit for bit.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ckpred.cli import main
from test_cpp import binary  # noqa: F401  (fixture: builds the C++ selector)
from tests.conftest import REPO

USER_CONF = REPO / "tests" / "fixtures" / "user_op"
KERNELS = [(bm, bn, w, s) for bm in (32, 64, 128) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
DTYPES = (("fp16", 1.0), ("bf16", 1.05), ("fp32", 3.0))


def _fails(dtype: str, bm: int, bn: int, s: int) -> bool:
    return dtype == "fp32" and bm + bn >= 192 and s == 4


def write_table(path: Path, n_shapes: int = 24, seed: int = 0) -> Path:
    """A made-up matmul autotuning table in another tool's column names (gzipped CSV)."""
    rng = random.Random(seed)
    lines = ["M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms"]
    for i in range(n_shapes):
        m, n, k = 64 << (i % 6), 128 << (i // 6), 256 << (i % 3)
        for dtype, scale in DTYPES:
            for bm, bn, w, s in KERNELS:
                tiles = math.ceil(m / bm) * math.ceil(n / bn)
                fit = 1 + 0.3 * abs(math.log2(bm * bn / (m * n) ** 0.5 / 64))
                t = scale * (0.002 + 2 * m * n * k / 1e12 * fit * (1 + 0.05 * abs(w - 4)) * (1 + 0.1 * abs(s - 3))
                             + tiles * 1e-5) * rng.uniform(0.98, 1.02)
                ms = "inf" if _fails(dtype, bm, bn, s) else f"{t:.6f}"
                lines.append(f"{m},{n},{k},{dtype},{bm},{bn},{w},{s},{ms}")
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def _cli(tmp: Path, command: str, *args: str) -> None:
    assert main([command, "--config-dir", str(USER_CONF), "op=tmm", f"hydra.run.dir={tmp / 'hydra' / command}",
                 *args]) == 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("user_op")
    table = write_table(tmp / "tmm.csv.gz")
    _cli(tmp, "ingest", f"data.path={table}", f"out={tmp / 'tmm.parquet'}")
    recipe = ["features=tmm_feats", "data=path", f"data.path={table}", "model.n_estimators=20", "model.n_jobs=1",
              "plots=false", "progress=false"]
    _cli(tmp, "train", *recipe, "cv.n_splits=3", f"out_dir={tmp / 'run'}")
    _cli(tmp, "export", *recipe[:4], f"run_dir={tmp / 'run'}", f"out_dir={tmp / 'ex'}")
    (model,) = (tmp / "ex").iterdir()
    return tmp, model


@pytest.mark.slow
def test_ingest_keeps_every_row_and_marks_the_failures(exported: tuple[Path, Path]) -> None:
    import pandas as pd

    tmp, _ = exported
    table = pd.read_parquet(tmp / "tmm.parquet")
    assert len(table) == 24 * len(DTYPES) * len(KERNELS)  # nothing merged across dtypes
    assert set(table["precision"]) == {"fp16", "bf16", "fp32"}
    failed = table[~table["is_valid"]]
    assert len(failed) == 24 * sum(_fails("fp32", bm, bn, s) for bm, bn, _, s in KERNELS)
    assert (failed["precision"] == "fp32").all()
    # milliseconds were read as such: latency_ms equals the table's ms column for a valid row
    row = table[table["is_valid"]].iloc[0]
    assert 0 < row["latency_ms"] < 1


def test_train_reports_held_out_shapes_with_every_dtype_and_never_picks_a_failure(
        exported: tuple[Path, Path]) -> None:
    tmp, _ = exported
    metrics = json.loads((tmp / "run" / "metrics.json").read_text())
    assert "unseen (rows, cols, depth) " in metrics["_heading"]
    assert metrics["model"]["failed_pick"] == 0 and metrics["model"]["mean"] > metrics["random"]["mean"]
    assert set(metrics["model"]["by_precision"]) == {"fp16", "bf16", "fp32"}
    folds = json.loads((tmp / "run" / "folds.json").read_text())["folds"]
    for fold in folds:  # a fold holds out a shape with all its dtypes
        shapes = [key.rsplit("x", 1)[0] for key in fold["test_shapes"]]
        assert all(shapes.count(s) == len(DTYPES) for s in shapes)


def test_export_parity_and_python_select(exported: tuple[Path, Path]) -> None:
    from ckpred.runtime import KernelSelector

    _, model = exported
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["parity"]["top1_agreement"] == 1.0 and manifest["parity"]["max_abs_diff_selector"] == 0
    sel = KernelSelector.load(model, cache_size=0)
    answer = sel.select(rows=512, cols=256, depth=1024, precision="fp32", top_k=3)
    assert answer.ok and len(answer.kernels) == 3
    for name in answer.kernels:  # rule-valid and never a configuration that failed in training
        bm, bn, w, s = (int(part[1:].lstrip("mnws")) for part in name.split("_"))
        assert not _fails("fp32", bm, bn, s)


@pytest.mark.slow
def test_select_cli_needs_only_the_op_yaml(exported: tuple[Path, Path], tmp_path: Path, capsys: Any) -> None:
    """A config dir holding the op alone (no problem/<op>.yaml, no feature set) is enough for
    ``select``: the problem keys are checked against the op's fields."""
    import shutil

    from ckpred.runtime import KernelSelector

    _, model = exported
    shutil.copytree(USER_CONF / "op", tmp_path / "op")
    base = ["select", "--config-dir", str(tmp_path), "op=tmm", f"model_dir={model}", "json=true",
            f"hydra.run.dir={tmp_path / 'hydra'}"]
    problem = ["problem.rows=512", "problem.cols=256", "problem.depth=1024", "problem.precision=fp32"]
    capsys.readouterr()
    assert main([*base, *problem, "top_k=3"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    want = KernelSelector.load(model, cache_size=0).select(rows=512, cols=256, depth=1024, precision="fp32", top_k=3)
    assert [k["name"] for k in got["kernels"]] == list(want.kernels)
    with pytest.raises(SystemExit):  # a key the op does not have is named
        main([*base, *problem, "problem.colz=3"])
    assert "problem.colz" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a field left out is named
        main([*base, *problem[:3]])
    assert "precision" in capsys.readouterr().err


def test_cpp_selector_gives_the_python_answers(exported: tuple[Path, Path], binary: Path) -> None:  # noqa: F811
    from ckpred.runtime import KernelSelector

    _, model = exported
    problems = [(512, 256, 1024, "fp32"), (64, 128, 256, "fp16"), (2048, 512, 1024, "bf16"), (100, 300, 700, "fp32")]
    out = subprocess.run([str(binary), str(model), "--top-k", "5",
                          *[",".join(map(str, p)) for p in problems]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    sel = KernelSelector.load(model, cache_size=0)
    for line, p in zip(out.stdout.splitlines(), problems):
        got = json.loads(line)
        want = sel.select(*p, top_k=5)
        assert [k["id"] for k in got["kernels"]] == list(want.ids)
        assert [k["score"] for k in got["kernels"]] == list(want.scores)
        assert got["out_of_distribution"] == want.out_of_distribution


def test_autotune_takes_the_category_by_its_value(exported: tuple[Path, Path], cpp_demo: Path, tmp_path: Path) -> None:
    """F08: the problem's category goes to the graph as its code, never back to select as a value;
    the store key holds the code, so the C++ header serves what Python stored and the reverse."""
    from ckpred.autotune import Confidence, FixedK
    from ckpred.runtime import KernelSelector

    _, model = exported
    sel = KernelSelector.load(model, cache_size=0)
    store = tmp_path / "s.jsonl"
    problems = [dict(rows=512, cols=256, depth=1024, precision=p) for p in ("fp16", "bf16", "fp32")]
    for problem in problems[:2]:
        ranked = sel.select(problem, top_k=16)
        calls: list[str] = []
        r = sel.autotune(problem, lambda name: calls.append(name) or 1e-3 / len(calls), FixedK(2), store=store)
        assert r.ok and r.stored and calls == list(ranked.kernels[:2]) and r.kernel == calls[1]
        assert r.problem == f"rows=512,cols=256,depth=1024,precision={['fp16', 'bf16', 'fp32'].index(problem['precision'])}"
    sized = sel.autotune(problems[2], lambda name: 1e-3, Confidence(0.9, 0.02))  # the exported calibration
    assert sized.ok and sized.benchmarks >= 1
    times = tmp_path / "t.json"
    times.write_text(json.dumps({k: 2e-3 for p in problems for k in sel.select(p, top_k=16).kernels}))
    done = subprocess.run([str(cpp_demo), str(model), "--store", str(store), "--times", str(times)],
                          input="".join(json.dumps(sel.select(p, top_k=16).to_dict()) + "\n" for p in problems),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert [g["from_store"] for g in got] == [True, True, False]  # Python's two entries, then its own
    again = sel.autotune(problems[2], lambda name: 1.0, FixedK(2), store=store)
    assert again.from_store and again.kernel == got[2]["kernel"]
