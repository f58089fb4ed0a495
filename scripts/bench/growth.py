"""Growth with data size: wall time, CPU time and peak memory of ingest, train and export.

    OMP_NUM_THREADS=1 python scripts/bench/growth.py [--sizes 100000,1000000,10000000] [--work /tmp/ckpred_growth]

For each size N, each stage runs in a fresh child process (its peak RSS is its own
``ru_maxrss``; CPU is its user + system time):

* **ingest**: ``ckpred ingest``'s streaming path (``ingest_to_parquet``, ``data.chunk_mb=64``, a
  directory of Parquet parts) on a streaming benchmark log of N rows
  (:func:`ckpred.data.synthetic.write_synthetic_log`), through ``scripts/bench/ingest_speed.py
  --measure``.
* **train**: the default model recipe fitted on every row of an N-row simulated gfx950 fp8
  table read from Parquet (:func:`ckpred.fitting.fit_final`: what ``train`` fits as its final
  model and ``export`` fits without ``run_dir``). ``train``'s cross-validation repeats the fit
  once per fold and adds the baselines. ``--dask-from N`` trains sizes >= N with
  ``model.backend=dask`` on a partitioned copy instead (2 local workers; the peak is then the
  largest worker's, the client's is printed beside it).
* **export**: ``python -m ckpred export``'s engine on the fitted pipeline and the table (default
  strategy: the reranked selector, whose reranker is fitted here; parity check on the default
  number of shapes) — everything ``export`` does after fitting.

Prints one JSON line per stage and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS_PER_SHAPE = 4608  # the gfx950 fp8 rcr gemm_universal catalogue


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _config(name: str, extra: list[str]):
    from ckpred.config import compose

    return compose(name, ["arch=gfx950", "dtype=fp8", *extra])


def make_table(path: Path, rows: int) -> None:
    """An N-row simulated table (Parquet), written shape block by shape block, and its partitioned copy."""
    import pyarrow.parquet as pq

    sys.path.insert(0, str(HERE))
    from dask_scale import shape_grid

    from ckpred.data.simulate import simulate
    from ckpred.data.table import canonical_schema
    from ckpred.dtypes import load_dtype
    from ckpred.kernels.base import load_op
    from ckpred.scale import layout_config, write_partitions
    from ckpred.schema import arch_config

    import pyarrow as pa

    op = load_op("gemm_universal")
    shapes = shape_grid(max(1, round(rows / KERNELS_PER_SHAPE)))
    args = (op, arch_config("gfx950"), load_dtype("fp8"), layout_config("rcr"))

    def blocks():
        for i in range(0, len(shapes), 40):
            yield simulate(shapes.iloc[i:i + 40], *args)

    schema = canonical_schema(op)
    with pq.ParquetWriter(path, schema) as writer:
        for frame in blocks():
            writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
    write_partitions(blocks(), path.with_suffix(".parts"), op)


def train(table: Path, pipeline: Path, backend: str) -> dict:
    import joblib

    from ckpred.data.table import read_table
    from ckpred.fitting import fit_final
    from ckpred.data.partitions import read_manifest
    from ckpred.kernels.base import load_op

    t, cpu = time.perf_counter(), _cpu()
    cfg = _config("train", [])
    op = load_op(cfg.op)
    extra = {}
    if backend == "local":
        data = read_table(table, op)
        pipe = fit_final(cfg, data, op)
        rows = len(data)
    else:
        from ckpred import scale

        with scale.dask_client(cfg.model.dask) as client:
            pipe, info = scale.fit_partitioned(cfg, op, table.with_suffix(".parts"), backend="dask", client=client)
            workers = client.run(lambda: (_peak_mb(), _cpu()))
        rows = read_manifest(table.with_suffix(".parts"), op)["rows"]
        extra = {"workers_peak_mb": [w[0] for w in workers.values()],
                 "workers_cpu_s": [round(w[1], 1) for w in workers.values()], "client_peak_mb": _peak_mb()}
    joblib.dump(pipe, pipeline)
    peak = max(extra.get("workers_peak_mb", [0]) + [_peak_mb()])
    return {"stage": "train", "backend": backend, "rows": rows, "wall_s": round(time.perf_counter() - t, 1),
            "cpu_s": round(_cpu() - cpu + sum(extra.get("workers_cpu_s", [])), 1), "peak_mb": peak, **extra}


def export(table: Path, pipeline: Path, out: Path) -> dict:
    import ckpred.commands.export as ex
    from ckpred.data.table import read_table
    from ckpred.runs import load_pipeline
    from ckpred.kernels.base import load_op

    t, cpu = time.perf_counter(), _cpu()
    cfg = _config("export", [f"out_dir={out}"])
    op = load_op(cfg.op)
    data = read_table(table, op)
    pipe = load_pipeline(pipeline)  # runs nothing a tampered file names
    # export's own path with the fitting step replaced by the pipeline fitted above
    ex._fit_here = lambda cfg, op: ex._Source(pipe, data, cfg, {"kind": "fit"})
    ex.export_command(cfg)
    return {"stage": "export", "rows": len(data), "wall_s": round(time.perf_counter() - t, 1),
            "cpu_s": round(_cpu() - cpu, 1), "peak_mb": _peak_mb()}


def child(*args: str) -> dict:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ckpred_growth"))
    ap.add_argument("--dask-from", type=int, default=0, help="train sizes >= this with model.backend=dask (0: never)")
    ap.add_argument("--stages", default="ingest,train,export")
    ap.add_argument("--do", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.do:
        what, *rest = args.do
        if what == "table":
            make_table(Path(rest[0]), int(rest[1]))
            print(json.dumps({"made": rest[0]}))
        elif what == "train":
            print(json.dumps(train(Path(rest[0]), Path(rest[1]), rest[2])))
        elif what == "export":
            print(json.dumps(export(Path(rest[0]), Path(rest[1]), Path(rest[2]))))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        log, table, pipe = args.work / f"log{n}.log", args.work / f"table{n}.parquet", args.work / f"pipe{n}.joblib"
        if "ingest" in stages:
            if not log.exists():
                from ckpred.data.synthetic import write_synthetic_log

                write_synthetic_log(log, n)
            r = child(str(HERE / "ingest_speed.py"), "--measure", "--mode", "new", "--input", str(log),
                      "--out", str(args.work / f"ingested{n}"), "--chunk-mb", "64")
            r = {"stage": "ingest", "rows": n, **({"wall_s": round(r["seconds"], 1), "cpu_s": round(r["cpu_seconds"], 1),
                                                    "peak_mb": round(r["peak_rss_mb"], 1)} if "seconds" in r else r)}
            results.append(r)
            print(json.dumps(r), flush=True)
        if not table.exists() and ("train" in stages or "export" in stages):
            child(__file__, "--do", "table", str(table), str(n))
        if "train" in stages:
            backend = "dask" if args.dask_from and n >= args.dask_from else "local"
            r = child(__file__, "--do", "train", str(table), str(pipe), backend)
            results.append({"rows": n, **r, "stage": "train"})
            print(json.dumps(results[-1]), flush=True)
        if "export" in stages and pipe.exists():
            r = child(__file__, "--do", "export", str(table), str(pipe), str(args.work / f"export{n}"))
            results.append({"rows": n, **r, "stage": "export"})
            print(json.dumps(results[-1]), flush=True)
    print("\n| rows | stage | wall s | CPU s | peak RSS MB | note |\n|---:|---|---:|---:|---:|---|")
    for r in results:
        note = r.get("error") or (f"{r['backend']} backend" if "backend" in r else "")
        print(f"| {r['rows']:,} | {r['stage']} | {r.get('wall_s', '')} | {r.get('cpu_s', '')} | "
              f"{r.get('peak_mb', '')} | {note} |")


if __name__ == "__main__":
    main()
