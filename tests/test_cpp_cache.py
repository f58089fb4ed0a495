"""C++ selector's per-problem LRU cache: bounded, least-recently-used eviction, same answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cpp import _run, binary, model  # noqa: F401  (fixtures: build the binary, a small export)

# builds and runs the C++ selector: the developer loop (-m "not slow") skips the module
pytestmark = pytest.mark.slow


def _stats(stderr: str) -> dict[str, int]:
    return json.loads(stderr.strip().splitlines()[-1])["cache"]


def test_cache_is_bounded_lru_and_answers_like_no_cache(binary, model) -> None:  # noqa: F811
    a, b, c = "128,1536,7168", "4096,4096,512", "7,7168,2048"
    seq = [a, b, a, c, a, b]  # capacity 2: miss miss hit miss(evicts b) hit miss(b was evicted)
    cached = _run(binary, model, "--top-k", 3, "--cache", 2, "--cache-stats", *seq)
    plain = _run(binary, model, "--top-k", 3, "--cache", 0, "--cache-stats", *seq)
    assert cached.returncode == 0 and plain.returncode == 0, cached.stderr + plain.stderr
    assert cached.stdout == plain.stdout  # a hit returns exactly the answer a model run gives
    assert _stats(cached.stderr) == {"hits": 2, "misses": 4, "size": 2, "capacity": 2}
    assert _stats(plain.stderr) == {"hits": 0, "misses": 6, "size": 0, "capacity": 0}
    # top_k is part of the key: same problem, other top_k is a miss with its own answer
    two = _run(binary, model, "--top-k", 1, "--cache", 8, "--cache-stats", a, a)
    assert _stats(two.stderr)["hits"] == 1 and len(json.loads(two.stdout.splitlines()[0])["kernels"]) == 1


def test_bench_reports_cold_and_cached_latency(binary, model, tmp_path: Path) -> None:  # noqa: F811
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("128,1536,7168\n4096,4096,512\n")
    out = _run(binary, model, "--bench", 3, "--shapes", shapes, "--cache-stats")
    assert out.returncode == 0, out.stderr
    bench = json.loads(out.stdout)["bench"]
    assert bench["runs"] == 2 and bench["hit_runs"] == 4
    assert _stats(out.stderr) == {"hits": 4, "misses": 2, "size": 2, "capacity": 4096}
    assert 0 < bench["hit_median_us"] < bench["median_us"]


def test_negative_cache_size_is_refused(binary, model) -> None:  # noqa: F811
    out = _run(binary, model, "--cache", -1, "128,1536,7168")
    assert out.returncode == 2 and out.stderr == "ckpred_select: --cache '-1': allowed: an integer in [0, 1099511627776]\n"
