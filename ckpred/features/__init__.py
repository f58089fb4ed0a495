"""Feature transformers: raw int64 problem + kernel fields -> float64 model features.

One transformer per feature group (:mod:`~ckpred.features.problem`,
:mod:`~ckpred.features.kernel`, :mod:`~ckpred.features.interaction`,
:mod:`~ckpred.features.hardware`, ...), each an sklearn transformer with an ONNX converter in
:mod:`ckpred.export.converters`. A *feature set* (``conf/features/<name>.yaml``) lists the
groups and their scalar options; :func:`build_features` assembles them into a
:class:`~sklearn.pipeline.FeatureUnion`, filling hardware and dtype constants from the arch and
dtype configs.

Feature sets (``conf/features``) for gemm_universal
-----------------------------------------------------
=========  ========  =============================================================================
set        features  groups
=========  ========  =============================================================================
anchor55   55        problem 13 (incl. layout code) + kernel 21 + interaction 9 + hardware 12: the
                     reference system's list (CK_TILE_FACTS.md section 5), for side-by-side runs
minimal    42        problem 12 + kernel 21 + interaction 9 (anchor55 without constant columns)
full       89        minimal + tile_quantization 16 + wave 10 + roofline 11 (with ``est_vs_best``
                     against the catalogue's 23 tiles) + occupancy 10
=========  ========  =============================================================================

Screen (``scripts/compare_feature_sets.py``, default simulated data: 168 shapes x 4,608
kernels, 3-fold GroupKFold, LGBMRegressor 300 trees / 63 leaves on log1p TFLOPS, 600 training
rows per shape): anchor55 mean 0.9140 / P10 0.8679 / min 0.7228 (minimal: identical, the
constant columns are never split on); full mean 0.9151 / P10 0.8616 / min 0.7779. The physical groups lift the worst shape by 5.5 points and leave mean and P10
within the noise of such a screen (about 1 point); the simulator shares their physics, so real
data may reward them differently. The full training run (``python -m ckpred train``) is the
figure that counts.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from sklearn.pipeline import FeatureUnion

from ckpred.errors import ConfigValueError
from ckpred.features.registry import FEATURE_GROUPS, group_class

__all__ = ["FEATURE_GROUPS", "build_features", "catalogue_tiles", "constants_from_config",
           "group_class"]

#: Bytes per element of each dtype name (for the C matrix, whose dtype config is only a name).
_BYTES = {"fp8": 1, "bf8": 1, "fp16": 2, "bf16": 2, "fp32": 4}


def _get(cfg: Any, key: str) -> Any:
    value = cfg[key] if isinstance(cfg, (dict, DictConfig)) else getattr(cfg, key)
    return value


def constants_from_config(arch_cfg: Any, dtype_cfg: Any, layout_cfg: Any = None) -> dict[str, Any]:
    """Constructor values that come from the hardware/dtype/layout configs, by parameter name.

    Parameters
    ----------
    arch_cfg, dtype_cfg : ArchConfig, DtypeConfig, DictConfig or dict
        ``cfg.arch`` and ``cfg.dtype`` of a composed config.
    layout_cfg : LayoutConfig, DictConfig, dict or None
        ``cfg.layout``; when None the layout code stays at the transformer's default (rcr = 0).

    Returns
    -------
    dict
        Parameter name -> value; every transformer takes the ones it has parameters for.
    """
    from ckpred.schema import LAYOUTS

    dtype_name = _get(dtype_cfg, "name")
    peaks = _get(arch_cfg, "peak_tflops") or {}
    if dtype_name not in peaks:
        raise ConfigValueError(f"arch.peak_tflops.{dtype_name}", None,
                               f"a peak TFLOPS for dtype {dtype_name} (arch {_get(arch_cfg, 'name')} "
                               f"lists {sorted(peaks)})")
    xcds = int(_get(arch_cfg, "xcds"))
    values: dict[str, Any] = {
        "bytes_per_element": int(_get(dtype_cfg, "bytes_per_element")),
        "c_bytes_per_element": _BYTES[_get(dtype_cfg, "c_dtype")],
        "cus": int(_get(arch_cfg, "cus")),
        "xcds": xcds,
        "simds_per_cu": int(_get(arch_cfg, "simds_per_cu")),
        "shader_engines": int(_get(arch_cfg, "shader_engines")),
        "clock_mhz": int(_get(arch_cfg, "clock_mhz")),
        "max_waves_per_cu": int(_get(arch_cfg, "max_waves_per_cu")),
        "wave_size": int(_get(arch_cfg, "wave_size")),
        "lds_kib": int(_get(arch_cfg, "lds_kib")),
        "lds_bytes": int(_get(arch_cfg, "lds_kib")) * 1024,
        "l1_kib": int(_get(arch_cfg, "l1_kib")),
        "l2_mib": float(_get(arch_cfg, "l2_mib_per_xcd")) * xcds,
        "llc_mib": float(_get(arch_cfg, "llc_mib")),
        "memory_bandwidth_gbs": float(_get(arch_cfg, "memory_bandwidth_gbs")),
        "peak_tflops": float(peaks[dtype_name]),
    }
    if layout_cfg is not None:
        values["layout_code"] = LAYOUTS.index(_get(layout_cfg, "name"))
    return values


def catalogue_tiles(op: Any, arch_cfg: Any, dtype_cfg: Any, layout_cfg: Any = None) -> list[list[int]]:
    """Distinct (tile_m, tile_n, tile_k) of the op's catalogue for arch/dtype, sorted."""
    catalogue = op.catalogue(arch_cfg, dtype_cfg, layout_cfg if layout_cfg is not None else "rcr")
    tiles = catalogue[["tile_m", "tile_n", "tile_k"]].drop_duplicates().sort_values(["tile_m", "tile_n", "tile_k"])
    return [[int(v) for v in row] for row in tiles.to_numpy()]


