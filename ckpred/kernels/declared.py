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

import importlib
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ckpred.errors import ConfigValueError, KernelNameError
from ckpred.kernels.base import Field, OpDefinition
from ckpred.kernels.template import KernelTemplate, check_round_trip

#: Canonical-table columns an op field may not be named after.
RESERVED_NAMES: tuple[str, ...] = ("hw", "kernel_name", "kernel_id", "tflops", "latency_ms", "is_valid",
                                   "invalid_reason", "op", "arch", "family", "shape", "perf")
#: Hooks a plug-in class may override (documented in docs/ops.md).
PLUGIN_HOOKS: tuple[str, ...] = ("catalogue", "parse_name", "format_name", "validity", "validity_onnx", "flops",
                                 "family", "gemm_view")


class CatalogueUnavailable(ValueError):
    """A declared op without a plug-in catalogue has not been bound to one (no training table yet)."""


# ---------------------------------------------------------------------------------------------
# Compose-time checks
# ---------------------------------------------------------------------------------------------
def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def field_kinds(cfg: Any) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Field name -> (kind, categorical values as strings) of every problem and kernel field."""
    out = {}
    for group in ("problem_fields", "kernel_fields"):
        for name, spec in (_get(cfg, group) or {}).items():
            out[str(name)] = (str(_get(spec, "kind", "int")), tuple(str(v) for v in (_get(spec, "values") or ())))
    return out


def _check_fields(cfg: Any) -> None:
    from ckpred.schema import FIELD_KINDS, check

    seen: dict[str, str] = {}
    for group in ("problem_fields", "kernel_fields"):
        specs = _get(cfg, group) or {}
        check(f"op.{group}", dict(specs), len(specs) > 0 or _get(cfg, "plugin"),
              "a non-empty mapping of field name -> {kind: int|float|categorical|bool}")
        for name, spec in specs.items():
            key = f"op.{group}.{name}"
            check(key, name, str(name).isidentifier() and name not in RESERVED_NAMES,
                  f"an identifier that is not one of the canonical columns {list(RESERVED_NAMES)}")
            check(key, name, name not in seen, f"a name used once across problem and kernel fields "
                                               f"(already in op.{seen.get(name)})")
            seen[name] = group
            kind, values, default = _get(spec, "kind"), list(_get(spec, "values") or []), _get(spec, "default")
            check(f"{key}.kind", kind, kind in FIELD_KINDS, f"one of {list(FIELD_KINDS)}")
            if kind == "categorical":
                check(f"{key}.values", values, len(values) > 0 and all(isinstance(v, str) for v in values),
                      "a non-empty list of strings (the allowed values, in code order)")
                check(f"{key}.values", values, len(set(values)) == len(values), "values listed once each")
                check(f"{key}.default", default, default is None or default in values, f"null or one of {values}")
            else:
                check(f"{key}.values", values, not values, f"no values for kind={kind} (only categorical fields list them)")
                ok = (default is None or (kind == "bool" and isinstance(default, bool))
                      or (kind == "int" and isinstance(default, int) and not isinstance(default, bool))
                      or (kind == "float" and isinstance(default, (int, float)) and not isinstance(default, bool)))
                check(f"{key}.default", default, ok, f"null or a value of kind {kind}")


def _template_kinds(cfg: Any) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Names a kernel-id template may use: kernel fields, categorical problem fields, and the
    run's ``dtype``/``layout`` when no field has those names."""
    from ckpred.schema import DTYPES, LAYOUTS

    kinds = field_kinds(cfg)
    problem = set((_get(cfg, "problem_fields") or {}).keys())
    allowed = {n: k for n, k in kinds.items() if n not in problem or k[0] == "categorical"}
    allowed.setdefault("dtype", ("categorical", DTYPES))
    allowed.setdefault("layout", ("categorical", LAYOUTS))
    return allowed


