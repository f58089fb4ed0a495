"""Loading an op: the :class:`OpDefinition` of a composed ``op`` config or an op's name.

The op definition contract itself (:class:`Field`, :class:`OpDefinition`) is
:mod:`ckpred.kernels.definition`; it is imported here too, its historical home, so
``from ckpred.kernels.base import OpDefinition, load_op`` keeps working.
"""

from __future__ import annotations

import importlib
import json
from importlib import resources
from typing import Any, Mapping, cast

from ckpred.errors import ConfigValueError
from ckpred.kernels.declared import load_declared, op_config
from ckpred.kernels.definition import ArchSpec, DtypeSpec, Field, FieldKind, LayoutSpec, OpDefinition
from ckpred.schema import OpConfig
from ckpred.schema.convert import to_plain, yaml_mapping

__all__ = ["ArchSpec", "DtypeSpec", "Field", "FieldKind", "LayoutSpec", "OpDefinition", "load_op",
           "packaged_op_config"]

_LOADED: dict[str, OpDefinition] = {}


def packaged_op_config(name: str) -> Any:
    """The packaged ``conf/op/<name>.yaml`` as a plain mapping, or ``None`` when there is none."""
    entry = resources.files("ckpred.conf") / "op" / f"{name}.yaml"
    if not entry.is_file():
        return None
    raw = yaml_mapping(entry.read_text())
    return {k: v for k, v in raw.items() if k != "defaults"}


def load_op(op_cfg: OpConfig | Mapping[str, Any] | str) -> OpDefinition:
    """The op of a composed ``op`` config (or a packaged op's name, or a legacy module path).

    A declared op (``conf/op/<name>.yaml`` with fields; see :mod:`ckpred.kernels.declared`) is
    built once per distinct config and reused, so a catalogue bound to it stays bound. A
    string without a dot is a packaged op's name; a dotted string, or a config with a
    ``module`` key, names a module exposing ``OP`` (the pre-declarative form, still read).
    """
    if isinstance(op_cfg, str) and "." not in op_cfg:
        declared = packaged_op_config(op_cfg)
        op_cfg = declared if declared is not None else f"ckpred.kernels.{op_cfg}"
    if isinstance(op_cfg, Mapping) and "module" in op_cfg:
        op_cfg = op_cfg["module"]
    if not isinstance(op_cfg, str):
        checked = op_config(op_cfg)
        key = json.dumps(to_plain(checked), sort_keys=True, default=str)
        if key not in _LOADED:
            _LOADED[key] = load_declared(checked)
        return _LOADED[key]
    try:
        module = importlib.import_module(op_cfg)
    except ImportError as exc:
        raise ConfigValueError("op.module", op_cfg, f"an importable module ({exc})") from exc
    op = getattr(module, "OP", None)
    if not isinstance(op, OpDefinition):
        raise ConfigValueError("op.module", op_cfg, "a module exposing OP = <OpDefinition>")
    return op
