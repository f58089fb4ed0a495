"""Wall time and peak memory of a ``ckpred train`` run (default: the README's main command).

    python scripts/bench/bench_train.py [hydra overrides...]

Runs ``python -m ckpred train arch=gfx950 dtype=fp8 <overrides>`` in a subprocess, then prints
the wall time, the child's peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), the machine load
before and after, and the mean / P10 efficiency of every method from the run's metrics.json.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckpred.runs import RUN_RECORD


def main(argv: list[str]) -> int:
    out_dir = Path(tempfile.mkdtemp(prefix="bench_train_"))
    cmd = [sys.executable, "-m", "ckpred", "train", "arch=gfx950", "dtype=fp8", f"out_dir={out_dir}", *argv]
    print("+", " ".join(cmd), flush=True)
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(cmd)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kib = usage.ru_maxrss  # KiB on Linux
    print(f"\nexit code      {proc.returncode}")
    print(f"wall time      {wall:.1f} s")
    print(f"CPU time       {usage.ru_utime + usage.ru_stime:.1f} s (user + sys; load-independent)")
    print(f"peak RSS       {peak_kib / 1024 ** 2:.2f} GiB")
    print(f"cpus           {os.cpu_count()}; load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f} (other processes share the cores)")
    metrics_file = out_dir / "metrics.json"
    if metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        record = json.loads((out_dir / RUN_RECORD).read_text())
        print(f"timings        {record['timings_s']}")
        print(f"{'method':<12} {'mean':>7} {'P10':>7} {'min':>7} {'top1':>7} {'eff@5':>7}")
        for method, rep in metrics.items():
            if isinstance(rep, dict) and "mean" in rep:
                print(f"{method:<12} {100 * rep['mean']:7.2f} {100 * rep['p10']:7.2f} {100 * rep['min']:7.2f} "
                      f"{100 * rep['top1']:7.2f} {100 * rep['efficiency@5']:7.2f}")
    print(f"run dir        {out_dir}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
