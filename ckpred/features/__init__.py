"""Feature transformers: raw int64 problem + kernel fields -> float64 model features.

A *feature set* (``conf/features/<name>.yaml``) lists feature groups; :func:`build_features`
assembles them into a :class:`~sklearn.pipeline.FeatureUnion`, filling hardware and dtype
constants from the arch and dtype configs. Each group is an sklearn transformer with an ONNX
converter in :mod:`ckpred.export.converters`; its ``kind`` (see :mod:`ckpred.features.registry`)
is

* an expression group: inline (``kind: expressions`` with ``params.features``) or declared in
  ``conf/features/groups/<kind>.yaml`` (``problem``, ``kernel``, ``interaction``,
  ``tile_quantization``, ``wave``, ``occupancy``, ``hardware``), all computed by
  :class:`~ckpred.features.expression.ExpressionFeatures` with ``hw.*`` = :func:`constants_from_config`;
* a Python group for what expressions cannot say (``roofline``: a minimum over the catalogue's
  tiles; the conv groups: estimates shared with scripts and a minimum over reference tiles);
* any ``package.module:Class`` FeatureGroup (an op's own Python group).

A declared group takes ``exclude: [feature, ...]`` (left out of the output, still readable by
the other features) and extra ``features``/``terms``/``one_hot`` on top of its declaration.

Feature sets (``conf/features``) for gemm_universal
-----------------------------------------------------
=========  ========  =============================================================================
set        features  groups
=========  ========  =============================================================================
anchor55   55        problem 13 (incl. layout code) + kernel 21 + interaction 9 + hardware 12: the
                     reference system's list, for side-by-side runs
minimal    42        problem 12 + kernel 21 + interaction 9 (anchor55 without constant columns)
full       89        minimal + tile_quantization 16 + wave 10 + roofline 11 (with ``est_vs_best``
                     against the catalogue's 23 tiles) + occupancy 10
=========  ========  =============================================================================

How the sets compare (``scripts/research/compare_feature_sets.py``): docs/results.md,
"Feature-set screen".
"""

from __future__ import annotations

from typing import Any, Mapping

from sklearn.pipeline import FeatureUnion

from ckpred import vocab
from ckpred.errors import ConfigValueError
from ckpred.expressions import dtype_bytes_table
from ckpred.features.expression import ExpressionFeatures, compile_features
from ckpred.features.registry import (EXPRESSIONS, FEATURE_GROUPS, declaration, default_name, group_class,
                                      known_kinds)
from ckpred.kernels.base import OpDefinition
from ckpred.schema import (ARCH_ALIASES, ArchConfig, DtypeConfig, FeaturesConfig, LayoutConfig, arch_constants,
                           from_mapping)

__all__ = ["FEATURE_GROUPS", "build_features", "catalogue_tiles", "constants_from_config",
           "group_class", "group_input_columns", "known_kinds", "op_categories"]


def _get(cfg: ArchConfig | DtypeConfig | LayoutConfig | Mapping[str, Any], key: str) -> Any:
    return cfg[key] if isinstance(cfg, Mapping) else getattr(cfg, key)


