"""Made-up benchmark output in the streaming-log format, for ingestion benchmarks and tests.

Only the *form* is real: kernel names from the gemm_universal catalogue, the ruled
``Shape <i>: M=.. N=.. K=..`` header before each shape's rows, one JSON object per kernel row
with the ``name``, ``problem`` and ``perf_result`` fields of CK Tile's tile-engine benchmark.
The throughput is a smooth function of shape and tile times a random factor.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from ckpred.kernels.gemm_universal import OP


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
    cat = OP.catalogue("gfx950", "fp8", "rcr")
    names = cat["kernel_name"].tolist()
    tiles = list(zip(cat["tile_m"], cat["tile_n"]))
    rng = random.Random(seed)
    ms = [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 20480]
    ns = [512, 1536, 3072, 4096, 7168, 8192, 14336, 28672]
    ks = [256, 512, 1024, 2048, 4096, 7168]
    written = 0
    shape = 0
    path = Path(path)
    with open(path, "w") as fh:
        while written < n_rows:
            m, n, k = rng.choice(ms), rng.choice(ns), rng.choice(ks)
            flops = 2.0 * m * n * k
            fh.write(f"{'=' * 80}\nShape {shape}: M={m} N={n} K={k} dtype=fp8 layout=rcr\n{'=' * 80}\n")
            shape += 1
            chunk = []
            for name, (tm, tn) in zip(names, tiles):
                if written >= n_rows:
                    break
                tflops = 1.0 + 2000.0 * min(1.0, m / tm) * min(1.0, n / tn) * (1 - math.exp(-flops / 2e11)) \
                    * rng.uniform(0.5, 1.0)
                latency = flops / (tflops * 1e9)
                bandwidth = (m * k + k * n + 2 * m * n) / (latency * 1e6)
                chunk.append(
                    f'{{"name": "{name}", "problem": {{"split_k": 1, "m": {m}, "n": {n}, "k": {k}, '
                    f'"stride_a": {k}, "stride_b": {k}, "stride_c": {n}, "dtype_a": "fp8", "dtype_b": "fp8", '
                    f'"dtype_acc": "fp32", "dtype_c": "fp16", "layout_a": "RowMajor", "layout_b": "ColumnMajor", '
                    f'"layout_c": "RowMajor", "structured_sparsity": false}}, "perf_result": '
                    f'{{"latency(ms)": {latency:.2f}, "tflops(TFlops)": {tflops:.2f}, '
                    f'"bandwidth(GB/s)": {bandwidth:.2f}}}}}\n')
                written += 1
            fh.write("".join(chunk))
    return path
