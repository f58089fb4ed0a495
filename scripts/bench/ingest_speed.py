"""Streaming ingestion against the previous path: rows per CPU-second, wall time and peak memory.

    OMP_NUM_THREADS=1 python scripts/bench/ingest_speed.py [--rows 1000000] [--dir /tmp/ckpred_ingest_bench]
        [--old-ref acf5646] [--chunk-mb 64] [--small-chunk-mb 16] [--formats csv,log,jsonl] [--repeat 3] [--stages]

Generates (once per row count) three inputs of ``--rows`` made-up gemm_universal rows with
:mod:`ckpred.data.synthetic`: a CK CSV sweep, a streaming benchmark log (shape headers + one
JSON object per row) and the same rows as JSON lines. Each is ingested in a fresh child
process (the generator's memory does not count, imports are done before the clock starts):

* **old**: the ingestion of ``--old-ref`` (the commit before streaming ingestion; its source is
  extracted with ``git archive`` into the work dir): ``read_files`` into memory, then the table
  and the rejects written as the ``ingest`` command did;
* **new**: :func:`ckpred.data.ingest.ingest_to_parquet` (what ``ckpred ingest`` runs) with
  ``data.chunk_mb=--chunk-mb``, into a directory of Parquet parts and the rejects CSV.

Printed per input and path: records, CPU seconds (user + system of the child), rows per
CPU-second, wall seconds, peak RSS (``VmHWM``) and peak RSS after imports, and the ratio
new/old. Then the new path's peak RSS on the log at ``--small-chunk-mb`` and ``--chunk-mb``,
on the whole log and on its first half, to show that memory follows the chunk, not the file.
The machine is shared: CPU-seconds are the figure to compare; wall time depends on the load.
The new path runs ``--repeat`` times per input: its median run is compared, and every run's
rows per CPU-second are printed with the range of their system CPU (page faults make most of
the run-to-run spread).

``--stages`` instead times each step of the new path (read and check a block, partition and
spill, rule check, merge, Parquet write...) in CPU seconds, one process per input: what limits
the throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The last commit of main before streaming ingestion.
OLD_REF = "acf5646"


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Ingest ``args.input`` once in this process (old or new path) and return the figures."""
    import ckpred.data.ingest as ingest
    import ckpred.features.base  # noqa: F401  (the kernel rules need it: imported before the clock)
    from ckpred.kernels.gemm_universal import OP

    base_rss = peak_rss_mb()
    out = Path(args.out)
    start, cpu_start = time.perf_counter(), time.process_time()
    system_start = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    if args.mode == "old":
        from ckpred.data.table import write_table

        result = ingest.read_files(args.input, OP, arch="gfx950", dtype="fp8", layout="rcr")
        result.rejects.to_csv(out.with_suffix(".rejects.csv"), index=False)
        write_table(result.table, out.with_suffix(".parquet"), OP)
        summary = result.summary
    else:
        from ckpred.util import keep_freed_memory

        keep_freed_memory()  # as the ingest command does
        summary = ingest.ingest_to_parquet(args.input, OP, out, out.with_suffix(".rejects.csv"), arch="gfx950",
                                           dtype="fp8", layout="rcr", chunk_bytes=args.chunk_mb << 20)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - system_start
    return {"records": summary.records, "rows": summary.rows, "valid_rows": summary.valid_rows,
            "rejected": sum(summary.rejected.values()), "invalid": sum(summary.invalid.values()),
            "summary": json.dumps(summary.as_dict() | {"files": []}, sort_keys=True),
            "seconds": seconds, "cpu_seconds": cpu, "system_cpu_s": system, "rows_per_cpu_s": summary.records / cpu,
            "rss_after_imports_mb": base_rss, "peak_rss_mb": peak_rss_mb()}


#: Steps timed by ``--stages`` (module, function, label), in pipeline order.
STAGES = (("ckpred.data.readers.csv_sweep", "_read_block", "read+check block (CSV, pyarrow)"),
          ("ckpred.data.readers.stream_log", "_read_block", "read+check block (log, msgspec)"),
          ("ckpred.data.ingestion.read", "buffer_rows", "block -> arrow rows"),
          ("ckpred.data.ingestion.check", "validate", "value checks"),
          ("ckpred.data.ingestion.merge.Partitions", "add", "hash-partition + spill"),
          ("ckpred.data.ingestion.merge", "joined_chunks", "spill read back"),
          ("ckpred.data.ingestion.check", "check_rules", "op rule check"),
          ("ckpred.data.ingestion.merge", "merge", "merge repeats"),
          ("ckpred.data.ingestion.write", "canonical_part", "canonical part (text columns...)"),
          ("ckpred.data.ingestion.write.TableWriter", "write", "Parquet write"))


