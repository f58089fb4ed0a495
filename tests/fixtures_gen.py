"""Synthetic benchmark outputs in every format ckpred ingests, for tests and benchmarks.

The measurements are made up (a smooth function of shape and tile plus a per-kernel factor),
only their *form* is real: kernel names from the gemm_universal catalogue, the file layouts of
CK Tile's benchmark JSON, streaming log and CSV sweeps, TFLOPS consistent with latency and
FLOPs (to full precision in CSV and JSON, to the 2 printed decimals in the streaming log).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ckpred.kernels.gemm_universal import OP

SHAPES: tuple[tuple[int, int, int], ...] = ((16, 1536, 7168), (256, 4096, 2048), (1024, 1024, 1024),
                                            (1, 8192, 256))


@dataclass(frozen=True)
class Measurement:
    """One (problem, kernel) measurement."""

    m: int
    n: int
    k: int
    kernel: str
    tflops: float
    latency_ms: float

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.m, self.n, self.k, self.kernel)


def kernel_names(count: int, *, arch: str = "gfx950", dtype: str = "fp8", layout: str = "rcr",
                 form: str = "tile_engine") -> list[str]:
    """``count`` real catalogue kernel names spread over the catalogue, in the given name form."""
    cat = OP.catalogue(arch, dtype, layout)
    step = max(1, len(cat) // count)
    rows = cat.iloc[::step].head(count)
    return [OP.format_name(r, dtype=dtype, layout=layout, form=form) for r in rows.to_dict("records")]


def measurements(shapes: Sequence[tuple[int, int, int]], kernels: Sequence[str], *, seed: int = 0,
                 decimals: int | None = None) -> list[Measurement]:
    """Made-up but self-consistent measurements of every kernel on every shape.

    With ``decimals``, latency and TFLOPS are rounded like the streaming log prints them.
    """
    rng = random.Random(seed)
    out = []
    for m, n, k in shapes:
        flops = 2.0 * m * n * k
        for name in kernels:
            fields = OP.parse_name(name)
            fill = min(1.0, m / fields["tile_m"]) * min(1.0, n / fields["tile_n"])
            tflops = 50.0 + 1500.0 * fill * (1 - math.exp(-flops / 2e11)) * rng.uniform(0.6, 1.0)
            latency = flops / (tflops * 1e9)
            if decimals is not None:
                latency, tflops = round(latency, decimals), round(tflops, decimals)
            out.append(Measurement(m, n, k, name, tflops, latency))
    return out


# -- writers -----------------------------------------------------------------------------------
def csv_lines(rows: Iterable[Measurement]) -> list[str]:
    """CK CSV sweep lines (header first)."""
    lines = ["kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero"]
    index: dict[tuple[int, int, int], int] = {}
    for r in rows:
        idx = index.setdefault((r.m, r.n, r.k), len(index))
        lines.append(f"{r.kernel},{idx},{r.m},{r.n},{r.k},{r.latency_ms!r},{r.tflops!r},{r.m * r.n}")
    return lines


def write_csv(path: Path, rows: Iterable[Measurement]) -> Path:
    path.write_text("\n".join(csv_lines(rows)) + "\n")
    return path


def log_row(r: Measurement, *, dtype: str = "fp8", layout: str = "rcr") -> str:
    """One streaming-log JSON line, every field of the real format."""
    problem = {"split_k": 1, "m": r.m, "n": r.n, "k": r.k, "stride_a": r.k, "stride_b": r.k, "stride_c": r.n,
               "dtype_a": dtype, "dtype_b": dtype, "dtype_acc": "fp32", "dtype_c": "fp16",
               "layout_a": "RowMajor", "layout_b": "ColumnMajor", "layout_c": "RowMajor",
               "structured_sparsity": False}
    bandwidth = (r.m * r.k + r.k * r.n + 2 * r.m * r.n) / (r.latency_ms * 1e6) if r.latency_ms else 0.0
    perf = {"latency(ms)": round(r.latency_ms, 2), "tflops(TFlops)": round(r.tflops, 2),
            "bandwidth(GB/s)": round(bandwidth, 2)}
    return json.dumps({"name": r.kernel, "problem": problem, "perf_result": perf})


def log_lines(rows: Sequence[Measurement], *, dtype: str = "fp8", layout: str = "rcr") -> list[str]:
    """Streaming-log lines: a ruled shape header before each shape's rows."""
    lines: list[str] = []
    current = None
    count = 0
    for r in rows:
        if (r.m, r.n, r.k) != current:
            current = (r.m, r.n, r.k)
            lines += ["=" * 80, f"Shape {count}: M={r.m} N={r.n} K={r.k} dtype={dtype} layout={layout}", "=" * 80]
            count += 1
        lines.append(log_row(r, dtype=dtype, layout=layout))
    return lines


def write_log(path: Path, rows: Sequence[Measurement], **kw: str) -> Path:
    path.write_text("\n".join(log_lines(rows, **kw)) + "\n")
    return path


def benchmark_json(rows: Sequence[Measurement], *, failed: Sequence[tuple[int, int, int, str]] = (),
                   dtype: str = "fp8", layout: str = "rcr") -> dict:
    """The tile-engine benchmark JSON document; ``failed`` lists (m, n, k, kernel) that failed."""
    shapes = list(dict.fromkeys((r.m, r.n, r.k) for r in rows))
    by_kernel: dict[str, list[dict]] = {}
    for r in rows:
        by_kernel.setdefault(r.kernel, []).append(
            {"kernel_name": r.kernel, "m": r.m, "n": r.n, "k": r.k, "avg_time_ms": r.latency_ms,
             "tflops": r.tflops, "is_valid": True, "error": ""})
    for m, n, k, name in failed:
        by_kernel.setdefault(name, []).append(
            {"kernel_name": name, "m": m, "n": n, "k": k, "avg_time_ms": 0.0, "tflops": 0.0,
             "is_valid": False, "error": "kernel does not support this problem (IsSupportedArgument false)"})
    results = []
    for name, benches in by_kernel.items():
        fields = OP.parse_name(name)
        config = {"name": name, "dtype": dtype, "layout": layout,
                  **{f: fields[f] for f in OP.kernel_names}}
        results.append({"kernel_config": config, "benchmarks": benches})
    return {"metadata": {"dtype": dtype, "layout": layout, "num_kernels": len(by_kernel),
                         "num_problems": len(shapes), "warmup": 5, "repeat": 20,
                         "timestamp": "2026-01-01T00:00:00"},
            "problem_sizes": [{"m": m, "n": n, "k": k} for m, n, k in shapes],
            "results": results}


def write_json(path: Path, rows: Sequence[Measurement], **kw) -> Path:  # type: ignore[no-untyped-def]
    path.write_text(json.dumps(benchmark_json(rows, **kw), indent=2))
    return path
