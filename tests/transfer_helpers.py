"""A small table of several GPUs for the zero-shot tests: Kernel Tuner caches written here.

Each GPU's times depend on its own arch config (warp size, compute units, shared memory), so
the hardware constants carry signal: a model that sees every row's own constants can learn how
the best configuration moves with them, one that sees the run arch's constants (a constant
column) cannot.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from ckpred.schema import arch_config

#: device name -> arch config name (as the reader maps them).
DEVICES = {"AMD Instinct MI250X": "gfx90a", "AMD Radeon PRO W6600": "gfx1032", "AMD Radeon PRO W7800": "gfx1100",
           "NVIDIA A100": "sm80_a100", "NVIDIA RTX A4000": "sm86_a4000"}
KEYS = ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y", "read_only", "use_padding", "use_shmem",
        "use_cmem", "filter_height", "filter_width"]
GRID = {"block_size_x": [16, 32, 48, 64, 96, 128], "block_size_y": [1, 2, 4], "tile_size_x": [1, 2],
        "tile_size_y": [1, 2], "read_only": [0], "use_padding": [0], "use_shmem": [0, 1], "use_cmem": [1],
        "filter_height": [15], "filter_width": [15]}


def seconds(device: str, c: dict[str, int]) -> float:
    """A made-up time: best when a block holds about ``compute_units / 4`` warps of the GPU's
    warp size, shared memory paying off on GPUs with more of it."""
    arch = arch_config(DEVICES[device])
    threads = c["block_size_x"] * c["block_size_y"]
    warps = math.ceil(threads / arch.warp_size)
    lanes = threads / (warps * arch.warp_size)
    preferred = max(1.0, arch.compute_units / 32)
    t = 1.0 + 0.4 * abs(math.log2(warps / preferred)) + 0.5 * (1 - lanes)
    t *= 1.0 + 0.1 * abs(c["tile_size_x"] * c["tile_size_y"] - 2)
    if c["use_shmem"]:
        t *= 0.85 if arch.shared_memory_kib >= 64 else 1.2
    return round(t * 100 / arch.compute_units, 6)


def write_caches(folder: Path, devices: list[str] | None = None) -> Path:
    """One cache file per device in ``folder``; returns the folder (``data.path=<folder>/*.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for device in devices or list(DEVICES):
        cache = {}
        for values in itertools.product(*(GRID[k] for k in KEYS)):
            c = dict(zip(KEYS, values))
            cache[",".join(str(v) for v in values)] = {**c, "time": seconds(device, c)}
        doc = {"device_name": device, "kernel_name": "convolution_kernel", "problem_size": [4096, 4096],
               "tune_params_keys": KEYS, "tune_params": GRID, "objective": "time", "cache": cache}
        (folder / f"convolution_{device.split()[-1]}.json").write_text(json.dumps(doc))
    return folder


OPS_DIR = Path(__file__).resolve().parent / "ops"
SMALL = ["model.n_estimators=8", "model.n_jobs=1", "baselines.plain.model.n_estimators=20", "plots=false",
         "progress=false"]


def train_config(caches: Path, *extra: str):
    """The kernel_tuner_gpus experiment (leave one GPU out) on ``caches``, small."""
    from ckpred.config import compose

    return compose("train", [f"hydra.searchpath=[file://{OPS_DIR}]", "experiment=kernel_tuner_gpus",
                             f"data.path={caches}/*.json", *SMALL, *extra])


def train_logo(caches: Path, out: Path) -> Path:
    """A leave-one-GPU-out run of the transfer recipe on ``caches`` into ``out``."""
    from ckpred.cv.driver import cross_validate

    out.mkdir(parents=True, exist_ok=True)
    cross_validate(train_config(caches, f"out_dir={out}"), out)
    return out


def export_transfer(run: Path, caches: Path, out: Path, arch: str = "sm90_h100") -> Path:
    """The run's transfer recipe exported for ``arch`` (parity on every training problem)."""
    from ckpred.commands.export import export_command
    from ckpred.config import compose

    cfg = compose("export", [f"hydra.searchpath=[file://{OPS_DIR}]", "experiment=kernel_tuner_gpus",
                             f"data.path={caches}/*.json", f"run_dir={run}", f"arch={arch}", f"out_dir={out}",
                             "parity.shapes=0"])
    return Path(export_command(cfg))
