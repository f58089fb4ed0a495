"""Which transformer a feature group's ``kind`` (``conf/features/*.yaml``) names.

A ``kind`` is one of

* ``expressions``: an inline declaration, :class:`ckpred.features.expression.ExpressionFeatures`
  with the group's ``params`` (``features``, ``terms``, ``one_hot``);
* a *declared* group: a file ``conf/features/groups/<kind>.yaml`` of the package holding the same
  keys (``problem``, ``kernel``, ``interaction``, ...); see :func:`declared_groups`;
* a built-in Python group, a key of :data:`FEATURE_GROUPS`: what expressions cannot say (a
  minimum over the catalogue's tiles, the conv groups' shared estimates);
* ``package.module:Class``: any :class:`ckpred.features.base.FeatureGroup` subclass importable by
  that path — the extension point for an op's own Python group. Its ONNX converter needs
  nothing more (:func:`ckpred.export.converters.register_converters` registers every loaded
  subclass with skl2onnx's shared pair; a class needing its own graph sets ``onnx_converter``
  and ``onnx_shape_calculator``).

Nothing registers itself at import time: each name resolves when a feature set is built, so
the order in which modules are imported never matters. Kept free of heavy imports so the
config schema can validate ``kind`` values cheaply.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from ckpred.errors import ConfigValueError
from ckpred.plugins import check_allowed, import_named
from ckpred.schema.convert import yaml_mapping

#: ``kind`` of an inline expression group.
EXPRESSIONS = "expressions"
#: ``module:Class`` of the transformer of expression groups (inline and declared).
EXPRESSION_CLASS = "ckpred.features.expression:ExpressionFeatures"

#: Built-in Python groups: ``kind`` -> ``module:Class`` of its transformer.
FEATURE_GROUPS: dict[str, str] = {
    "roofline": "ckpred.features.roofline:RooflineFeatures",
    # grouped_conv_fwd (implicit-GEMM view of a convolution)
    "conv_problem": "ckpred.features.conv:ConvProblemFeatures",
    "conv_kernel": "ckpred.features.conv:ConvKernelFeatures",
    "conv_tile": "ckpred.features.conv:ConvTileFeatures",
    "conv_latency": "ckpred.features.conv:ConvLatencyFeatures",
}

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


@functools.lru_cache(maxsize=1)
def declared_groups() -> dict[str, dict[str, Any]]:
    """Declared groups of the package: ``kind`` -> its ``features``/``terms``/``one_hot``.

    Read once from ``conf/features/groups/*.yaml`` (package data of ``ckpred.conf``).
    """
    folder = resources.files("ckpred.conf") / "features" / "groups"
    groups: dict[str, dict[str, Any]] = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            groups[entry.name[: -len(".yaml")]] = yaml_mapping(entry.read_text())
    return groups


def known_kinds() -> list[str]:
    """Every short ``kind`` name (dotted paths come on top of these)."""
    return sorted({EXPRESSIONS, *FEATURE_GROUPS, *declared_groups()})


def is_dotted(kind: str) -> bool:
    """Whether ``kind`` has the ``package.module:Class`` form."""
    return bool(_DOTTED.match(kind))


def check_kind(key: str, kind: str) -> None:
    """Refuse a ``kind`` that is neither a known name nor a ``module:Class`` path, naming ``key``."""
    if kind in FEATURE_GROUPS or kind == EXPRESSIONS or kind in declared_groups():
        return
    if is_dotted(kind):
        check_allowed(kind, key, "a FeatureGroup subclass")  # refused here, at compose, without an import
        return
    raise ConfigValueError(key, kind, f"one of {known_kinds()} or 'package.module:Class' of a FeatureGroup")


def default_name(kind: str) -> str:
    """Name of a group in the FeatureUnion (prefix of its outputs) when the YAML sets none."""
    return kind.rpartition(":")[2] if is_dotted(kind) else kind


def _import(path: str, key: str) -> type:
    # lazy: ckpred.features.base imports scikit-learn (~1.5 s); the schema checks kinds without it
    from ckpred.features.base import FeatureGroup

    module_name = path.partition(":")[0]
    cls = import_named(path, key, "a FeatureGroup subclass")  # only an allowed module is imported
    if not (isinstance(cls, type) and issubclass(cls, FeatureGroup)):
        raise ConfigValueError(key, path, f"a ckpred.features.base.FeatureGroup subclass in module "
                                          f"{module_name!r} (found {type(cls).__name__ if cls is not None else 'nothing'})")
    return cls


def group_class(kind: str, *, key: str = "features.groups[].kind") -> type:
    """The transformer class of feature group ``kind``.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When ``kind`` is unknown, its module does not import or the name is not a FeatureGroup.
    """
    check_kind(key, kind)
    if kind in FEATURE_GROUPS:
        return _import(FEATURE_GROUPS[kind], key)
    if kind == EXPRESSIONS or kind in declared_groups():
        return _import(EXPRESSION_CLASS, key)
    return _import(kind, key)


def declaration(kind: str) -> dict[str, Any] | None:
    """The declared expressions of ``kind`` (a copy), or None for other kinds."""
    found = declared_groups().get(kind)
    return None if found is None else {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                                       for k, v in found.items()}
