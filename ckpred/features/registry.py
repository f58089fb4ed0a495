"""Names of the feature groups a feature set (``conf/features/*.yaml``) may use.

Kept free of heavy imports so the config schema can validate ``kind`` values cheaply; the
classes are imported only when a feature set is built.
"""

from __future__ import annotations

import importlib

#: ``kind`` in a feature-set YAML -> ``module:Class`` of its transformer.
FEATURE_GROUPS: dict[str, str] = {
    "problem": "ckpred.features.problem:ProblemFeatures",
    "kernel": "ckpred.features.kernel:KernelFeatures",
    "interaction": "ckpred.features.interaction:TileInteractionFeatures",
    "hardware": "ckpred.features.hardware:HardwareFeatures",
    "tile_quantization": "ckpred.features.interaction:TileQuantizationFeatures",
    "wave": "ckpred.features.wave:WaveQuantizationFeatures",
    "roofline": "ckpred.features.roofline:RooflineFeatures",
    "occupancy": "ckpred.features.occupancy:OccupancyFeatures",
    # grouped_conv_fwd (implicit-GEMM view of a convolution)
    "conv_problem": "ckpred.features.conv:ConvProblemFeatures",
    "conv_kernel": "ckpred.features.conv:ConvKernelFeatures",
    "conv_tile": "ckpred.features.conv:ConvTileFeatures",
    "conv_latency": "ckpred.features.conv:ConvLatencyFeatures",
}


def group_class(kind: str) -> type:
    """The transformer class of feature group ``kind`` (a key of :data:`FEATURE_GROUPS`)."""
    module, _, name = FEATURE_GROUPS[kind].partition(":")
    return getattr(importlib.import_module(module), name)