def stages(path: Path, chunk_mb: int) -> None:
    """CPU seconds of each step of the new path on ``path`` (this process; functions wrapped)."""
    import functools
    import importlib
    import shutil
    import tempfile

    import ckpred.data.ingest as ingest
    import ckpred.features.base  # noqa: F401
    from ckpred.kernels.gemm_universal import OP

    spent: dict[str, float] = {}
    for module, name, label in STAGES:
        owner: object
        if module.endswith((".Partitions", ".TableWriter")):
            owner = getattr(importlib.import_module(module.rsplit(".", 1)[0]), module.rsplit(".", 1)[1])
        else:
            owner = importlib.import_module(module)
        inner = getattr(owner, name)

        def timed(*a: object, _inner: object = inner, _label: str = label, **k: object) -> object:
            start = time.process_time()
            try:
                return _inner(*a, **k)  # type: ignore[operator]
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - start

        setattr(owner, name, functools.wraps(inner)(timed))
    from ckpred.util import keep_freed_memory

    keep_freed_memory()  # as the ingest command does
    out = Path(tempfile.mkdtemp(prefix="ckpred_stages_"))
    try:
        start = time.process_time()
        summary = ingest.ingest_to_parquet(path, OP, out / "table", out / "rejects.csv", arch="gfx950", dtype="fp8",
                                           layout="rcr", chunk_bytes=chunk_mb << 20)
        total = time.process_time() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"{path.name}: {summary.records:,} records in {total:.2f} CPU-s = {summary.records / total:,.0f} rows/CPU-s")
    for _, _, label in STAGES:
        if label in spent:
            print(f"  {label:34s} {spent[label]:6.2f} s  {spent[label] / total:5.1%}")
    rest = total - sum(spent.values())
    print(f"  {'rest (file reads, summary, rejects)':34s} {rest:6.2f} s  {rest / total:5.1%}")


def inputs(rows: int, work: Path) -> dict[str, Path]:
    """The three generated inputs of ``rows`` rows (written once, kept in ``work``)."""
    from ckpred.data.synthetic import write_synthetic_csv, write_synthetic_jsonl, write_synthetic_log

    paths = {"csv": (work / f"sweep_{rows}.csv", write_synthetic_csv),
             "log": (work / f"stream_{rows}.log", write_synthetic_log),
             "jsonl": (work / f"rows_{rows}.jsonl", write_synthetic_jsonl)}
    for name, (path, write) in paths.items():
        if not path.exists():
            start = time.perf_counter()
            write(path.with_suffix(".tmp"), rows)
            path.with_suffix(".tmp").replace(path)
            print(f"generated {name}: {rows:,} rows -> {path} ({path.stat().st_size / 1e6:.0f} MB) "
                  f"in {time.perf_counter() - start:.1f} s", flush=True)
    return {name: path for name, (path, _) in paths.items()}


def half_of(path: Path) -> Path:
    """The first half of ``path``'s bytes, cut at a line end (the file-size side of the memory check)."""
    half = path.with_name(f"half_{path.name}")
    if not half.exists():
        with open(path, "rb") as src, open(half, "wb") as dst:
            left = path.stat().st_size // 2
            while left > 0:
                block = src.read(min(left, 1 << 24))
                dst.write(block)
                left -= len(block)
            dst.write(src.readline())
    return half