def _check_kernel_id(cfg: Any, plugin: type | None) -> None:
    from ckpred.schema import check

    kid = _get(cfg, "kernel_id")
    template, fields = _get(kid, "template") or "", list(_get(kid, "fields") or [])
    kernel = list((_get(cfg, "kernel_fields") or {}).keys())
    names_by_plugin = plugin is not None and all(h in vars_of(plugin) for h in ("parse_name", "format_name"))
    if template and fields:
        raise ConfigValueError("op.kernel_id", {"template": template, "fields": fields},
                               "either a template or a list of fields, not both")
    if not template and not fields:
        check("op.kernel_id", {}, names_by_plugin,
              "a template (kernel_id.template) or a tuple of fields (kernel_id.fields), unless the plugin "
              "defines parse_name and format_name")
        return
    if fields:
        for i, name in enumerate(fields):
            check(f"op.kernel_id.fields[{i}]", name, name in kernel, f"a kernel field: {kernel}")
        missing = [n for n in kernel if n not in fields]
        check("op.kernel_id.fields", fields, not missing and len(set(fields)) == len(fields),
              f"every kernel field once (missing {missing}): a name identifies one kernel")
        return
    tpl = KernelTemplate(template, _template_kinds(cfg), key="op.kernel_id.template")
    missing = [n for n in kernel if n not in tpl.names]
    check("op.kernel_id.template", template, not missing,
          f"a template using every kernel field (missing {missing}): a name identifies one kernel")
    check_round_trip(tpl)


def vars_of(cls: type) -> set[str]:
    """Attributes defined by ``cls`` or its bases below :class:`DeclaredOp` (a plug-in's hooks)."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if klass in (DeclaredOp, OpDefinition, object):
            break
        out.update(vars(klass))
    return out


def load_plugin(spec: str, key: str = "op.plugin") -> type:
    """Import ``package.module:Class`` and check it is a :class:`DeclaredOp` subclass."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise ConfigValueError(key, spec, "'package.module:Class' (a DeclaredOp subclass)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigValueError(key, spec, f"an importable module ({exc})") from None
    obj = getattr(module, attr, None)
    if not (isinstance(obj, type) and issubclass(obj, DeclaredOp)):
        raise ConfigValueError(key, spec, f"a subclass of ckpred.kernels.declared.DeclaredOp in {module_name} "
                                          f"(found {type(obj).__name__ if obj is not None else 'nothing'})")
    return obj


def parse_expression(text: Any, key: str, fields: Sequence[str], kinds: Mapping[str, tuple[str, tuple[str, ...]]],
                     *, hw: bool) -> Any:
    """Parse ``text`` and check its names: ``fields`` (+ ``hw.<constant>`` when ``hw``)."""
    from ckpred import expressions
    from ckpred.schema import arch_constant_names

    categories = {n: v for n, (k, v) in kinds.items() if k == "categorical"}
    expr = expressions.parse(text, key=key)
    return expr.validate(fields, arch_constant_names() if hw else (), categories=categories)


def _check_expressions(cfg: Any) -> None:
    from ckpred.schema import check

    kinds = field_kinds(cfg)
    problem = list((_get(cfg, "problem_fields") or {}).keys())
    every = list(kinds)
    for key in ("flops", "bytes"):
        text = _get(cfg, key)
        if text is not None:
            parse_expression(text, f"op.{key}", problem, kinds, hw=False)
    for i, rule in enumerate(_get(cfg, "rules") or []):
        parse_expression(_get(rule, "expr"), f"op.rules[{i}].expr", every, kinds, hw=True)
        message = _get(rule, "message")
        check(f"op.rules[{i}].message", message, isinstance(message, str) and bool(message.strip()),
              "a non-empty message saying why a kernel is invalid where the rule fails")
    fam = _get(cfg, "family")
    if fam is not None and _get(fam, "expr"):
        parse_expression(_get(fam, "expr"), "op.family.expr", problem, kinds, hw=False)
        bounds, labels = list(_get(fam, "bounds") or []), list(_get(fam, "labels") or [])
        check("op.family.bounds", bounds, len(bounds) > 0 and all(a < b for a, b in zip(bounds, bounds[1:])),
              "a non-empty ascending list of bin edges")
        check("op.family.labels", labels, len(labels) == len(bounds) + 1 and len(set(labels)) == len(labels),
              f"{len(bounds) + 1} distinct labels (one more than bounds)")
    elif fam is not None:
        check("op.family", dict(bounds=list(_get(fam, "bounds") or []), labels=list(_get(fam, "labels") or [])),
              not _get(fam, "bounds") and not _get(fam, "labels"), "bounds and labels only with family.expr")


