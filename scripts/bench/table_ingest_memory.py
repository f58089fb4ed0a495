"""Peak memory and CPU of ``ckpred ingest`` on tables of a declared op (the user op of
``tests/fixtures/user_op``), by table size and ``data.chunk_mb``, against an older commit.

    OMP_NUM_THREADS=1 python scripts/bench/table_ingest_memory.py [--sizes 15,30,60] [--chunks 1,16,64]
        [--old-ref 74e02af] [--dir /tmp/ckpred_table_bench] [--gzip]

Generates (once) CSV tables of about ``--sizes`` MB in the op's source columns
(``M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms``, every (problem, kernel) distinct), then runs
``python -m ckpred ingest`` on each in a fresh process per chunk size, for the working tree and
for ``--old-ref`` (its source extracted with ``git archive``). Printed per run: peak RSS
(``ru_maxrss`` of the child, which includes the command's own imports, about 230 MB here), user
+ system CPU seconds, rows per CPU-second, and whether the table equals the working tree's at
the smallest chunk (rows sorted, ``source`` and ``run_id`` aside). ``--gzip`` also runs each
table gzipped. The machine is shared: CPU seconds, not wall time, are the figure to compare.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
USER_OP = REPO / "tests" / "fixtures" / "user_op"
KERNELS = [(bm, bn, w, s) for bm in (32, 64, 128) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]


def table(path: Path, megabytes: int) -> Path:
    """A table of about ``megabytes`` MB (written once)."""
    import random

    if path.exists():
        return path
    rng = random.Random(0)
    with open(path.with_suffix(".tmp"), "w") as fh:
        fh.write("M,N,K,dtype,BLOCK_M,BLOCK_N,warps,stages,ms\n")
        size, i = 0, 0
        while size < megabytes * 1e6:
            m, n, k = 64 + i, 128 << (i % 4), 256 << (i % 3)
            for dtype in ("fp16", "bf16", "fp32"):
                lines = "".join(f"{m},{n},{k},{dtype},{bm},{bn},{w},{s},{rng.uniform(0.001, 1):.6f}\n"
                                for bm, bn, w, s in KERNELS)
                fh.write(lines)
                size += len(lines)
            i += 1
    path.with_suffix(".tmp").replace(path)
    return path


def ingest(src: Path | None, data: Path, out: Path, chunk_mb: int) -> tuple[float, float, int]:
    """(peak RSS MB, CPU seconds, exit status) of one ``ckpred ingest`` in a child process."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if src is not None:
        env["PYTHONPATH"] = str(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, "-c", _PROBE, "ingest", "--config-dir", str(USER_OP), "op=tmm",
                          f"data.path={data}", f"out={out}", f"data.chunk_mb={chunk_mb}",
                          f"hydra.run.dir={out.parent / 'hydra'}"], env=env, capture_output=True, text=True,
                         cwd=out.parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if run.returncode:
        print(run.stderr[-2000:], file=sys.stderr)
    peak = float(run.stdout.split()[-1]) if run.stdout.split() else float("nan")
    return peak, cpu, run.returncode


#: ``python -m ckpred`` that prints its own peak resident memory (MB, ``VmHWM``) last.
_PROBE = ("import sys\nfrom ckpred.cli import main\nrc = main(sys.argv[1:])\n"
          "print([int(t.split()[1]) / 1024 for t in open('/proc/self/status') if t.startswith('VmHWM:')][0])\n"
          "sys.exit(rc)")


def same(a: Path, b: Path) -> bool:
    import pandas as pd

    keys = ["rows", "cols", "depth", "precision", "kernel_name"]
    frames = [pd.read_parquet(p).drop(columns=["source", "run_id"]).sort_values(keys).reset_index(drop=True)
              for p in (a, b)]
    return frames[0].equals(frames[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="15,30,60")
    parser.add_argument("--chunks", default="1,16,64")
    parser.add_argument("--old-ref", default="74e02af")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpred_table_bench"))
    parser.add_argument("--gzip", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from ingest_speed import old_source

    args.dir.mkdir(parents=True, exist_ok=True)
    sources = {"new": None, "old": old_source(args.old_ref, args.dir) if args.old_ref else None}
    if not args.old_ref:
        del sources["old"]
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; load average {os.getloadavg()[0]:.1f}; "
          f"old = {args.old_ref}", flush=True)
    print("| table | path | data.chunk_mb | peak RSS MB | CPU s | rows / CPU-s | same table |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for mb in (int(s) for s in args.sizes.split(",")):
        path = table(args.dir / f"tmm_{mb}mb.csv", mb)
        rows = sum(1 for _ in open(path)) - 1
        inputs = [path]
        if args.gzip:
            packed = path.with_name(path.name + ".gz")
            if not packed.exists():
                subprocess.run(["gzip", "-k", "-f", str(path)], check=True)
            inputs.append(packed)
        for data in inputs:
            reference = None
            for name, src in sources.items():
                for chunk in chunks:
                    out = args.dir / f"out_{name}_{data.name}_{chunk}.parquet"
                    out.unlink(missing_ok=True)
                    out.with_name(f"{out.stem}.rejects.csv").unlink(missing_ok=True)
                    peak, cpu, rc = ingest(src, data, out, chunk)
                    if rc:
                        print(f"| {data.name} | {name} | {chunk} | {peak:.0f} | {cpu:.2f} | failed (exit {rc}) | |")
                        continue
                    reference = reference or out
                    print(f"| {data.name} ({rows:,} rows) | {name} | {chunk} | {peak:.0f} | {cpu:.2f} | "
                          f"{rows / cpu:,.0f} | {'yes' if same(reference, out) else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
