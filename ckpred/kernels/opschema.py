"""Compose-time checks of an op config (:class:`ckpred.schema.OpConfig`).

Kept apart from :mod:`ckpred.kernels.declared` so the schema can run them when a config is
composed without importing the op machinery: every check raises
:class:`~ckpred.errors.ConfigValueError` naming the key (``op.rules[2].expr``,
``op.kernel_id.template``...), the bad value and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ckpred import expressions
from ckpred.errors import ConfigValueError, check
from ckpred.hardware import arch_constant_names, dtype_names, layout_names
from ckpred.kernels.template import KernelTemplate, check_round_trip
from ckpred.plugins import import_named
from ckpred.util import to_float, to_int, truth

#: Kinds of an op field. ``categorical`` fields hold one of ``values`` (encoded as its index).
FIELD_KINDS: tuple[str, ...] = ("int", "float", "categorical", "bool")
#: Metric units, as the factor to the canonical unit: times to milliseconds, throughputs to TFLOPS.
TIME_UNITS: dict[str, float] = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
THROUGHPUT_UNITS: dict[str, float] = {"tflops": 1.0, "gflops": 1e-3, "mflops": 1e-6, "flops": 1e-12}
#: How a failed measurement may be written in the metric column.
FAILURE_VALUES: tuple[str, ...] = ("inf", "nan", "missing", "zero", "negative")
#: What a (problem, kernel) pair the table holds no row for means (``op.absence``): ``unknown``
#: (a full sweep: every rule-valid catalogue kernel is a candidate, and a pick without a row is
#: an unmeasured pick) or ``not_applicable`` (a find-db, a pruned sweep: the kernels a problem
#: has no row for do not apply to it; the selector learns an applicability mask).
ABSENCE: tuple[str, ...] = ("unknown", "not_applicable")
#: Names a kernel-id template may use besides the op's fields (the run's dtype and layout).
TEMPLATE_CONTEXT: tuple[str, ...] = ("dtype", "layout")

#: An op config: a :class:`ckpred.schema.OpConfig` or a mapping of its keys, read through :func:`_get`
#: (the schema runs these checks, so this module does not import it: no import cycle).
OpConfigLike = object

#: Canonical-table columns an op field may not be named after.
RESERVED_NAMES: tuple[str, ...] = ("hw", "kernel_name", "kernel_id", "tflops", "latency_ms", "is_valid",
                                   "invalid_reason", "op", "arch", "family", "shape", "perf")
#: Hooks a plug-in class may override (documented in docs/ops.md).
PLUGIN_HOOKS: tuple[str, ...] = ("catalogue", "parse_name", "format_name", "validity", "validity_onnx", "flops",
                                 "family", "gemm_view")


# ---------------------------------------------------------------------------------------------
# Compose-time checks
# ---------------------------------------------------------------------------------------------
def _get(cfg: OpConfigLike, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def field_kinds(cfg: OpConfigLike) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Field name -> (kind, categorical values as strings) of every problem and kernel field."""
    out = {}
    for group in ("problem_fields", "kernel_fields"):
        for name, spec in (_get(cfg, group) or {}).items():
            out[str(name)] = (str(_get(spec, "kind", "int")), tuple(str(v) for v in (_get(spec, "values") or ())))
    return out


