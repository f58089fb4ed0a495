"""Cross-GPU guided search on Kernel Tuner caches: evaluations to 95% / 99% of the best.

For each GPU held out, a LightGBM regressor trained on the other GPUs' caches orders the search
(:mod:`ckpred.guided_search`); the search re-ranks after every measurement. Prints a markdown
table: measurements until the first configuration within 5% and within 1% of the held-out GPU's
best time, for the static order (no re-ranking), the guided search and random search (the
exact expectation (N + 1) / (k + 1)).

The caches are one Kernel Tuner cache per GPU (``.json`` or ``.json.gz``, any file names), all
of one kernel's search space; the op (a YAML op of the ``kernel_tuner`` format, in a config dir)
names the search parameters (its kernel fields) and the measured column (its metric). Each GPU
is labelled as ingest labels it (the last word of the cache's ``device_name``, else from the
file's name).

Usage (from the repository root)::

    python scripts/bench/kernel_tuner_search.py [CACHE ...] [--config-dir tests/ops] [--op kernel_tuner_conv]
        [--budget 200] [--explore-grid]

Without caches it reads ``../shared/data/kernel_tuner_amd/*.json.gz`` (MI250X, W6600, W7800).
"""

from __future__ import annotations

import argparse
from pathlib import Path


from ckpred import guided_search as gs

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO.parent / "shared" / "data" / "kernel_tuner_amd"


def _device(path: Path) -> str:
    """The GPU of a cache, as ingest names it (the last word of ``device_name``, else from the
    file's name)."""
    from ckpred.data.readers import kernel_tuner

    text = kernel_tuner._text(path)
    device = str(kernel_tuner._header(text, text.find('"cache"'), path).get("device_name") or "")
    return kernel_tuner.gpu_name(device, path)


def _search_space(op_name: str, config_dir: Path) -> tuple[list[str], str]:
    """The op's kernel fields (the search parameters) and its metric column."""
    from ckpred.config import compose
    from ckpred.kernels.base import load_op

    cfg = compose("ingest", [f"op={op_name}", "data.path=unused"], config_dir=config_dir)
    op = load_op(cfg.op)
    return list(op.kernel_names), str(cfg.op.metric.column)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("caches", nargs="*", type=Path, help="Kernel Tuner caches, one per GPU (at least 2)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where to find caches when none are given")
    parser.add_argument("--config-dir", type=Path, default=REPO / "tests" / "ops", help="config dir holding the op")
    parser.add_argument("--op", default="kernel_tuner_conv", help="the caches' op (op/<name>.yaml)")
    parser.add_argument("--budget", type=int, default=200, help="measurements per held-out GPU")
    parser.add_argument("--bandwidth", type=float, default=2.0)
    parser.add_argument("--explore-grid", action="store_true",
                        help="also print the exploring variant (every 2nd measurement the farthest of the pool's "
                             "best-ranked) for several pool sizes and bandwidths")
    args = parser.parse_args(argv)
    paths = args.caches or sorted(args.data_dir.glob("*.json*"))
    if len(paths) < 2:
        parser.error(f"give two or more Kernel Tuner caches (found {len(paths)} in {args.data_dir})")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such cache: {', '.join(missing)}")
    fields, metric = _search_space(args.op, args.config_dir)
    labels = [_device(p) for p in paths]
    if len(set(labels)) != len(labels):
        parser.error(f"two caches of one GPU: {dict(zip(map(str, paths), labels))}")
    GPUS = tuple(labels)
    files = dict(zip(GPUS, paths))
    caches = {g: gs.read_cache(f)[0] for g, f in files.items()}
    for g, frame in caches.items():
        if metric not in frame:
            parser.error(f"{files[g]}: no {metric!r} column (the metric of op {args.op})")
    # the op's kernel fields that vary (read_cache keeps only the varying parameters)
    params = [f for f in fields if f in caches[GPUS[0]]]
    if not params:
        parser.error(f"{files[GPUS[0]]}: none of op {args.op}'s kernel fields {fields} varies in the cache")
    for g in GPUS[1:]:
        if not caches[g].index.equals(caches[GPUS[0]].index):
            parser.error(f"{files[g]}: configurations differ from {files[GPUS[0]]}")
    for g in GPUS:
        caches[g] = caches[g].rename(columns={metric: "time"})
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
