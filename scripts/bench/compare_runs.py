"""Compare the run folders of two code versions file by file, byte for byte except named keys.

    python scripts/bench/compare_runs.py <before> <after> [--ignore-keys unmeasured_pick,unmeasured_picks]

For a change that must leave measured figures alone: make the same runs with both versions
(``train``, ``scripts/bench/conv_proof.py``, ...) under two roots, then compare every
``metrics.json``, ``per_shape.csv``, ``oof_predictions.parquet``, ``folds.json``,
``conv_proof.json``, ``conv_proof.md``, ``pipeline.joblib`` and ``run.json`` found under
``<before>`` with the same path under ``<after>``:

* ``metrics.json``: ``<after>``'s, with the ``--ignore-keys`` (keys the change adds) removed at
  every depth and written back as ckpred writes it (``indent=2``, a trailing newline), against
  ``<before>``'s bytes;
* ``folds.json``, ``conv_proof.json``: as JSON, without timing fields and the ignored keys;
* ``run.json`` (informational): the fields both records hold, timings, versions, argv and
  config excepted;
* every other file: byte for byte.

One line per file; exit status 1 if any compared file differs or is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FILES = ("metrics.json", "per_shape.csv", "oof_predictions.parquet", "folds.json", "conv_proof.json",
         "conv_proof.md", "pipeline.joblib", "run.json")
#: Fields that time a run (they differ between any two runs).
TIMING = {"timings_s", "fit_predict_s", "fit_predict_cpu_s", "fit_s", "fit_score_s", "created", "argv", "total_s",
          "versions", "_seconds"}


def without(obj: Any, keys: set[str]) -> Any:
    """``obj`` with every mapping key in ``keys`` removed, at any depth."""
    if isinstance(obj, dict):
        return {k: without(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [without(v, keys) for v in obj]
    return obj


def count(obj: Any, keys: set[str]) -> int:
    if isinstance(obj, dict):
        return sum((k in keys) + count(v, keys) for k, v in obj.items())
    if isinstance(obj, list):
        return sum(count(v, keys) for v in obj)
    return 0


def compare(a: Path, b: Path, ignore: set[str]) -> tuple[str, bool]:
    """(what was found, whether it counts as a difference)."""
    if not b.exists():
        return "MISSING", True
    if a.name == "metrics.json":
        payload = json.loads(b.read_text())
        same = (json.dumps(without(payload, ignore), indent=2) + "\n").encode() == a.read_bytes()
        return (f"identical bytes without the {count(payload, ignore)} ignored keys" if same
                else "DIFFERENT without the ignored keys"), not same
    if a.name == "run.json":
        x, y = json.loads(a.read_text()), without(json.loads(b.read_text()), ignore)
        shared = [k for k in x if k in y and k not in TIMING | {"config"}]
        diff = [k for k in shared if without(x[k], TIMING) != without(y[k], TIMING)]
        return ((f"shared fields equal ({len(shared)})" if not diff else f"fields differ: {diff}")
                + f"; only in after: {sorted(set(y) - set(x))} (informational)"), False
    if a.read_bytes() == b.read_bytes():
        return "identical bytes", False
    if a.suffix == ".json":
        payload = json.loads(b.read_text())
        same = without(json.loads(a.read_text()), TIMING) == without(payload, TIMING | ignore)
        return ("identical without timings" + (f" and {count(payload, ignore)} ignored keys" if count(payload, ignore)
                                                 else "") if same else "DIFFERENT"), not same
    return "DIFFERENT", True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--ignore-keys", default="", help="comma-separated keys the change adds")
    parser.add_argument("names", nargs="*", help="run folders under both roots (default: every one found)")
    args = parser.parse_intermixed_args()
    ignore = {k for k in args.ignore_keys.split(",") if k}
    roots = [args.before / n for n in args.names] if args.names else [args.before]
    bad = 0
    for root in roots:
        for a in sorted(p for p in root.rglob("*") if p.name in FILES):
            got, differs = compare(a, args.after / a.relative_to(args.before), ignore)
            bad += differs
            print(f"{str(a.relative_to(args.before)):45s} {got}")
    print("ALL IDENTICAL" + (" (except the ignored keys)" if ignore else "") if not bad else f"{bad} DIFFERENT")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
