"""Ingestion throughput and peak memory on a generated streaming log.

    python scripts/bench/bench_ingest.py [--rows 1000000] [--log /tmp/ckpred_bench_1m.log] [--repeat 1]

Generates (once) a streaming benchmark log of ``--rows`` kernel rows with
:func:`ckpred.data.synthetic.write_synthetic_log`, then ingests it in a fresh child process (so the
generator's memory does not count) with ``ckpred.data.ingest.read_files`` and prints rows/s,
MB/s and the child's peak RSS (``ru_maxrss``), with the RSS after imports for reference.
Wall-clock rows/s depends on what else the machine runs; rows per CPU-second (user + system
time of the ingesting process) is the figure to compare across runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(log: Path) -> dict[str, float]:
    """Ingest ``log`` once in this process and return the figures."""
    import ckpred.data.ingest as ingest
    from ckpred.kernels.gemm_universal import OP

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu_start = time.perf_counter(), time.process_time()
    result = ingest.read_files(log, OP, arch="gfx950", dtype="fp8", layout="rcr")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    s = result.summary
    return {"records": s.records, "valid": s.valid, "rows": s.rows, "rejected": sum(s.rejected.values()),
            "invalid": sum(s.invalid.values()), "seconds": seconds, "rows_per_s": s.records / seconds,
            "cpu_seconds": cpu, "rows_per_cpu_s": s.records / cpu,
            "mb_per_s": log.stat().st_size / 1e6 / seconds, "file_mb": log.stat().st_size / 1e6,
            "rss_after_imports_mb": base_rss,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--log", type=Path, default=Path("/tmp/ckpred_bench_1m.log"))
    parser.add_argument("--repeat", type=int, default=1, help="ingest runs (each in a fresh process)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.log)))
        return
    from ckpred.data.synthetic import write_synthetic_log

    expected_lines = None
    if args.log.exists():
        with open(args.log, "rb") as fh:
            expected_lines = sum(1 for line in fh if line.startswith(b"{"))
    if expected_lines != args.rows:
        start = time.perf_counter()
        write_synthetic_log(args.log, args.rows)
        print(f"generated {args.rows:,} rows -> {args.log} ({args.log.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - start:.1f} s")
    for run in range(args.repeat):
        out = subprocess.run([sys.executable, __file__, "--measure", "--log", str(args.log)],
                             capture_output=True, text=True, check=True)
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"run {run + 1}: {figures['records']:,} records ({figures['valid']:,} valid, "
              f"{figures['invalid']:,} invalid, {figures['rejected']:,} rejected) -> {figures['rows']:,} rows "
              f"in {figures['seconds']:.2f} s = {figures['rows_per_s']:,.0f} rows/s "
              f"({figures['mb_per_s']:.0f} MB/s of {figures['file_mb']:.0f} MB); CPU {figures['cpu_seconds']:.2f} s "
              f"= {figures['rows_per_cpu_s']:,.0f} rows per CPU-second; "
              f"peak RSS {figures['peak_rss_mb']:.0f} MB (after imports {figures['rss_after_imports_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