def _check_fields(cfg: OpConfigLike) -> None:

    seen: dict[str, str] = {}
    for group in ("problem_fields", "kernel_fields"):
        specs = _get(cfg, group) or {}
        check(f"op.{group}", dict(specs), len(specs) > 0 or _get(cfg, "plugin"),
              "a non-empty mapping of field name -> {kind: int|categorical|bool}")
        for name, spec in specs.items():
            key = f"op.{group}.{name}"
            check(key, name, str(name).isidentifier() and name not in RESERVED_NAMES,
                  f"an identifier that is not one of the canonical columns {list(RESERVED_NAMES)}")
            check(key, name, name not in seen, f"a name used once across problem and kernel fields "
                                               f"(already in op.{seen.get(name)})")
            seen[name] = group
            kind, values, default = _get(spec, "kind"), list(_get(spec, "values") or []), _get(spec, "default")
            check(f"{key}.kind", kind, kind in FIELD_KINDS, f"one of {list(FIELD_KINDS)}")
            check(f"{key}.kind", kind, kind != "float",
                  "int, categorical or bool: both runtimes and the exported graphs take every problem and kernel "
                  "field as an int64, so a float field would train but never select; give it as an int in a finer "
                  "unit (alpha=1.5 as alpha_milli=1500) or as categorical values")
            if kind == "categorical":
                check(f"{key}.values", values, len(values) > 0 and all(isinstance(v, str) for v in values),
                      "a non-empty list of strings (the allowed values, in code order)")
                for j, v in enumerate(values):  # the readers strip what they read: " x" would match no row
                    check(f"{key}.values[{j}]", v, bool(v.strip()) and v == v.strip(),
                          "a non-empty value without leading or trailing spaces")
                check(f"{key}.values", values, len(set(values)) == len(values), "values listed once each")
                check(f"{key}.default", default, default is None or default in values, f"null or one of {values}")
            else:
                check(f"{key}.values", values, not values, f"no values for kind={kind} (only categorical fields list them)")
                ok = (default is None or (kind == "bool" and isinstance(default, bool))
                      or (kind == "int" and isinstance(default, int) and not isinstance(default, bool))
                      or (kind == "float" and isinstance(default, (int, float)) and not isinstance(default, bool)))
                check(f"{key}.default", default, ok, f"null or a value of kind {kind}")


def template_kinds(cfg: OpConfigLike) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Names a kernel-id template may use: kernel fields, categorical problem fields, and the
    run's ``dtype``/``layout`` when no field has those names."""

    kinds = field_kinds(cfg)
    problem = set((_get(cfg, "problem_fields") or {}).keys())
    allowed = {n: k for n, k in kinds.items() if n not in problem or k[0] == "categorical"}
    allowed.setdefault("dtype", ("categorical", dtype_names()))
    allowed.setdefault("layout", ("categorical", layout_names()))
    return allowed


def _check_kernel_id(cfg: OpConfigLike, plugin: type | None) -> None:

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
        kinds = field_kinds(cfg)
        for name in fields:  # the id is "(v1,v2,...)": a value holding "," prints two kernels alike
            for j, value in enumerate(kinds[name][1]):
                check(f"op.kernel_fields.{name}.values[{j}]", value, "," not in value,
                      "a value without ',' in a field of kernel_id.fields (the tuple id '(v1,v2,...)' separates "
                      "its values with ',', so two kernels would print alike)")
        return
    tpl = KernelTemplate(template, template_kinds(cfg), key="op.kernel_id.template")
    missing = [n for n in kernel if n not in tpl.names]
    check("op.kernel_id.template", template, not missing,
          f"a template using every kernel field (missing {missing}): a name identifies one kernel")
    check_round_trip(tpl)


#: Attribute marking :class:`ckpred.kernels.declared.DeclaredOp` (a plug-in must subclass it).
DECLARED_MARK = "__ckpred_declared_op__"


