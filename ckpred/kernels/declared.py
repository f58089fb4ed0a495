"""An op built from its YAML alone: :class:`DeclaredOp` and the compose-time checks of the op schema.

``conf/op/<name>.yaml`` (schema :class:`ckpred.schema.OpConfig`) declares the fields and their
kinds, the kernel id, the metric and its failure encoding, FLOPs/bytes and validity rules as
expressions (:mod:`ckpred.expressions`), problem families and the three keys (query, CV group,
breakdowns). :class:`DeclaredOp` turns that into an :class:`~ckpred.kernels.base.OpDefinition`:

* names are formatted and parsed by the kernel-id template (:mod:`ckpred.kernels.template`) or
  are the tuple ``(v1,v2,...)`` of the id fields;
* the candidate catalogue is the set of distinct kernel configurations of the training table
  (:meth:`DeclaredOp.catalogue_from_table`, sorted by field values so its hash depends on the
  set of kernels only, not on the table's row order), bound to the op with
  :meth:`DeclaredOp.bind_catalogue` and stored with the model;
* validity is the conjunction of the rules, in numpy for training and evaluation and in ONNX
  for the exported selector's mask (:meth:`DeclaredOp.validity_onnx`), from the same
  expressions; a row's reason is the message of the first rule it fails.

What data cannot say is a plug-in: ``plugin: package.module:Class`` names a subclass of
:class:`DeclaredOp` that overrides any of ``catalogue``, ``parse_name``, ``format_name``,
``validity`` (set ``validity_onnx = None`` with it to use a mask builder registered in
:mod:`ckpred.export.validity`), ``flops``, ``family`` and ``gemm_view``. The class is built
with the op's config, so it reads its fields and keys from the YAML like any other op.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ckpred.errors import ConfigValueError, KernelNameError
from ckpred.expressions import Expression
from ckpred.kernels.definition import ArchSpec, DtypeSpec, Field, LayoutSpec, OpDefinition, spec_name
from ckpred.kernels.opschema import (PLUGIN_HOOKS, _get, field_kinds, load_plugin, parse_expression, template_kinds,
                                     vars_of)
from ckpred.kernels.template import KernelTemplate
from ckpred.schema import OpConfig, RecipeConfig, arch_config, arch_constants
from ckpred.schema.convert import from_mapping, to_plain

class CatalogueUnavailable(ValueError):
    """A declared op without a plug-in catalogue has not been bound to one (no training table yet)."""


# ---------------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------------
def _field(name: str, spec: Any) -> Field:
    kind = str(_get(spec, "kind", "int"))
    values = tuple(str(v) for v in (_get(spec, "values") or ()))
    return Field(name, "category" if kind == "categorical" else kind, values, _get(spec, "default"))  # type: ignore[arg-type]


def op_config(cfg: OpConfig | Mapping[str, Any]) -> OpConfig:
    """``cfg`` (an :class:`OpConfig`, or a mapping of its keys) as a checked
    :class:`ckpred.schema.OpConfig`."""
    if isinstance(cfg, OpConfig):
        return cfg
    return from_mapping(OpConfig, {k: v for k, v in dict(cfg).items() if k != "defaults"}, missing_prefix="op.")


class DeclaredOp(OpDefinition):
    """An :class:`OpDefinition` built from an op config (see the module docstring).

    Parameters
    ----------
    cfg : OpConfig or mapping
        The op's config (``conf/op/<name>.yaml``), checked on construction.
    """

    #: Marks the class plug-ins subclass (:func:`ckpred.kernels.opschema.load_plugin` checks it).
    __ckpred_declared_op__ = True

    def __init__(self, cfg: OpConfig | Mapping[str, Any]) -> None:
        self.config = op_config(cfg)
        c = self.config
        self.name = c.name
        self.problem_fields = tuple(_field(n, s) for n, s in c.problem_fields.items())
        self.kernel_fields = tuple(_field(n, s) for n, s in c.kernel_fields.items())
        problem = tuple(c.problem_fields)
        self.group_key = tuple(c.keys.query) or problem
        self.cv_group_key = tuple(c.keys.cv_group) or self.group_key
        self.breakdowns = tuple(c.keys.breakdowns)
        self.absence = c.absence
        self._kinds = field_kinds(c)
        self._catalogue: pd.DataFrame | None = None
        if c.kernel_id.template:
            self.template: KernelTemplate | None = KernelTemplate(c.kernel_id.template, template_kinds(c),
                                                                  key="op.kernel_id.template")
        else:
            self.template = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- expressions ---------------------------------------------------------------------------
    @cached_property
    def categories(self) -> dict[str, tuple[str, ...]]:
        """Categorical field -> its values in code order (what expressions compare strings with)."""
        return {f.name: f.categories for f in self.problem_fields + self.kernel_fields if f.kind == "category"}

    @cached_property
    def rules(self) -> list[tuple[Any, str]]:
        """The validity rules as (parsed expression, message), in YAML order."""
        every = list(self._kinds)
        return [(parse_expression(r.expr, f"op.rules[{i}].expr", every, self._kinds, hw=True), r.message)
                for i, r in enumerate(self.config.rules)]

    def _problem_expression(self, key: str) -> Any:
        text = getattr(self.config, key) if key in ("flops", "bytes") else self.config.family.expr
        if not text:
            return None
        return parse_expression(text, f"op.{key}" if key != "family" else "op.family.expr",
                                list(self.problem_names), self._kinds, hw=False)

    def columns(self, frame: pd.DataFrame, names: Sequence[str]) -> dict[str, np.ndarray]:
        """float64 columns of ``names`` (categorical fields as their codes) for expressions."""
        out = {}
        for n in names:
            f = self.field(n)
            if n in frame:
                values = frame[n].to_numpy()
            elif f.default is not None:
                values = np.full(len(frame), f.default, dtype=object)
            else:
                raise KeyError(f"op {self.name!r}: the table has no column {n!r} (columns: {list(frame.columns)})")
            out[n] = f.encode(values).astype(np.float64) if f.kind in ("category", "bool") \
                else np.asarray(values, dtype=np.float64)
        return out

    def _evaluate(self, expr: Expression, frame: pd.DataFrame, hw: Mapping[str, float] | None = None) -> np.ndarray:
        from ckpred.features.base import NumpyOps  # lazy: it imports scikit-learn (~1.5 s), ingesting needs neither

        cols = self.columns(frame, sorted(expr.names))
        out = expr.evaluate(cols, hw or {}, NumpyOps(len(frame)), categories=self.categories)
        return np.asarray(out, dtype=np.float64)

    @staticmethod
    def hardware(arch: ArchSpec | None) -> dict[str, float]:
        """``hw.<name>`` constants of ``arch``: an arch config, a packaged arch's name, or None (none)."""
        if arch is None:
            return {}
        return arch_constants(arch_config(arch) if isinstance(arch, str) else arch)

    # -- names ---------------------------------------------------------------------------------
    def parse_name(self, name: str) -> dict[str, Any]:
        if self.template is not None:
            return self.template.parse(name)
        fields = list(self.config.kernel_id.fields)
        if not isinstance(name, str) or not (name.startswith("(") and name.endswith(")")):
            raise KernelNameError(str(name), f"expected a tuple '(v1,v2,...)' of {fields}")
        parts = [p.strip() for p in name[1:-1].split(",")]
        if len(parts) != len(fields):
            raise KernelNameError(name, f"expected {len(fields)} values {fields}, got {len(parts)}")
        out: dict[str, Any] = {}
        for f, text in zip(fields, parts):
            kind, values = self._kinds[f]
            try:
                out[f] = (int(text) if kind == "int" else float(text) if kind == "float"
                          else {"True": True, "False": False, "true": True, "false": False, "1": True,
                                "0": False}[text] if kind == "bool" else text)
            except (ValueError, KeyError):
                raise KernelNameError(name, f"{f}={text!r} is not a {kind}") from None
            if kind == "categorical" and text not in values:
                raise KernelNameError(name, f"{f}={text!r} not in {list(values)}")
        return out

    @cached_property
    def _kernel_defaults(self) -> dict[str, Any]:
        """Kernel field -> its default, for the fields that have one."""
        return {f.name: f.default for f in self.kernel_fields if f.default is not None}

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str = "", layout: str = "") -> str:
        values = dict(self._kernel_defaults)
        values.update(kernel)
        if self.template is not None:
            # The run's dtype/layout name the kernel even when the mapping carries parsed ones.
            dtype, layout = getattr(dtype, "name", dtype), getattr(layout, "name", layout)
            if dtype:
                values["dtype"] = dtype
            if layout:
                values["layout"] = layout
            return self.template.format(values)
        parts = []
        for f in self.config.kernel_id.fields:
            kind = self._kinds[f][0]
            v = values[f]
            parts.append(str(int(v)) if kind == "int" else str(bool(v)) if kind == "bool" else str(v))
        return "(" + ",".join(parts) + ")"

    # -- candidate space -----------------------------------------------------------------------
    def catalogue_from_table(self, table: pd.DataFrame, *, dtype: DtypeSpec = "", layout: LayoutSpec = "") -> pd.DataFrame:
        """The distinct kernel configurations of ``table`` as a catalogue.

        Rows are sorted by kernel field values (categoricals by code, in the YAML's field
        order), so the same set of kernels gives the same ids and hash whatever the table's
        row order; names are formatted by the kernel id.
        """
        names = list(self.kernel_names)
        missing = [n for n in names if n not in table]
        if missing:
            raise KeyError(f"op {self.name!r}: the table has no kernel field column(s) {missing}")
        kernels = table[names].drop_duplicates()
        order = np.lexsort([self.field(n).encode(kernels[n].to_numpy()) if self.field(n).kind != "float"
                            else kernels[n].to_numpy(np.float64) for n in reversed(names)])
        frame = kernels.iloc[order].reset_index(drop=True)
        dtype_name, layout_name = spec_name(dtype), spec_name(layout)
        frame.insert(0, "kernel_name", [self.format_name(r, dtype=dtype_name, layout=layout_name)
                                        for r in frame.to_dict("records")])
        frame.insert(0, "kernel_id", np.arange(len(frame), dtype=np.int64))
        return frame

    @property
    def plugin_hooks(self) -> tuple[str, ...]:
        """The hooks (:data:`~ckpred.kernels.opschema.PLUGIN_HOOKS`) the op's plug-in overrides."""
        own = vars_of(type(self))
        return tuple(h for h in PLUGIN_HOOKS if h in own)

    @property
    def catalogue_from_data(self) -> bool:
        """True when the candidate set is learned from the training table (no plug-in catalogue)."""
        return "catalogue" not in vars_of(type(self))

    def config_section(self) -> dict[str, Any]:
        """The op config as plain data (stored in model manifests, so a runtime rebuilds the op)."""
        plain: dict[str, Any] = to_plain(self.config)
        return plain

    def bind_catalogue(self, catalogue: pd.DataFrame) -> None:
        """Use ``catalogue`` (e.g. from :meth:`catalogue_from_table` or a model's manifest) as
        the op's candidate set from now on."""
        self._catalogue = catalogue.reset_index(drop=True)

    def catalogue(self, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec) -> pd.DataFrame:
        # the bound catalogue holds for every arch, dtype and layout the table was trained on
        if self._catalogue is None:
            raise CatalogueUnavailable(
                f"op {self.name!r} has no catalogue yet: it is the set of kernels of the training table "
                f"(DeclaredOp.catalogue_from_table + bind_catalogue), or a plugin's catalogue()")
        return self._catalogue

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: ArchSpec | None = None, dtype: DtypeSpec | None = None,
                 layout: LayoutSpec | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The rules, row by row; ``reason`` = the message of the first rule a row fails."""
        n = len(problems)
        reason = np.full(n, "", dtype=object)
        if not self.rules:
            return np.ones(n, dtype=bool), reason
        hw = self.hardware(arch) if any(e.hw_names for e, _ in self.rules) else {}
        problem_names = set(self.problem_names)
        frame = pd.DataFrame({c: (problems if c in problem_names else kernels)[c].to_numpy()
                              for c in self._kinds if c in (problems if c in problem_names else kernels)})
        from ckpred.features.base import NumpyOps  # lazy: it imports scikit-learn (~1.5 s), ingesting needs neither

        for expr, message in self.rules:
            if expr.hw_names and not hw:
                raise ValueError(f"op {self.name!r}: rule {expr.text!r} reads hw constants; pass the arch")
            ok = expr.evaluate_bool(self.columns(frame, sorted(expr.names)), hw, NumpyOps(n),
                                    categories=self.categories)
            ok = np.broadcast_to(np.asarray(ok, dtype=bool), (n,))
            reason[~ok & (reason == "")] = message
        return reason == "", reason

    # -- problems ------------------------------------------------------------------------------
    def flops(self, problems: pd.DataFrame) -> np.ndarray:
        expr = self._problem_expression("flops")
        if expr is None:
            return np.full(len(problems), np.nan)
        return self._evaluate(expr, problems)

    def bytes(self, problems: pd.DataFrame) -> np.ndarray:
        """Bytes moved by each problem (``op.bytes``); NaN when the op declares none."""
        expr = self._problem_expression("bytes")
        if expr is None:
            return np.full(len(problems), np.nan)
        return self._evaluate(expr, problems)

    @property
    def families(self) -> tuple[str, ...]:  # type: ignore[override]
        """Labels of :meth:`family`: the product of the breakdown fields' values (one label
        ``all`` without breakdowns)."""
        labels: list[tuple[str, ...]] = [()]
        for b in self.breakdowns:
            if b == "family":
                values: tuple[str, ...] = tuple(self.config.family.labels)
            elif self.field(b).kind == "bool":
                values = ("False", "True")
            else:
                values = self.field(b).categories
            labels = [prev + (v,) for prev in labels for v in values]
        return tuple("/".join(lab) for lab in labels) if self.breakdowns else ("all",)

    def family(self, problems: pd.DataFrame) -> np.ndarray:
        """Breakdown label of each problem (``keys.breakdowns`` values joined by ``/``)."""
        if not self.breakdowns:
            return np.full(len(problems), "all", dtype=object)
        parts = []
        for b in self.breakdowns:
            if b == "family":
                value = self._evaluate(self._problem_expression("family"), problems)
                labels = np.asarray(self.config.family.labels, dtype=object)
                parts.append(labels[np.searchsorted(np.asarray(self.config.family.bounds, dtype=np.float64),
                                                    value, side="right")])
            else:
                parts.append(problems[b].astype(str).to_numpy(dtype=object))
        out = parts[0]
        for p in parts[1:]:
            out = out + "/" + p
        return np.asarray(out, dtype=object)


def bind_training_catalogue(op: OpDefinition, table: pd.DataFrame, cfg: RecipeConfig) -> None:
    """Bind a data-catalogue op to the kernels of its training ``table`` (no-op for other ops).

    Called by the commands that fit a model on ``table`` (train, export) before anything asks
    the op for its catalogue; a model's manifest stores the catalogue, and the runtime binds
    that one.
    """
    if isinstance(op, DeclaredOp) and op.catalogue_from_data:
        op.bind_catalogue(op.catalogue_from_table(table, dtype=cfg.dtype, layout=cfg.layout))


def load_declared(cfg: OpConfig | Mapping[str, Any]) -> DeclaredOp:
    """The op of an op config: its plug-in class when ``plugin`` is set, else :class:`DeclaredOp`."""
    plugin = _get(cfg, "plugin")
    cls = load_plugin(plugin) if plugin else DeclaredOp
    return cls(cfg)
