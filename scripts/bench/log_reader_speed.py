"""The streaming-log block reader alone: CPU seconds per pass and a hash of what it read, old vs new.

    OMP_NUM_THREADS=1 python scripts/bench/log_reader_speed.py [--rows 1000000] [--dir /tmp/ckpred_ingest_bench]
        [--old-ref main] [--chunk-mb 64] [--repeat 5] [--formats log,jsonl] [--ingest] [--profile]

Reads the inputs of ``ingest_speed.py`` (a streaming log with shape headers and the same rows as
JSON lines, both read by :func:`ckpred.data.readers.stream_log.read_chunks`; generated there when
absent) with :func:`~ckpred.data.readers.stream_log.read_chunks` only, no ingestion after it, in a
fresh child process per pass, alternating the source of ``--old-ref`` (extracted with
``git archive``) and the working tree. Each pass prints its CPU seconds (user + system, and
system alone: file reads and page faults), rows per CPU-second, and a SHA-256 of every row
column, row reason, reject and kernel code it read: the two sources must give the same hash.
Printed per input and source: median, min and max over ``--repeat`` passes, and the ratio of the
medians. Both keep freed memory for reuse, as the ingest command does. The machine is shared:
compare CPU seconds, not wall time.

``--ingest`` times the whole :func:`~ckpred.data.ingest.ingest_to_parquet` (what ``ckpred ingest``
runs) instead of the reader, the same way: its hash is of the reconciliation summary, the
rejects file and the written table (rows sorted).

``--profile`` instead runs one pass of the working tree under :mod:`cProfile` (top functions by
own time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What the working tree is compared with by default.
OLD_REF = "main"


def one_pass(path: Path, chunk_mb: int) -> dict[str, float | str]:
    """Read ``path`` once with ``read_chunks`` in this process: CPU seconds and the output's hash."""
    import numpy as np

    import ckpred.features.base  # noqa: F401  (the kernel rules need it: imported before the clock)
    from ckpred.data.readers import stream_log
    from ckpred.data.readers.common import KernelResolver, ReadContext
    from ckpred.kernels.gemm_universal import OP
    from ckpred.util import keep_freed_memory

    keep_freed_memory()  # as the ingest command does

    ctx = ReadContext(OP, KernelResolver(OP, dtype="fp8", layout="rcr"), "fp8", "rcr", "gfx950", path.name)
    digest = hashlib.sha256()
    rows = rejects = 0
    spent = [0.0, 0.0]
    reads = stream_log.read_chunks(path, ctx, chunk_mb << 20)
    while True:
        before = os.times()
        got = next(reads, None)
        after = os.times()
        spent[0] += after.user - before.user
        spent[1] += after.system - before.system
        if got is None:
            break
        buf = got.rows
        for column in (buf.line, buf.kernel, *buf.problem):
            digest.update(np.asarray(column, dtype=np.int64).tobytes())
        for column in (buf.tflops, buf.latency, buf.bandwidth):
            digest.update(np.asarray(column, dtype=np.float64).tobytes())
        digest.update(repr(sorted(buf.reasons.items())).encode())
        digest.update(repr([(r.source, r.reason, r.raw) for r in got.rejects]).encode())
        rows += len(buf)
        rejects += len(got.rejects)
    digest.update(repr(ctx.resolver.canonical_names).encode())
    cpu = spent[0] + spent[1]
    return {"rows": rows, "rejects": rejects, "cpu": cpu, "system": spent[1], "rows_per_cpu_s": rows / cpu,
            "hash": digest.hexdigest()[:16], "module": stream_log.__file__}