def vars_of(cls: type) -> set[str]:
    """Attributes a plug-in class defines itself: its own and its bases' up to the first class
    marked :data:`DECLARED_MARK` (``DeclaredOp``), i.e. the hooks it overrides."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if DECLARED_MARK in vars(klass):
            break
        out.update(vars(klass))
    return out


def load_plugin(spec: str, key: str = "op.plugin") -> type:
    """Import ``package.module:Class`` and check it is a :class:`DeclaredOp` subclass.

    The module is imported only when it is allowed (:func:`ckpred.plugins.is_allowed`); any
    other name is refused before anything is imported.
    """
    module_name = str(spec).partition(":")[0]
    obj = import_named(spec, key, "a DeclaredOp subclass")
    if not (isinstance(obj, type) and getattr(obj, DECLARED_MARK, False)):
        raise ConfigValueError(key, spec, f"a subclass of ckpred.kernels.declared.DeclaredOp in {module_name} "
                                          f"(found {type(obj).__name__ if obj is not None else 'nothing'})")
    return obj


def parse_expression(text: object, key: str, fields: Sequence[str], kinds: Mapping[str, tuple[str, tuple[str, ...]]],
                     *, hw: bool, condition: bool = False) -> Any:
    """Parse ``text`` and check it: its names (``fields``, + ``hw.<constant>`` when ``hw``), its
    constant parts (finite numbers, no division by zero) and its types, by evaluating it once
    (``condition``: as a rule's condition), so an expression no table can evaluate is refused
    here rather than skipped at ingest."""

    categories = {n: v for n, (k, v) in kinds.items() if k == "categorical"}
    expr = expressions.parse(text, key=key)
    expr.validate(fields, arch_constant_names() if hw else (), categories=categories)
    return expr.check_constants().trial(categories=categories, condition=condition)


def _check_expressions(cfg: OpConfigLike) -> None:

    kinds = field_kinds(cfg)
    problem = list((_get(cfg, "problem_fields") or {}).keys())
    every = list(kinds)
    for key in ("flops", "bytes"):
        text = _get(cfg, key)
        if text is not None:
            parse_expression(text, f"op.{key}", problem, kinds, hw=False)
    for i, rule in enumerate(_get(cfg, "rules") or []):
        parse_expression(_get(rule, "expr"), f"op.rules[{i}].expr", every, kinds, hw=True, condition=True)
        message = _get(rule, "message")
        check(f"op.rules[{i}].message", message, isinstance(message, str) and bool(message.strip()),
              "a non-empty message saying why a kernel is invalid where the rule fails")
    fam = _get(cfg, "family")
    if fam is not None and _get(fam, "expr"):
        parse_expression(_get(fam, "expr"), "op.family.expr", problem, kinds, hw=False)
        bounds, labels = list(_get(fam, "bounds") or []), list(_get(fam, "labels") or [])
        check("op.family.bounds", bounds, len(bounds) > 0 and all(_finite_number(b) for b in bounds)
              and all(a < b for a, b in zip(bounds, bounds[1:])), "a non-empty ascending list of finite bin edges")
        check("op.family.labels", labels, len(labels) == len(bounds) + 1 and len(set(labels)) == len(labels),
              f"{len(bounds) + 1} distinct labels (one more than bounds)")
    elif fam is not None:
        check("op.family", dict(bounds=list(_get(fam, "bounds") or []), labels=list(_get(fam, "labels") or [])),
              not _get(fam, "bounds") and not _get(fam, "labels"), "bounds and labels only with family.expr")


def _check_keys(cfg: OpConfigLike) -> None:

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


def _check_metric(cfg: OpConfigLike) -> None:

    metric = _get(cfg, "metric")
    column, better, unit = _get(metric, "column"), _get(metric, "better"), _get(metric, "unit")
    check("op.metric.column", column, isinstance(column, str) and bool(column), "a column name")
    check("op.metric.better", better, better in ("lower", "higher"), "'lower' (a time) or 'higher' (a throughput)")
    units = TIME_UNITS if better == "lower" else THROUGHPUT_UNITS
    check("op.metric.unit", unit, unit in units, f"for better={better}: one of {list(units)}")
    absence = _get(cfg, "absence", "unknown")
    check("op.absence", absence, absence in ABSENCE,
          f"one of {list(ABSENCE)} (unknown: a full sweep; not_applicable: the table lists only the kernels that "
          "apply to each problem)")
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


#: Canonical columns ``input.columns`` may give besides the op's fields, its metric and validity
#: columns: the kernel's name and a table's per-row arch, dtype and layout.
INPUT_EXTRAS: tuple[str, ...] = ("kernel_name", "arch", "dtype", "layout")


def _check_input(cfg: OpConfigLike) -> None:

    spec = _get(cfg, "input")
    if spec is None:
        return
    fmt = _get(spec, "format")
    check("op.input.format", fmt, isinstance(fmt, str) and bool(fmt), "'auto' or a registered reader's name")
    columns = dict(_get(spec, "columns") or {})
    exprs = {}
    for name, source in columns.items():
        key = f"op.input.columns.{name}"
        check(key, name, str(name).isidentifier(), "a canonical column name (an identifier)")
        if isinstance(source, str):
            check(key, source, bool(source), "a source column name, {value: <constant>} or {expr: <expression>}")
            continue
        keys = sorted(source.keys()) if isinstance(source, Mapping) else None
        check(key, source, keys in (["value"], ["expr"]),
              "a source column name, {value: <constant>} or {expr: <expression>}")
        if keys == ["expr"]:
            exprs[str(name)] = expressions.parse(source["expr"], key=f"{key}.expr").check_constants().trial()
    _check_input_targets(cfg, columns, exprs)


def _check_input_targets(cfg: OpConfigLike, columns: Mapping[str, Any], exprs: Mapping[str, Any]) -> None:
    """Each ``input.columns`` entry names a column the op reads, and a constant or derived one
    can be of its field's kind (``{value: abc}`` for an int field is refused here)."""

    kinds = field_kinds(cfg)
    failure = _get(cfg, "failure")
    read = set().union(*(e.names for e in exprs.values())) if exprs else set()
    allowed = [*kinds, str(_get(_get(cfg, "metric"), "column")), *INPUT_EXTRAS]
    if _get(failure, "valid_column"):
        allowed.append(str(_get(failure, "valid_column")))
    kernel = [n for n in (_get(cfg, "kernel_fields") or {})]
    for name, source in columns.items():
        key = f"op.input.columns.{name}"
        check(key, name, name in allowed or name in read,
              f"a column the op reads: a field, the metric or validity column, {list(INPUT_EXTRAS)}, or a name "
              f"another derived column reads ({sorted(set(allowed))})")
        if name == "kernel_name":
            mapped = [k for k in kernel if k in columns]
            check(key, source, not mapped, f"either kernel_name or the kernel fields {mapped}, not both: "
                                           "the kernel is read from its name, or from its fields")
        kind, values = kinds.get(name, ("", ()))
        if isinstance(source, Mapping) and "value" in source and kind:
            check(f"{key}.value", source["value"], _of_kind(source["value"], kind, values),
                  f"a value of field {name!r} ({kind}{': one of ' + str(list(values)) if values else ''})")
        if isinstance(source, Mapping) and "expr" in source and kind == "categorical":
            check(f"{key}.expr", source["expr"], all(_is_number_text(v) for v in values),
                  f"a source column name or {{value: ...}}: an expression gives a number, and field {name!r} "
                  f"is categorical with values {list(values)}")


def _of_kind(value: object, kind: str, values: Sequence[str]) -> bool:
    """Whether a constant ``{value: ...}`` types as a field of ``kind`` as the reader types it."""
    if kind == "int":
        return to_int(value) is not None
    if kind == "float":
        number = to_float(value)
        return number is not None and _finite_number(number)
    if kind == "bool":
        return truth(value) is not None
    return str(value).strip() in values


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_op_config(cfg: OpConfigLike) -> None:
    """Every compose-time check of an op config (:class:`ckpred.schema.OpConfig` or a mapping).

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming the key (``op.rules[2].expr``, ``op.kernel_id.template``...), the bad value and
        what is allowed: an unknown field in an expression, a wrong kind, a template that does
        not round-trip, a key field that is not a problem field...
    """

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


