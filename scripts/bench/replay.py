"""Replay autotune policies on the CK conv tables: efficiency against benchmarks per problem.

Trains Protocols B and A (and T, the CV over the 20-kernel training table that calibrates A's
confidence budget the way an export of A's model would be calibrated) with
``scripts/conv_proof.py``'s overrides, or reuses their run directories (``--runs``), then
replays every policy in model order and in random order (:mod:`ckpred.replay`). Writes
``replay.md`` (markdown tables) and ``replay.png`` (mean and min efficiency against benchmarks
per problem) to ``--out``.

Usage (from the repository root)::

    python scripts/bench/replay.py --out runs/replay                   # trains A, B, T (~3 min)
    python scripts/bench/replay.py --out runs/replay --runs runs/conv_proof   # reuse A/, B/, T/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from conv_proof import DATA_DIR, run_protocol  # noqa: E402

from ckpred import autotune as at  # noqa: E402
from ckpred import replay as rp  # noqa: E402

#: The issue's targets: protocol -> (mean, min, benchmarks per problem).
TARGETS = {"B": (0.995, 0.95, 1.5), "A": (0.995, 0.90, 2.0)}


def policies() -> list[at.Budget]:
    return [at.FixedK(1), at.FixedK(2), at.FixedK(3), at.FixedK(5),
            *(at.Confidence(target=t, within=w) for w in (0.02, 0.05) for t in (0.7, 0.8, 0.9, 0.95)),
            rp.Hindsight(0.05), rp.Hindsight(0.01)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "replay")
    parser.add_argument("--runs", type=Path, default=None, help="existing conv_proof output (A/, B/, T/)")
    parser.add_argument("--seeds", type=int, default=20, help="random orders averaged")
    args = parser.parse_args(argv)
    runs = args.runs
    if runs is None:
        runs = args.out / "runs"
        for protocol in ("B", "A", "T"):
            run_protocol(protocol, args.data_dir, runs.resolve(), [])
    data = {p: rp.load_run(runs / p) for p in ("B", "A", "T")}
    tables = {"B: 5-fold CV on the 30-kernel benchmark (calibration cross-fitted by fold)":
              rp.replay_table(data["B"], policies(), random_seeds=args.seeds),
              "A: trained on the 20-kernel table (calibration: CV on that table, T)":
              rp.replay_table(data["A"], policies(), calibration_data=data["T"], random_seeds=args.seeds)}
    text = []
    for (title, table), protocol in zip(tables.items(), ("B", "A")):
        text.append(rp.markdown(table, title))
        mean, low, cost = TARGETS[protocol]
        ok = table[(table.order == "model") & ~table.policy.str.startswith("hindsight")
                   & (table["mean"] >= mean) & (table["min"] >= low) & (table.benchmarks <= cost)]
        text.append(f"\nTarget {protocol} (mean >= {100 * mean:g}%, min >= {100 * low:g}%, <= {cost:g} benchmarks): "
                    + ("met by " + ", ".join(ok.policy) if len(ok) else "not met by any policy") + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.md").write_text("\n".join(text) + "\n")
    rp.plot_curves({t.split(":")[0]: tab for t, tab in tables.items()}, args.out / "replay.png")
    print("\n".join(text))
    print(f"wrote {args.out / 'replay.md'} and {args.out / 'replay.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