def peak_rss_mb() -> float:
    """This process's peak resident memory (``VmHWM``: unlike ``ru_maxrss`` not inherited over exec)."""
    with open("/proc/self/status") as fh:
        for text in fh:
            if text.startswith("VmHWM:"):
                return int(text.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def old_source(ref: str, work: Path) -> Path:
    """The package source of ``ref`` (``git archive`` of the commit it names now, so a branch
    name is read afresh when it moves), for an old path's child process."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    dest = work / f"src_{commit}"
    if not (dest / "ckpred").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "ckpred", "conf"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        if (dest / "conf").exists() and not (dest / "ckpred" / "conf").exists():
            (dest / "ckpred" / "conf").symlink_to(dest / "conf")
    return dest


def child(mode: str, path: Path, work: Path, chunk_mb: int, old_src: Path | None) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if old_src is not None:
        env["PYTHONPATH"] = str(old_src)
    out = work / f"out_{mode}_{path.stem}_{chunk_mb}"
    run = subprocess.run([sys.executable, __file__, "--measure", "--mode", mode, "--input", str(path),
                          "--out", str(out), "--chunk-mb", str(chunk_mb)],
                         capture_output=True, text=True, env=env, cwd=str(work))
    if run.returncode != 0:
        raise SystemExit(f"{mode} ingest of {path} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def line(name: str, mode: str, f: dict[str, float]) -> str:
    return (f"  {name:5s} {mode:3s}: {f['records']:>9,} records -> {f['rows']:>9,} rows; "
            f"CPU {f['cpu_seconds']:6.2f} s = {f['rows_per_cpu_s']:>9,.0f} rows/CPU-s; wall {f['seconds']:6.2f} s; "
            f"peak RSS {f['peak_rss_mb']:5.0f} MB (after imports {f['rss_after_imports_mb']:.0f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpred_ingest_bench"))
    parser.add_argument("--old-ref", default=OLD_REF)
    parser.add_argument("--chunk-mb", type=int, default=64)
    parser.add_argument("--small-chunk-mb", type=int, default=16)
    parser.add_argument("--formats", default="csv,log,jsonl")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the new path per input (the median is compared; all are printed)")
    parser.add_argument("--stages", action="store_true",
                        help="instead: CPU seconds of each step of the new path, per input (one process each)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="new", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    files = inputs(args.rows, args.dir)
    if args.stages:
        for name in args.formats.split(","):
            if args.input:  # the child of one input
                break
            subprocess.run([sys.executable, __file__, "--stages", "--input", str(files[name]), "--rows",
                            str(args.rows), "--dir", str(args.dir), "--chunk-mb", str(args.chunk_mb)], check=True)
        else:
            return
        stages(Path(args.input), args.chunk_mb)
        return
    old_src = old_source(args.old_ref, args.dir)
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; old = {args.old_ref} (in memory), "
          f"new = ingest_to_parquet, data.chunk_mb={args.chunk_mb}; load average {os.getloadavg()[0]:.1f}")
    for name in args.formats.split(","):
        old = child("old", files[name], args.dir, args.chunk_mb, old_src)
        runs = [child("new", files[name], args.dir, args.chunk_mb, None) for _ in range(args.repeat)]
        new = sorted(runs, key=lambda f: f["cpu_seconds"])[len(runs) // 2]  # the median run
        print(f"{name} ({files[name].stat().st_size / 1e6:.0f} MB):")
        print(line(name, "old", old))
        print(line(name, "new", new) + (f" (median of {len(runs)} runs)" if len(runs) > 1 else ""))
        if len(runs) > 1:
            rates = sorted(f["rows_per_cpu_s"] for f in runs)
            print(f"  new, all {len(runs)} runs: {', '.join(f'{r:,.0f}' for r in rates)} rows/CPU-s "
                  f"(user + system CPU, the system part {min(f['system_cpu_s'] for f in runs):.2f}-"
                  f"{max(f['system_cpu_s'] for f in runs):.2f} s)")
        if len({f["summary"] for f in runs}) != 1:
            raise SystemExit(f"{name}: repeated runs of the new path gave different summaries")
        same = "same" if old["summary"] == new["summary"] else "DIFFERENT"
        print(f"  ratio new/old: rows per CPU-second x{new['rows_per_cpu_s'] / old['rows_per_cpu_s']:.2f}, "
              f"wall x{old['seconds'] / new['seconds']:.2f} faster, peak RSS x{new['peak_rss_mb'] / old['peak_rss_mb']:.2f}; "
              f"reconciliation summary {same}", flush=True)
    print("peak RSS of the new path on the log, by chunk size and file size:")
    for path in (files["log"], half_of(files["log"])):
        for chunk in (args.small_chunk_mb, args.chunk_mb):
            f = child("new", path, args.dir, chunk, None)
            print(f"  {path.name} ({path.stat().st_size / 1e6:.0f} MB, {f['records']:,} records), "
                  f"data.chunk_mb={chunk}: peak RSS {f['peak_rss_mb']:.0f} MB (after imports "
                  f"{f['rss_after_imports_mb']:.0f} MB), CPU {f['cpu_seconds']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