def one_ingest(path: Path, chunk_mb: int) -> dict[str, float | str]:
    """Ingest ``path`` once with ``ingest_to_parquet`` in this process: CPU seconds and the output's hash."""
    import shutil
    import tempfile

    import pandas as pd
    import pyarrow.parquet as pq

    import ckpred.data.ingest as ingest
    import ckpred.features.base  # noqa: F401  (the kernel rules need it: imported before the clock)
    from ckpred.kernels.gemm_universal import OP
    from ckpred.util import keep_freed_memory

    keep_freed_memory()  # as the ingest command does
    out = Path(tempfile.mkdtemp(prefix="ckpred_logrd_", dir=path.parent))
    try:
        before = os.times()
        summary = ingest.ingest_to_parquet(path, OP, out / "table", out / "rejects.csv", arch="gfx950", dtype="fp8",
                                           layout="rcr", chunk_bytes=chunk_mb << 20)
        after = os.times()
        digest = hashlib.sha256(json.dumps(summary.as_dict() | {"files": []}, sort_keys=True).encode())
        digest.update((out / "rejects.csv").read_bytes())
        if summary.valid_rows:
            table = pq.read_table(out / "table").to_pandas()
            table = table.sort_values(list(table.columns)).reset_index(drop=True)
            digest.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    cpu = after.user - before.user + after.system - before.system
    return {"rows": summary.records, "rejects": sum(summary.rejected.values()), "cpu": cpu,
            "system": after.system - before.system, "rows_per_cpu_s": summary.records / cpu,
            "hash": digest.hexdigest()[:16], "module": ingest.__file__}


def child(path: Path, chunk_mb: int, src: Path, whole: bool) -> dict[str, float | str]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(src))
    run = subprocess.run([sys.executable, __file__, "--measure", "--input", str(path), "--chunk-mb", str(chunk_mb),
                          *(["--ingest"] if whole else [])],
                         capture_output=True, text=True, env=env, cwd=str(src))
    if run.returncode != 0:
        raise SystemExit(f"reading {path} with {src} failed:\n{run.stderr[-3000:]}")
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if not str(got["module"]).startswith(str(src)):
        raise SystemExit(f"the child read {got['module']}, not the source under {src}")
    return got


def profile(path: Path, chunk_mb: int) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    got = one_pass(path, chunk_mb)
    prof.disable()
    print(json.dumps(got))
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpred_ingest_bench"))
    parser.add_argument("--old-ref", default=OLD_REF)
    parser.add_argument("--chunk-mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--formats", default="log,jsonl")
    parser.add_argument("--ingest", action="store_true", help="time the whole ingest_to_parquet, not the reader")
    parser.add_argument("--profile", action="store_true", help="instead: one pass of the working tree under cProfile")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps((one_ingest if args.ingest else one_pass)(Path(args.input), args.chunk_mb)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from ingest_speed import inputs, old_source

    args.dir.mkdir(parents=True, exist_ok=True)
    files = inputs(args.rows, args.dir)
    if args.profile:
        for name in args.formats.split(","):
            profile(files[name], args.chunk_mb)
        return
    sources = {"old": old_source(args.old_ref, args.dir), "new": REPO}
    print(f"{'ingest_to_parquet' if args.ingest else 'read_chunks'}: "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"old = {args.old_ref} ({sources['old'].name[4:]}), new = working tree; "
          f"data.chunk_mb={args.chunk_mb}; {args.repeat} passes each, alternating; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for name in args.formats.split(","):
        path = files[name]
        runs: dict[str, list[dict[str, float | str]]] = {"old": [], "new": []}
        for _ in range(args.repeat):
            for which, src in sources.items():
                runs[which].append(child(path, args.chunk_mb, src, args.ingest))
        print(f"{name} ({path.stat().st_size / 1e6:.0f} MB):")
        medians = {}
        for which, got in runs.items():
            cpu = [float(g["cpu"]) for g in got]
            system = [float(g["system"]) for g in got]
            medians[which] = statistics.median(cpu)
            hashes = sorted({str(g["hash"]) for g in got})
            print(f"  {which}: {got[0]['rows']:,} records, {got[0]['rejects']:,} rejects; CPU median "
                  f"{medians[which]:.3f} s (min {min(cpu):.3f}, max {max(cpu):.3f}; system median "
                  f"{statistics.median(system):.3f} s) = {int(got[0]['rows']) / medians[which]:,.0f} rows/CPU-s; "
                  f"hash {' '.join(hashes)}")
        same = {str(g["hash"]) for g in runs["old"]} == {str(g["hash"]) for g in runs["new"]}
        print(f"  new/old CPU x{medians['new'] / medians['old']:.2f}; output {'same' if same else 'DIFFERENT'}",
              flush=True)


if __name__ == "__main__":
    main()
