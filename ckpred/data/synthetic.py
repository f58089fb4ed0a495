"""Made-up benchmark output in the CK formats, for ingestion benchmarks and tests.

Only the *form* is real: kernel names from the gemm_universal catalogue; the streaming log's
ruled ``Shape <i>: M=.. N=.. K=..`` header before each shape's rows and one JSON object per
kernel row with the ``name``, ``problem`` and ``perf_result`` fields of CK Tile's tile-engine
benchmark; the CSV sweep's ``kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero`` columns;
the JSON lines of the same rows. The throughput is a smooth function of shape and tile times a
random factor.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Iterator

from ckpred.kernels.gemm_universal import OP

#: A made-up row: (shape index, m, n, k, kernel name, latency ms, TFLOPS, bandwidth GB/s).
Row = tuple[int, int, int, int, str, float, float, float]


def synthetic_shapes(n_rows: int, *, seed: int = 0) -> Iterator[list[Row]]:
    """The rows of :func:`write_synthetic_log`, one list per shape (every catalogue kernel)."""
    cat = OP.catalogue("gfx950", "fp8", "rcr")
    names = cat["kernel_name"].tolist()
    tiles = list(zip(cat["tile_m"], cat["tile_n"]))
    rng = random.Random(seed)
    ms = [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 20480]
    ns = [512, 1536, 3072, 4096, 7168, 8192, 14336, 28672]
    ks = [256, 512, 1024, 2048, 4096, 7168]
    written = 0
    shape = 0
    while written < n_rows:
        m, n, k = rng.choice(ms), rng.choice(ns), rng.choice(ks)
        flops = 2.0 * m * n * k
        rows: list[Row] = []
        for name, (tm, tn) in zip(names, tiles):
            if written >= n_rows:
                break
            tflops = 1.0 + 2000.0 * min(1.0, m / tm) * min(1.0, n / tn) * (1 - math.exp(-flops / 2e11)) \
                * rng.uniform(0.5, 1.0)
            latency = flops / (tflops * 1e9)
            bandwidth = (m * k + k * n + 2 * m * n) / (latency * 1e6)
            rows.append((shape, m, n, k, name, latency, tflops, bandwidth))
            written += 1
        yield rows
        shape += 1


def write_synthetic_log(path: str | Path, n_rows: int, *, seed: int = 0) -> Path:
    """Write a streaming benchmark log of ``n_rows`` made-up gemm_universal fp8 rows on gfx950.

    Every kernel of the gfx950 fp8 rcr catalogue is listed per shape, for as many random shapes
    as needed; latency, TFLOPS and bandwidth agree to the two printed decimals, so the reader
    takes every row as valid. Written shape by shape so memory stays flat for millions of rows.

    Parameters
    ----------
    path
        The log to write (overwritten).
    n_rows
        Kernel rows to write in all (the last shape may be cut short).
    seed
        Seed of the shape choice and the made-up throughput.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    with open(path, "w") as fh:
        for rows in synthetic_shapes(n_rows, seed=seed):
            shape, m, n, k = rows[0][:4]
            fh.write(f"{'=' * 80}\nShape {shape}: M={m} N={n} K={k} dtype=fp8 layout=rcr\n{'=' * 80}\n")
            fh.write("".join(
                f'{{"name": "{name}", "problem": {{"split_k": 1, "m": {m}, "n": {n}, "k": {k}, '
                f'"stride_a": {k}, "stride_b": {k}, "stride_c": {n}, "dtype_a": "fp8", "dtype_b": "fp8", '
                f'"dtype_acc": "fp32", "dtype_c": "fp16", "layout_a": "RowMajor", "layout_b": "ColumnMajor", '
                f'"layout_c": "RowMajor", "structured_sparsity": false}}, "perf_result": '
                f'{{"latency(ms)": {latency:.2f}, "tflops(TFlops)": {tflops:.2f}, '
                f'"bandwidth(GB/s)": {bandwidth:.2f}}}}}\n'
                for _, m, n, k, name, latency, tflops, bandwidth in rows))
    return path


def write_synthetic_csv(path: str | Path, n_rows: int, *, seed: int = 0) -> Path:
    """Write the rows of :func:`write_synthetic_log` as a CK CSV sweep (full-precision values)."""
    path = Path(path)
    with open(path, "w") as fh:
        fh.write("kernel,problem_idx,M,N,K,latency_ms,tflops,non_zero\n")
        for rows in synthetic_shapes(n_rows, seed=seed):
            fh.write("".join(f"{name},{shape},{m},{n},{k},{latency!r},{tflops!r},{m * n}\n"
                             for shape, m, n, k, name, latency, tflops, _ in rows))
    return path


def write_synthetic_jsonl(path: str | Path, n_rows: int, *, seed: int = 0) -> Path:
    """Write the rows of :func:`write_synthetic_log` as the log's JSON rows alone (no shape headers),
    one object per line: the form of a JSON-lines benchmark dump."""
    path = Path(path)
    with open(path, "w") as fh:
        for rows in synthetic_shapes(n_rows, seed=seed):
            fh.write("".join(
                f'{{"name": "{name}", "problem": {{"split_k": 1, "m": {m}, "n": {n}, "k": {k}}}, '
                f'"perf_result": {{"latency(ms)": {latency!r}, "tflops(TFlops)": {tflops!r}, '
                f'"bandwidth(GB/s)": {bandwidth!r}}}}}\n'
                for _, m, n, k, name, latency, tflops, bandwidth in rows))
    return path