def _check_keys(cfg: Any) -> None:
    from ckpred.schema import check

    kinds = field_kinds(cfg)
    problem = list((_get(cfg, "problem_fields") or {}).keys())
    keys = _get(cfg, "keys")
    query = list(_get(keys, "query") or [])
    for name, values in (("query", query), ("cv_group", list(_get(keys, "cv_group") or []))):
        for i, f in enumerate(values):
            check(f"op.keys.{name}[{i}]", f, f in problem, f"a problem field: {problem}")
        check(f"op.keys.{name}", values, len(set(values)) == len(values), "each field once")
    cv_group = list(_get(keys, "cv_group") or [])
    effective = query or problem
    for i, f in enumerate(cv_group):
        check(f"op.keys.cv_group[{i}]", f, f in effective,
              f"a field of the query key {effective}: a fold must hold a whole query")
    has_family = bool(_get(_get(cfg, "family") or {}, "expr"))
    allowed = [n for n in problem if kinds[n][0] in ("categorical", "bool")] + (["family"] if has_family else [])
    for i, f in enumerate(_get(keys, "breakdowns") or []):
        check(f"op.keys.breakdowns[{i}]", f, f in allowed,
              f"a categorical or bool problem field, or 'family' when op.family is declared: {allowed}")


def _check_metric(cfg: Any) -> None:
    from ckpred.schema import FAILURE_VALUES, THROUGHPUT_UNITS, TIME_UNITS, check

    metric = _get(cfg, "metric")
    column, better, unit = _get(metric, "column"), _get(metric, "better"), _get(metric, "unit")
    check("op.metric.column", column, isinstance(column, str) and bool(column), "a column name")
    check("op.metric.better", better, better in ("lower", "higher"), "'lower' (a time) or 'higher' (a throughput)")
    units = TIME_UNITS if better == "lower" else THROUGHPUT_UNITS
    check("op.metric.unit", unit, unit in units, f"for better={better}: one of {list(units)}")
    failure = _get(cfg, "failure")
    for i, v in enumerate(_get(failure, "metric_values") or []):
        check(f"op.failure.metric_values[{i}]", v, v in FAILURE_VALUES, f"one of {list(FAILURE_VALUES)}")
    true_values = [str(v).lower() for v in _get(failure, "true_values") or []]
    false_values = [str(v).lower() for v in _get(failure, "false_values") or []]
    if _get(failure, "valid_column"):
        check("op.failure.true_values", true_values, bool(true_values), "a non-empty list of strings")
        check("op.failure.false_values", false_values, bool(false_values), "a non-empty list of strings")
    both = sorted(set(true_values) & set(false_values))
    check("op.failure.false_values", both, not both, "strings not also listed in true_values")


def _check_input(cfg: Any) -> None:
    from ckpred import expressions
    from ckpred.schema import check

    spec = _get(cfg, "input")
    if spec is None:
        return
    fmt = _get(spec, "format")
    check("op.input.format", fmt, isinstance(fmt, str) and bool(fmt), "'auto' or a registered reader's name")
    for name, source in (_get(spec, "columns") or {}).items():
        key = f"op.input.columns.{name}"
        check(key, name, str(name).isidentifier(), "a canonical column name (an identifier)")
        if isinstance(source, str):
            check(key, source, bool(source), "a source column name, {value: <constant>} or {expr: <expression>}")
            continue
        keys = sorted(source.keys()) if isinstance(source, Mapping) else None
        check(key, source, keys in (["value"], ["expr"]),
              "a source column name, {value: <constant>} or {expr: <expression>}")
        if keys == ["expr"]:
            expressions.parse(source["expr"], key=f"{key}.expr")


def validate_op_config(cfg: Any) -> None:
    """Every compose-time check of an op config (:class:`ckpred.schema.OpConfig` or a mapping).

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming the key (``op.rules[2].expr``, ``op.kernel_id.template``...), the bad value and
        what is allowed: an unknown field in an expression, a wrong kind, a template that does
        not round-trip, a key field that is not a problem field...
    """
    from ckpred.schema import check

    name = _get(cfg, "name")
    check("op.name", name, isinstance(name, str) and name.replace("-", "_").isidentifier(),
          "an op name (letters, digits, '_' or '-')")
    plugin = load_plugin(_get(cfg, "plugin")) if _get(cfg, "plugin") else None
    _check_fields(cfg)
    _check_kernel_id(cfg, plugin)
    _check_metric(cfg)
    _check_expressions(cfg)
    _check_keys(cfg)
    _check_input(cfg)


