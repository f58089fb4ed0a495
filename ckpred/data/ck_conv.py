"""AMD's public CK Tile grouped-convolution forward measurements (bf16, gfx950) and the
protocols ckpred evaluates on them.

The checkout ships the tables in :data:`DIRECTORY` (MIT licence, attribution in its README):
a 20-kernel training table (compv3/compv4 pipelines only), a 300-problem benchmark table over
30 kernels and AMD's published per-problem summary of its own heuristic on that benchmark.

Protocols, as Hydra overrides of the ``train`` config (:func:`protocol_overrides`):

* ``A``: train on the training table, select among the benchmark's kernels (``cv=external``);
* ``B``: 5-fold GroupKFold by problem over the benchmark table alone;
* ``T``: 5-fold GroupKFold over the training table alone. It shares no problem with the
  benchmark, so recipe choices made on it are not selected by A's or B's test scores.
"""

from __future__ import annotations

from pathlib import Path

#: Folder of the tables, relative to the repository root.
DIRECTORY = Path("data") / "ck_grouped_conv_fwd_bf16_gfx950"
#: The 300-problem benchmark table (30 kernels).
BENCH = "benchmark_forward_300_bf16_gfx950.csv"
#: The training table (20 kernels).
TRAIN = "training_data_forward_bf16_20.csv"
#: AMD's published summary of its heuristic on the benchmark's problems.
AMD_SUMMARY = "comparison_summary_300.csv"
PROTOCOLS: tuple[str, ...] = ("A", "B", "T")


def protocol_overrides(protocol: str, data_dir: Path, out: Path) -> list[str]:
    """Hydra overrides of the ``train`` config that run one protocol.

    Parameters
    ----------
    protocol
        ``A``, ``B`` or ``T`` (see the module docstring).
    data_dir
        The folder holding :data:`BENCH` and :data:`TRAIN`.
    out
        The protocol writes its run to ``out / protocol``.

    Raises
    ------
    ValueError
        For any other protocol name.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; allowed: A, B, T")
    common = ["experiment=ck_conv_gfx950", f"out_dir={out / protocol}", "plots=false", "progress=false"]
    if protocol == "B":
        return [*common, f"data.path={data_dir / BENCH}"]
    if protocol == "T":
        return [*common, f"data.path={data_dir / TRAIN}"]
    return [*common, f"data.path={data_dir / TRAIN}", "cv=external", "cv.data.source=path",
            f"cv.data.path={data_dir / BENCH}", "cv.data.format=csv"]
