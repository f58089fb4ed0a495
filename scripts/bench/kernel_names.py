"""Kernel-name resolution against the previous code: CPU microseconds per new kernel name.

    OMP_NUM_THREADS=1 python scripts/bench/kernel_names.py [--old-ref 4d38308] [--repeats 7]
        [--dir /tmp/ckpred_kernel_names]

Ingestion resolves each distinct kernel name of a file once
(:meth:`ckpred.data.readers.common.KernelResolver.resolve_all`: parse the name with the op's
``parse_name``, check dtype/layout and the kernel rules, format the canonical name with the
op's ``format_name``). This times that per name, in a fresh resolver each repeat, on:

* ``gemm_universal``: the kernel names of the synthetic sweep (:mod:`ckpred.data.synthetic`,
  the tile-engine catalogue of gfx950/fp8/rcr), and the same names in the parity sweep's
  ``gemm_`` form (each normalised to the tile-engine name);
* ``grouped_conv_fwd``: names of its template over a grid of tiles, pipelines and 2-D/3-D
  kernels (the 3-D ones are impossible kernels, refused by the op's kernel rule);
* a declared op whose kernel id is the tuple of its fields (``(v1,v2,...)``), with no Python.

Each set runs in a child process twice: with ``--old-ref``'s package (``git archive``, as
:mod:`ingest_speed` does) and with this checkout's. Printed per set: microseconds per name of
``resolve_all`` (median and minimum over the repeats), of ``op.parse_name`` and of
``op.format_name`` alone, the ratio old/new, and whether both gave the same codes, canonical
names and reject reasons. CPU time of this process only: other work on the machine slows the
figures, not the ratio much; compare medians of runs made at the same time.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ingest_speed import old_source

REPO = Path(__file__).resolve().parents[2]
#: main before the kernel-name work.
OLD_REF = "4d38308"
SETS = ("gemm_universal", "gemm_universal_parity", "grouped_conv_fwd", "tuple_id")

#: An op declared by its config alone whose kernel id is the tuple of its fields.
TUPLE_OP = {
    "name": "bench_tuple_mm",
    "problem_fields": {"m": {"kind": "int"}, "n": {"kind": "int"}, "k": {"kind": "int"}},
    "kernel_fields": {"warps_m": {"kind": "int"}, "warps_n": {"kind": "int"}, "repeat_n": {"kind": "int"},
                      "k_pack": {"kind": "int"}, "repeat_m": {"kind": "int"}, "stages": {"kind": "int"}},
    "kernel_id": {"fields": ["warps_m", "warps_n", "repeat_n", "k_pack", "repeat_m", "stages"]},
    "metric": {"column": "time_us", "better": "lower", "unit": "us"},
    "flops": "2 * m * n * k",
    "rules": [{"expr": "warps_m * repeat_m * k_pack * stages >= 4 * warps_n * repeat_n",
               "message": "C-shuffle LDS reuse needs enough repeat_m for warps_n"}],
    "keys": {"query": ["m", "n", "k"]},
}


def name_set(which: str) -> tuple[object, list[str], str, str]:
    """(op, names, dtype, layout) of one set."""
    from ckpred.kernels.base import load_op

    if which.startswith("gemm_universal"):
        from ckpred.data.synthetic import synthetic_shapes
        from ckpred.kernels.gemm_universal import OP

        names = list(dict.fromkeys(row[4] for row in next(synthetic_shapes(4608))))
        if which.endswith("parity"):
            names = ["gemm_" + n[len("gemm_universal_"):] for n in names]
        return OP, names, "fp8", "rcr"
    if which == "grouped_conv_fwd":
        op = load_op("grouped_conv_fwd")
        tiles = (16, 32, 64, 128, 256)
        names = [f"grouped_conv_forward_fp16_{d}d_{m}x{n}x{k}_{p}"
                 for d, m, n, k, p in itertools.product((2, 3), tiles, tiles, tiles, op.field("pipeline").categories)]
        return op, names, "fp16", "rcr"
    op = load_op(TUPLE_OP)
    names = [f"({a},{b},{c},{d},{e},{f})" for a, b, c, d, e, f in itertools.product((1, 2, 4), repeat=6)]
    return op, names, "fp8", "rcr"


def measure(which: str, repeats: int) -> dict[str, object]:
    """Time one set in this process (whichever ckpred is on the path)."""
    import ckpred
    import ckpred.features.base  # noqa: F401  (the kernel rules need it: imported before the clock)
    from ckpred.data.readers.common import KernelResolver

    op, names, dtype, layout = name_set(which)

    def per_name(fn: object) -> list[float]:
        out = []
        for _ in range(repeats):
            start = time.process_time()
            fn()  # type: ignore[operator]
            out.append((time.process_time() - start) * 1e6 / len(names))
        return out

    resolvers: list[KernelResolver] = []

    def resolve() -> None:
        resolvers.append(KernelResolver(op, dtype=dtype, layout=layout))
        resolvers[-1].resolve_all(names)

    resolve_us = per_name(resolve)
    last = resolvers[-1]
    parsed = []
    for n in names:
        try:
            parsed.append(op.parse_name(n))
        except Exception:  # noqa: BLE001 - a name the op refuses: not formatted below
            pass
    kernels = [{f: p[f] for f in op.kernel_names if f in p} for p in parsed]
    parse_us = per_name(lambda: [_call(op.parse_name, n) for n in names])
    format_us = [t * len(names) / max(len(kernels), 1)
                 for t in per_name(lambda: [_call(lambda k: op.format_name(k, dtype=dtype, layout=layout), k)
                                            for k in kernels])]
    results = [last.resolve(n) for n in names]
    parsed_out = [repr(_call(op.parse_name, n)) for n in names]
    formatted = [_call(lambda k: op.format_name(k, dtype=dtype, layout=layout), k) for k in kernels]
    digest = hashlib.sha256(json.dumps([results, last.canonical_names, last.frame().astype(str).values.tolist(),
                                        parsed_out, formatted]).encode()).hexdigest()
    return {"package": str(Path(ckpred.__file__).parent), "names": len(names),
            "kernels": len(last.kernels), "rejected": sum(isinstance(r, str) for r in results),
            "resolve_us": resolve_us, "parse_us": parse_us, "format_us": format_us, "digest": digest}


def _call(fn: object, arg: object) -> object:
    try:
        return fn(arg)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the op's error is part of what is compared
        return repr(exc)


def child(which: str, repeats: int, old_src: Path | None) -> dict[str, object]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if old_src is not None:
        env["PYTHONPATH"] = str(old_src)
    run = subprocess.run([sys.executable, __file__, "--measure", which, "--repeats", str(repeats)],
                         capture_output=True, text=True, env=env, cwd=str(old_src or REPO))
    if run.returncode != 0:
        raise SystemExit(f"{which} ({'old' if old_src else 'new'}) failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-ref", default=OLD_REF)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpred_kernel_names"))
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.repeats)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    old_src = old_source(args.old_ref, args.dir)
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; old = {args.old_ref}, new = this checkout; "
          f"CPU microseconds per name, median (min) of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    for which in args.sets.split(","):
        old, new = child(which, args.repeats, old_src), child(which, args.repeats, None)
        if old["package"] == new["package"]:
            raise SystemExit(f"old and new ran the same package {old['package']}")
        print(f"{which}: {new['names']:,} names -> {new['kernels']:,} kernels, {new['rejected']:,} rejected; "
              f"results {'same' if old['digest'] == new['digest'] else 'DIFFERENT'}")
        for key, label in (("resolve_us", "resolve_all"), ("parse_us", "op.parse_name"),
                           ("format_us", "op.format_name")):
            o, n = statistics.median(old[key]), statistics.median(new[key])  # type: ignore[arg-type]
            print(f"  {label:15s} old {o:6.2f} ({min(old[key]):6.2f}) us  new {n:6.2f} ({min(new[key]):6.2f}) us"
                  f"  old/new x{o / n:.2f}", flush=True)


if __name__ == "__main__":
    main()
