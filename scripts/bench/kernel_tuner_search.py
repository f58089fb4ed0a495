"""Cross-GPU guided search on the Kernel Tuner convolution caches: evaluations to 95% / 99%.

For each GPU held out, a LightGBM regressor trained on the other GPUs' caches orders the search
(:mod:`ckpred.guided_search`); the search re-ranks after every measurement. Prints a markdown
table: measurements until the first configuration within 5% and within 1% of the held-out GPU's
best time, for the static order (no re-ranking), the guided search and random search (the
exact expectation (N + 1) / (k + 1)).

Usage (from the repository root)::

    python scripts/bench/kernel_tuner_search.py [--data-dir ../shared/data/kernel_tuner_amd] [--budget 200]
        [--explore-grid]
"""

from __future__ import annotations

import argparse
from pathlib import Path


from ckpred import guided_search as gs

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "kernel_tuner_amd"
GPUS = ("MI250X", "W6600", "W7800")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--budget", type=int, default=200, help="measurements per held-out GPU")
    parser.add_argument("--bandwidth", type=float, default=2.0)
    parser.add_argument("--explore-grid", action="store_true",
                        help="also print the exploring variant (every 2nd measurement the farthest of the pool's "
                             "best-ranked) for several pool sizes and bandwidths")
    args = parser.parse_args(argv)
    files = {g: args.data_dir / f"convolution_milo_{g}.json.gz" for g in GPUS}
    if not all(f.is_file() for f in files.values()):
        parser.error(f"Kernel Tuner caches not found in {args.data_dir}")
    caches = {g: gs.read_cache(f)[0] for g, f in files.items()}
    params = gs.read_cache(files[GPUS[0]])[1]
    for g in GPUS[1:]:
        if not caches[g].index.equals(caches[GPUS[0]].index):
            parser.error(f"{files[g]}: configurations differ from {files[GPUS[0]]}")
    X = caches[GPUS[0]][params].to_numpy(float)
    head = ["held-out GPU", "order", "to 95% (within 5%)", "to 99% (within 1%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(v: object) -> str:
        return f"> {args.budget}" if v is None else (f"{v:,.0f}" if isinstance(v, float) else str(v))

    for g in GPUS:
        t = caches[g]["time"].to_numpy(float)
        model = gs.source_model(X, [caches[s]["time"].to_numpy(float) for s in GPUS if s != g])
        prior = model.predict(X)
        for label, adapt in (("model trained on the other GPUs, static", False),
                             ("guided: re-ranked after each measurement", True)):
            order = gs.guided_search(X, prior, lambda i: t[i], args.budget, bandwidth=args.bandwidth, adapt=adapt)
            lines.append(f"| {g} | {label} | {cell(gs.evaluations_to_reach(order, t, 0.05))} | "
                         f"{cell(gs.evaluations_to_reach(order, t, 0.01))} |")
        lines.append(f"| {g} | random (expectation) | {cell(gs.random_evaluations(t, 0.05))} | "
                     f"{cell(gs.random_evaluations(t, 0.01))} |")
    print("\n".join(lines))
    if args.explore_grid:
        priors = {g: gs.source_model(X, [caches[s]["time"].to_numpy(float) for s in GPUS if s != g]).predict(X)
                  for g in GPUS}
        grid = ["", "| bandwidth | pool | " + " | ".join(f"{g} to 95% / 99%" for g in GPUS) + " |",
                "|" + "---|" * (2 + len(GPUS))]
        for bw in (1.5, 2.0, 3.0):
            for pool in (10, 15, 20, 30, 50, 100):
                cells = []
                for g in GPUS:
                    t = caches[g]["time"].to_numpy(float)
                    order = gs.guided_search(X, priors[g], lambda i: t[i], args.budget, bandwidth=bw,
                                             explore_every=2, explore_pool=pool)
                    cells.append(f"{cell(gs.evaluations_to_reach(order, t, 0.05))} / "
                                 f"{cell(gs.evaluations_to_reach(order, t, 0.01))}")
                grid.append(f"| {bw:g} | {pool} | " + " | ".join(cells) + " |")
        print("\n".join(grid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