def _as_features_config(features_cfg: Any) -> Any:
    """Validate any form of a feature-set config into a :class:`ckpred.schema.FeaturesConfig`."""
    from ckpred.schema import FeaturesConfig

    if isinstance(features_cfg, FeaturesConfig):
        return features_cfg
    merged = OmegaConf.merge(OmegaConf.structured(FeaturesConfig), features_cfg)
    return OmegaConf.to_object(merged)


def build_features(features_cfg: Any, op: Any, arch_cfg: Any, dtype_cfg: Any,
                   layout_cfg: Any = None) -> FeatureUnion:
    """Assemble the (unfitted) feature transformer of a feature set.

    Parameters
    ----------
    features_cfg : FeaturesConfig, DictConfig or dict
        ``cfg.features``: ``name`` and ``groups`` (each ``kind`` plus optional ``params``).
    op : OpDefinition
        The op; its ``input_names`` are the raw columns (and their order for array input).
    arch_cfg, dtype_cfg : config nodes
        Hardware profile and dtype; fill each transformer's constant parameters.
    layout_cfg : config node or None, default=None
        Layout; sets ``layout_code`` of :class:`~ckpred.features.problem.ProblemFeatures`.

    Returns
    -------
    sklearn.pipeline.FeatureUnion
        One ``(kind, transformer)`` per group, in YAML order; output names are
        ``<kind>__<feature>``.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When a group sets a parameter its transformer does not have, or needs a column the
        op does not provide.
    """
    cfg = _as_features_config(features_cfg)
    constants = constants_from_config(arch_cfg, dtype_cfg, layout_cfg)
    input_names = tuple(op.input_names)
    parts = []
    for i, group in enumerate(cfg.groups):
        cls = group_class(group.kind)
        accepted = set(cls().get_params())
        params = dict(group.params or {})
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise ConfigValueError(f"features.groups[{i}].params.{unknown[0]}", params[unknown[0]],
                                   f"parameters of {cls.__name__} ({group.kind}): {sorted(accepted)}")
        missing = [c for c in cls.input_columns if c not in input_names]
        if missing:
            raise ConfigValueError(f"features.groups[{i}].kind", group.kind,
                                   f"a group whose input columns exist in op {op.name!r} "
                                   f"(it lacks {missing})")
        kwargs = {key: value for key, value in constants.items() if key in accepted}
        if params.get("reference_tiles") == "catalogue":
            params["reference_tiles"] = catalogue_tiles(op, arch_cfg, dtype_cfg, layout_cfg)
        kwargs.update(params)
        kwargs["input_names"] = input_names
        parts.append((group.kind, cls(**kwargs)))
    return FeatureUnion(parts)
