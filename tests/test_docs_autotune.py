"""docs/autotune.md's examples run as written: its Python blocks, its C++ block (compiled with
the header, the user's two functions supplied) and its ckpred_select | ckpred_autotune_demo
pipeline, against the export the README's first commands make (a small train run, then
``export run_dir=``), from a working directory laid out as after those commands."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CPP, REPO

DOC = REPO / "docs" / "autotune.md"
MODEL = "exports/gemm_universal_gfx950_fp8_rcr"
SMALL = ["shapes=tiny", "model.n_estimators=8", "model.num_leaves=7", "model.n_jobs=1", "rows.max_per_shape=192",
         "rows.keep_top=32"]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m ckpred train`` then ``python -m ckpred export run_dir=<run>`` (small settings)."""
    from ckpred.commands.export import export_command
    from ckpred.commands.train import train
    from ckpred.config import compose

    root = tmp_path_factory.mktemp("docs_autotune")
    train(compose("train", [*SMALL, "cv.n_splits=3", "progress=false", "plots=false", f"out_dir={root / 'run'}",
                            "baselines.reference.enabled=false"]))
    export_command(compose("export", [*SMALL, f"run_dir={root / 'run'}", "parity.shapes=3", "reranker.n_estimators=10",
                                      "reranker.num_leaves=7", f"out_dir={root / 'exports'}"]))
    manifest = json.loads((root / MODEL / "manifest.json").read_text())
    assert manifest["autotune"] is not None  # export run_dir= fits the calibration the examples use
    (root / "home").mkdir()
    return root


@pytest.mark.slow
def test_the_python_examples_run_as_written(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HOME", str(workdir / "home"))
    timed: list[str] = []
    namespace = {"my_timer": lambda name, problem: timed.append(name) or 1e-3 * (1 + len(timed) % 3),
                 "time_kernel": lambda name, problem: 2e-3}
    code = blocks("python")
    assert len(code) == 2
    for block in code:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - the page's own examples
    result = namespace["result"]
    assert result.ok and result.stored and not result.from_store and timed
    assert [m.kernel for m in result.measured] == timed
    store = workdir / "home" / ".cache" / "ckpred" / "autotune.jsonl"
    lines = [json.loads(line) for line in store.read_text().splitlines()]
    assert {line["problem"] for line in lines} == {"m=128,n=1536,k=7168,split_k=1", "m=4096,n=4096,k=512,split_k=1"}
    assert namespace["dispatcher"].kernel_for(dict(m=4096, n=4096, k=512)) == lines[-1]["kernel"]


CPP_PRELUDE = """#include <cstdint>
#include <string>
#include <vector>
#include "ckpred_autotune.hpp"
// The user's two functions the example calls (defined below the example).
std::vector<ckpred::autotune::Candidate> my_selector_top_k(const std::vector<int64_t>& problem, int k);
double time_kernel(const std::string& name, const std::vector<int64_t>& problem);
"""

CPP_MAIN = """
#include <iostream>
// A selector's answer read from ranked.json (ckpred_select's output); a timer of 1 ms per kernel.
std::vector<ckpred::autotune::Candidate> my_selector_top_k(const std::vector<int64_t>&, int k) {
  json::Value answer = json::parse(ckpred::read_file("ranked.json"));
  std::vector<ckpred::autotune::Candidate> out;
  for (const auto& c : answer["kernels"].arr())
    if (static_cast<int>(out.size()) < k) out.push_back({c["id"].int64(), c["name"].str(), c["score"].num()});
  return out;
}
double time_kernel(const std::string&, const std::vector<int64_t>&) { return 1e-3; }
int main() {
  std::cout << kernel_for({128, 1536, 7168, 1}) << "\\n" << kernel_for({128, 1536, 7168, 1}) << "\\n";
}
"""


@pytest.mark.slow
def test_the_cpp_example_compiles_and_runs_as_written(workdir: Path, tmp_path: Path) -> None:
    import shutil

    from ckpred.runtime import KernelSelector

    if shutil.which("c++") is None:
        pytest.skip("no c++ compiler (apt-get install g++)")
    (example,) = blocks("cpp")
    source = tmp_path / "example.cpp"
    source.write_text(CPP_PRELUDE + example + CPP_MAIN)
    binary = tmp_path / "example"
    built = subprocess.run(["c++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{CPP}", str(source),
                            "-o", str(binary), "-pthread"], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    sel = KernelSelector.load(workdir / MODEL, cache_size=0)
    ranked = sel.select(m=128, n=1536, k=7168, top_k=16)
    (workdir / "ranked.json").write_text(json.dumps(ranked.to_dict()))
    home = tmp_path / "home"
    (home / ".cache" / "ckpred").mkdir(parents=True)
    done = subprocess.run([str(binary)], cwd=workdir, env={"HOME": str(home)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split()
    assert first == second and first in ranked.kernels
    (line,) = [json.loads(x) for x in (home / ".cache" / "ckpred" / "autotune.jsonl").read_text().splitlines()]
    assert line["writer"] == "cpp" and line["kernel"] == first and line["problem"] == "m=128,n=1536,k=7168,split_k=1"


def test_the_cpp_pipeline_runs_as_written(workdir: Path, cpp_build: Path) -> None:
    from ckpred.runtime import KernelSelector

    (pipeline,) = blocks("bash")
    (workdir / "build").mkdir(exist_ok=True)
    if not (workdir / "build" / "cpp").exists():
        (workdir / "build" / "cpp").symlink_to(cpp_build)
    ranked = KernelSelector.load(workdir / MODEL, cache_size=0).select(m=128, n=1536, k=7168, top_k=16)
    (workdir / "times.json").write_text(json.dumps({name: 1e-3 * (i + 1) for i, name in enumerate(ranked.kernels)}))
    done = subprocess.run(["bash", "-c", "set -o pipefail; " + pipeline], cwd=workdir, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    (got,) = [json.loads(x) for x in done.stdout.splitlines()]
    assert got["ok"] and got["stored"] and got["kernel"] == ranked.kernels[0] and got["benchmarks"] >= 1