def constants_from_config(arch_cfg: ArchConfig | Mapping[str, Any], dtype_cfg: DtypeConfig | Mapping[str, Any],
                          layout_cfg: LayoutConfig | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's constants by name: Python groups' parameters and the ``hw.*`` of expressions.

    Parameters
    ----------
    arch_cfg, dtype_cfg : ArchConfig, DtypeConfig or mapping
        ``cfg.arch`` and ``cfg.dtype`` of a composed config (the table's own arch).
    layout_cfg : LayoutConfig, mapping or None
        ``cfg.layout``; when None the layout code is rcr's (0), the layout the catalogue
        assumes without one.

    Returns
    -------
    dict
        Name -> value: :func:`ckpred.schema.arch_constants` of the arch (``compute_units``,
        ``dies``, ``shared_memory_bytes``, ``l2_mib`` (the whole chip), ``peak_tflops_<dtype>``,
        ..., and the old names ``cus``, ``xcds``, ``lds_bytes``...), the dtype's
        ``bytes_per_element``, ``c_bytes_per_element`` and ``peak_tflops`` and ``layout_code``. A Python transformer takes the ones it has parameters for.
    """
    dtype_name = _get(dtype_cfg, "name")
    peaks = _get(arch_cfg, "peak_tflops") or {}
    if dtype_name not in peaks:
        raise ConfigValueError(f"arch.peak_tflops.{dtype_name}", None,
                               f"a peak TFLOPS for dtype {dtype_name} (arch {_get(arch_cfg, 'name')} "
                               f"lists {sorted(peaks)})")
    # Every hw.<name> the op's rules see (schema.arch_constants, neutral and old names), then the
    # run's own: integer sizes for the Python groups' parameters, the dtype and the layout.
    size = float(_get(dtype_cfg, "bytes_per_element"))
    hw = arch_constants(arch_cfg)
    integers = {name: int(hw[name]) for name in (
        "compute_units", "dies", "simds_per_unit", "engine_clusters", "clock_mhz", "max_warps_per_unit", "warp_size",
        "shared_memory_kib", "shared_memory_bytes", "l1_kib")}
    integers.update({old: integers[new] for old, new in ARCH_ALIASES.items() if new in integers})
    values: dict[str, Any] = {
        **hw,
        **integers,
        "lds_bytes": integers["shared_memory_bytes"],
        # whole bytes stay ints (the Python groups' parameters), a packed type's fraction a float
        "bytes_per_element": int(size) if size.is_integer() else size,
        "c_bytes_per_element": dtype_bytes_table()[_get(dtype_cfg, "c_dtype")],
        "peak_tflops": float(peaks[dtype_name]),
        "layout_code": 0 if layout_cfg is None else vocab.current().layout(_get(layout_cfg, "name")).code,
    }
    return values


def op_categories(op: OpDefinition) -> dict[str, list[str]]:
    """Categorical input field of ``op`` -> its values in code order."""
    out: dict[str, list[str]] = {}
    for name in op.input_names:
        field = op.field(name)
        if getattr(field, "kind", None) in ("category", "categorical"):
            values = getattr(field, "categories", None) or getattr(field, "values", None) or ()
            out[name] = [str(v) for v in values]
    return out


def catalogue_tiles(op: OpDefinition, arch_cfg: ArchConfig | Mapping[str, Any], dtype_cfg: DtypeConfig | str,
                    layout_cfg: LayoutConfig | str | None = None) -> list[list[int]]:
    """Distinct (tile_m, tile_n, tile_k) of the op's catalogue for arch/dtype, sorted."""
    catalogue = op.catalogue(arch_cfg, dtype_cfg, layout_cfg if layout_cfg is not None else "rcr")
    tiles = catalogue[["tile_m", "tile_n", "tile_k"]].drop_duplicates().sort_values(["tile_m", "tile_n", "tile_k"])
    return [[int(v) for v in row] for row in tiles.to_numpy()]


def _as_features_config(features_cfg: FeaturesConfig | Mapping[str, Any]) -> FeaturesConfig:
    """Validate any form of a feature-set config into a :class:`ckpred.schema.FeaturesConfig`."""
    if isinstance(features_cfg, FeaturesConfig):
        return features_cfg
    return from_mapping(FeaturesConfig, features_cfg)


def build_features(features_cfg: FeaturesConfig | Mapping[str, Any], op: OpDefinition, arch_cfg: ArchConfig | Mapping[str, Any],
                   dtype_cfg: DtypeConfig, layout_cfg: LayoutConfig | None = None) -> FeatureUnion:
    """Assemble the (unfitted) feature transformer of a feature set.

    Parameters
    ----------
    features_cfg : FeaturesConfig or mapping
        ``cfg.features``: ``name`` and ``groups`` (each ``kind``, optional ``name`` and ``params``).
    op : OpDefinition
        The op; its ``input_names`` are the raw columns (and their order for array input).
    arch_cfg : ArchConfig or mapping
        Hardware profile of the table; fills each transformer's constants.
    dtype_cfg : DtypeConfig
        Dtype of the table.
    layout_cfg : LayoutConfig or None, default=None
        Layout; sets the ``layout_code`` constant.

    Returns
    -------
    sklearn.pipeline.FeatureUnion
        One ``(name, transformer)`` per group, in YAML order; output names are
        ``<name>__<feature>`` (``name`` defaults to the kind).

    Raises
    ------
    ckpred.errors.ConfigValueError
        When a group sets a parameter its transformer does not have, an expression does not
        parse or reads a field or constant that does not exist, or a group needs a column the
        op does not provide; the key names the group and parameter.
    """
    cfg = _as_features_config(features_cfg)
    constants = constants_from_config(arch_cfg, dtype_cfg, layout_cfg)
    input_names = tuple(op.input_names)
    parts = []
    for i, group in enumerate(cfg.groups):
        key = f"features.groups[{i}]"
        cls = group_class(group.kind, key=f"{key}.kind")
        params = dict(group.params or {})
        if group.kind == EXPRESSIONS or declaration(group.kind) is not None:
            transformer = _expression_group(group.kind, params, key, op, constants)
        else:
            accepted = set(cls().get_params())
            unknown = sorted(set(params) - accepted)
            if unknown:
                raise ConfigValueError(f"{key}.params.{unknown[0]}", params[unknown[0]],
                                       f"parameters of {cls.__name__} ({group.kind}): {sorted(accepted)}")
            kwargs = {k: value for k, value in constants.items() if k in accepted}
            if params.get("reference_tiles") == "catalogue":
                params["reference_tiles"] = catalogue_tiles(op, arch_cfg, dtype_cfg, layout_cfg)
            kwargs.update(params)
            kwargs["input_names"] = input_names
            transformer = cls(**kwargs)
        missing = [c for c in transformer.input_columns if c not in input_names]
        if missing:
            raise ConfigValueError(f"{key}.kind", group.kind,
                                   f"a group whose input columns exist in op {op.name!r} "
                                   f"(it lacks {missing})")
        parts.append((group.name or default_name(group.kind), transformer))
    return FeatureUnion(parts)


#: Parameters an expression group takes in a feature set (``exclude`` only on declared kinds).
_EXPRESSION_PARAMS = ("features", "terms", "one_hot")


def _expression_group(kind: str, params: dict[str, Any], key: str, op: OpDefinition, constants: dict[str, Any]) -> Any:
    """The ExpressionFeatures of an inline or declared group, its expressions checked."""
    declared = declaration(kind)
    allowed = [*_EXPRESSION_PARAMS, *(["exclude"] if declared is not None else [])]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigValueError(f"{key}.params.{unknown[0]}", params[unknown[0]],
                               f"parameters of an expression group ({kind}): {allowed}")
    base = declared or {}
    for name in _EXPRESSION_PARAMS:
        value = params.get(name)
        expected = list if name == "one_hot" else dict
        if value is not None and not isinstance(value, expected):
            raise ConfigValueError(f"{key}.params.{name}", value,
                                   "a list of categorical fields" if name == "one_hot"
                                   else "a mapping of name -> expression")
    features = {**(base.get("features") or {}), **(params.get("features") or {})}
    terms = {**_op_terms(op), **(base.get("terms") or {}), **(params.get("terms") or {})}
    one_hot = [*(base.get("one_hot") or []), *(params.get("one_hot") or [])]
    for name in params.get("exclude") or []:
        if name not in features:
            raise ConfigValueError(f"{key}.params.exclude", name, f"a feature of {kind}: {list(features)}")
        terms[name] = features.pop(name)  # still readable by the other features
    if not features and not one_hot:
        raise ConfigValueError(f"{key}.params.features", params.get("features"),
                               "a non-empty mapping of feature name -> expression (or one_hot fields)")
    where = f"{key}.params" if declared is None else f"conf/features/groups/{kind}.yaml"
    program = compile_features(features, terms, one_hot, key=where)
    categories = op_categories(op)
    fields = list(op.input_names)
    if declared is None:  # inline: name the exact expression that reads what the op lacks
        for name in program.exprs:
            program.exprs[name].validate([*fields, *program.exprs], constants, categories=categories)
    for field in one_hot:
        if field not in categories:
            raise ConfigValueError(f"{key}.params.one_hot", field,
                                   f"a categorical field of op {op.name!r}: {sorted(categories) or 'none'}")
    if declared is not None and set(program.input_columns) <= set(fields):
        for name in program.order:
            program.exprs[name].validate([*fields, *program.exprs], constants, categories=categories)
    return ExpressionFeatures(features=features, terms=terms or None, one_hot=one_hot or None,
                              hw=dict(constants), categories={f: categories[f] for f in categories
                                                              if f in program.input_columns} or None,
                              input_names=tuple(op.input_names))


def _op_terms(op: OpDefinition) -> dict[str, str]:
    """The op's ``flops`` and ``bytes`` expressions, readable by name in expression groups."""
    config = getattr(op, "config", None)
    out = {}
    for name in ("flops", "bytes"):
        text = getattr(config, name, None)
        if isinstance(text, str) and text.strip() and name not in op.input_names:
            out[name] = text
    return out


def group_input_columns(kind: str, params: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Raw input columns a group of ``kind`` (with ``params``) reads, without an op at hand."""
    params = dict(params or {})
    declared = declaration(kind)
    if kind == EXPRESSIONS or declared is not None:
        base = declared or {}
        features = {**(base.get("features") or {}), **(params.get("features") or {})}
        terms = {**(base.get("terms") or {}), **(params.get("terms") or {})}
        one_hot = [*(base.get("one_hot") or []), *(params.get("one_hot") or [])]
        return compile_features(features, terms, one_hot).input_columns
    return tuple(group_class(kind)().input_columns)