# ---------------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------------
def _field(name: str, spec: Any) -> Field:
    kind = str(_get(spec, "kind", "int"))
    values = tuple(str(v) for v in (_get(spec, "values") or ()))
    return Field(name, "category" if kind == "categorical" else kind, values, _get(spec, "default"))  # type: ignore[arg-type]


def op_config(cfg: Any) -> Any:
    """``cfg`` (a composed ``op`` node, a mapping, or an :class:`OpConfig`) as a checked
    :class:`ckpred.schema.OpConfig`."""
    from omegaconf import DictConfig, OmegaConf

    from ckpred.config import to_object
    from ckpred.schema import OpConfig

    if isinstance(cfg, OpConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = {k: v for k, v in dict(cfg).items() if k != "defaults"}
    return to_object(OmegaConf.merge(OmegaConf.structured(OpConfig), cfg))


class DeclaredOp(OpDefinition):
    """An :class:`OpDefinition` built from an op config (see the module docstring).

    Parameters
    ----------
    cfg : OpConfig, DictConfig or mapping
        The op's config (``conf/op/<name>.yaml``), checked on construction.
    """

    def __init__(self, cfg: Any) -> None:
        self.config = op_config(cfg)
        c = self.config
        self.name = c.name
        self.problem_fields = tuple(_field(n, s) for n, s in c.problem_fields.items())
        self.kernel_fields = tuple(_field(n, s) for n, s in c.kernel_fields.items())
        problem = tuple(c.problem_fields)
        self.group_key = tuple(c.keys.query) or problem
        self.cv_group_key = tuple(c.keys.cv_group) or self.group_key
        self.breakdowns = tuple(c.keys.breakdowns)
        self._kinds = field_kinds(c)
        self._catalogue: pd.DataFrame | None = None
        if c.kernel_id.template:
            self.template: KernelTemplate | None = KernelTemplate(c.kernel_id.template, _template_kinds(c),
                                                                  key="op.kernel_id.template")
        else:
            self.template = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- expressions ---------------------------------------------------------------------------
    @cached_property
    def _categories(self) -> dict[str, tuple[str, ...]]:
        return {f.name: f.categories for f in self.problem_fields + self.kernel_fields if f.kind == "category"}

    @cached_property
    def _rules(self) -> list[tuple[Any, str]]:
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

    def _evaluate(self, expr: Any, frame: pd.DataFrame, hw: Mapping[str, float] | None = None) -> np.ndarray:
        from ckpred.features.base import NumpyOps

        cols = self.columns(frame, sorted(expr.names))
        out = expr.evaluate(cols, hw or {}, NumpyOps(len(frame)), categories=self._categories)
        return np.asarray(out, dtype=np.float64)

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

    def format_name(self, kernel: Mapping[str, Any], *, dtype: str = "", layout: str = "") -> str:
        defaults = {f.name: f.default for f in self.kernel_fields if f.default is not None}
        kernel = {**defaults, **dict(kernel)}
        if self.template is not None:
            context = {"dtype": getattr(dtype, "name", dtype), "layout": getattr(layout, "name", layout)}
            return self.template.format({**context, **kernel})
        parts = []
        for f in self.config.kernel_id.fields:
            kind = self._kinds[f][0]
            v = kernel[f]
            parts.append(str(int(v)) if kind == "int" else str(bool(v)) if kind == "bool" else str(v))
        return "(" + ",".join(parts) + ")"

    # -- candidate space -----------------------------------------------------------------------
    def catalogue_from_table(self, table: pd.DataFrame, *, dtype: Any = "", layout: Any = "") -> pd.DataFrame:
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
        dtype_name, layout_name = getattr(dtype, "name", dtype), getattr(layout, "name", layout)
        frame.insert(0, "kernel_name", [self.format_name(r, dtype=dtype_name, layout=layout_name)
                                        for r in frame.to_dict("records")])
        frame.insert(0, "kernel_id", np.arange(len(frame), dtype=np.int64))
        return frame

    def bind_catalogue(self, catalogue: pd.DataFrame) -> None:
        """Use ``catalogue`` (e.g. from :meth:`catalogue_from_table` or a model's manifest) as
        the op's candidate set from now on."""
        self._catalogue = catalogue.reset_index(drop=True)

    def catalogue(self, arch: Any = None, dtype: Any = None, layout: Any = None) -> pd.DataFrame:
        if self._catalogue is None:
            raise CatalogueUnavailable(
                f"op {self.name!r} has no catalogue yet: it is the set of kernels of the training table "
                f"(DeclaredOp.catalogue_from_table + bind_catalogue), or a plugin's catalogue()")
        return self._catalogue

    def validity(self, problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: Any = None, dtype: Any = None,
                 layout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The rules, row by row; ``reason`` = the message of the first rule a row fails."""
        from ckpred.schema import arch_constants

        n = len(problems)
        reason = np.full(n, "", dtype=object)
        if not self._rules:
            return np.ones(n, dtype=bool), reason
        problem_names = set(self.problem_names)
        frame = pd.DataFrame({c: (problems if c in problem_names else kernels)[c].to_numpy()
                              for c in self._kinds if c in (problems if c in problem_names else kernels)})
        hw = arch_constants(arch) if arch is not None and not isinstance(arch, str) else {}
        from ckpred.features.base import NumpyOps

        for expr, message in self._rules:
            if expr.hw_names and not hw:
                raise ValueError(f"op {self.name!r}: rule {expr.text!r} reads hw constants; pass the arch config")
            ok = expr.evaluate_bool(self.columns(frame, sorted(expr.names)), hw, NumpyOps(n),
                                    categories=self._categories)
            ok = np.broadcast_to(np.asarray(ok, dtype=bool), (n,))
            reason[~ok & (reason == "")] = message
        return reason == "", reason

    def validity_onnx(self, g: Any, problem: str, catalogue: pd.DataFrame, *, arch: Any = None,
                      dtype: Any = None, layout: Any = None) -> str:
        """The rules as a bool ``[B, C]`` ONNX mask: the same expressions as :meth:`validity`,
        walked with the selector's :class:`ckpred.export.factorise.HybridOps` (kernel fields
        are catalogue constants, problem fields the ``[B, P]`` input)."""
        from onnx import TensorProto

        from ckpred.export.factorise import HybridOps, _static
        from ckpred.schema import arch_constants

        ops = HybridOps(g)
        n_kernels = len(catalogue)
        problem3 = g.op("Unsqueeze", g.op("Cast", problem, to=TensorProto.DOUBLE), g.const([1], dtype=np.int64))
        columns: dict[str, Any] = {}
        for j, name in enumerate(self.problem_names):  # [B, 1, 1]
            columns[name] = ops.symbol(g.op("Gather", problem3, g.const([j], dtype=np.int64), axis=2))
        kernel_cols = self.columns(catalogue, self.kernel_names)
        for name, values in kernel_cols.items():  # [1, C, 1]
            columns[name] = values.reshape(1, n_kernels, 1)
        hw = arch_constants(arch) if arch is not None and not isinstance(arch, str) else {}
        valid: Any = np.ones((1, n_kernels, 1), dtype=bool)
        for expr, _ in self._rules:
            ok = expr.evaluate_bool({n: columns[n] for n in expr.names}, hw, ops, categories=self._categories)
            if isinstance(ok, (bool, np.bool_)):
                ok = np.full((1, 1, 1), bool(ok))
            valid = ops.logical_and(valid, ok)
        b = g.op("Slice", g.op("Shape", problem), g.const([0], dtype=np.int64), g.const([1], dtype=np.int64))
        target = g.op("Concat", b, g.const([n_kernels, 1], dtype=np.int64), axis=0)
        if _static(valid):
            name = g.const(np.broadcast_to(np.asarray(valid, dtype=bool), (1, n_kernels, 1)).copy(), "rules_valid",
                           dtype=bool)
        else:
            name = g.op("Cast", valid.name, to=TensorProto.BOOL)
        full = g.op("Expand", name, target)
        return g.op("Reshape", full, g.const([-1, n_kernels], dtype=np.int64))

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
        labels = [()]
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


def load_declared(cfg: Any) -> DeclaredOp:
    """The op of an op config: its plug-in class when ``plugin`` is set, else :class:`DeclaredOp`."""
    plugin = _get(cfg, "plugin")
    cls = load_plugin(plugin) if plugin else DeclaredOp
    return cls(cfg)
