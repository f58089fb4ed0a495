"""Schema of the ``op`` group: an op declared as data (:mod:`ckpred.kernels.declared`).

The checks that span several keys (field names, expressions, kernel-id templates) are
:func:`ckpred.kernels.opschema.validate_op_config`, run when the config is composed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from ckpred.kernels.opschema import validate_op_config


# -- the op as data (ckpred.kernels.declared) -------------------------------------------------------


@dataclass
class FieldSpec:
    """One problem or kernel field of a declared op."""

    #: ``int`` | ``float`` | ``categorical`` | ``bool``.
    kind: str = "int"
    #: ``categorical``: the allowed values in code order (append only: codes are model inputs).
    values: list[Any] = field(default_factory=list)
    #: Value when a source does not carry the field (null = the field is required).
    default: Any = None


@dataclass
class KernelIdConfig:
    """How a kernel configuration is named: a template, or a tuple of fields."""

    #: ``bm{block_m}_w{num_warps}``: formats a name and parses it back (checked at compose).
    template: str = ""
    #: A tuple id: the name is ``(v1,v2,...)`` of these kernel fields.
    fields: list[str] = field(default_factory=list)


@dataclass
class MetricConfig:
    """The measurement: which column, which direction is better, its unit."""

    #: Column (after the input mapping) holding the measurement.
    column: str = "tflops"
    #: ``lower`` (a time) or ``higher`` (a throughput).
    better: str = "higher"
    #: A time unit (:data:`TIME_UNITS`) for ``lower``, a throughput unit for ``higher``.
    unit: str = "tflops"


@dataclass
class FailureConfig:
    """How a failed kernel run is encoded in the table."""

    #: Metric values that mean "failed" (:data:`FAILURE_VALUES`).
    metric_values: list[str] = field(default_factory=lambda: ["inf", "nan", "missing"])
    #: A column saying whether the run was valid (null = none).
    valid_column: Optional[str] = None
    true_values: list[str] = field(default_factory=lambda: ["true", "1", "yes"])
    false_values: list[str] = field(default_factory=lambda: ["false", "0", "no"])


@dataclass
class RuleConfig:
    """A validity rule: a kernel can run a problem only where ``expr`` holds."""

    #: Condition over kernel, problem and ``hw.<constant>`` fields (see :mod:`ckpred.expressions`).
    expr: str = MISSING
    #: Why a kernel is invalid where the rule fails (the table's ``invalid_reason``).
    message: str = MISSING


@dataclass
class FamilyConfig:
    """Problem families by bins of an expression (e.g. CK's tiny/small/medium/large by M)."""

    #: Expression over problem fields whose value is binned.
    expr: str = ""
    #: Ascending bin edges: label i holds values in [bounds[i-1], bounds[i]).
    bounds: list[float] = field(default_factory=list)
    #: ``len(bounds) + 1`` labels.
    labels: list[str] = field(default_factory=list)


@dataclass
class OpKeysConfig:
    """The three keys: what a selection is for, what a fold holds out, what a report splits by."""

    #: Problem fields of one query (the ranking group and unit of efficiency); empty = all.
    query: list[str] = field(default_factory=list)
    #: Problem fields a CV fold holds out together (a subset of ``query``); empty = ``query``.
    cv_group: list[str] = field(default_factory=list)
    #: Report breakdowns: categorical/bool problem fields, or ``family`` when the op declares one.
    breakdowns: list[str] = field(default_factory=list)


@dataclass
class OpInputConfig:
    """How a raw table becomes canonical rows (read by :mod:`ckpred.data`).

    ``columns`` maps a canonical field to its source: a string (a source column to rename),
    ``{value: <constant>}`` or ``{expr: "<expression over source columns>"}``.
    """

    #: ``auto`` (by extension/content) or a registered reader's name.
    format: str = "auto"
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpConfig:
    """An op as data: fields, kernel id, metric, failure encoding, expressions, rules, keys.

    Built into an :class:`ckpred.kernels.declared.DeclaredOp`; ``plugin`` names an optional
    ``package.module:OBJECT`` for what data cannot say (see :mod:`ckpred.kernels`). Every
    check runs when the config is composed, naming the key, the bad value and what is allowed.
    """

    name: str = MISSING
    #: ``package.module:OBJECT``: hooks for catalogue, name grammar, validity... (null = none).
    plugin: Optional[str] = None
    problem_fields: dict[str, FieldSpec] = field(default_factory=dict)
    kernel_fields: dict[str, FieldSpec] = field(default_factory=dict)
    kernel_id: KernelIdConfig = field(default_factory=KernelIdConfig)
    metric: MetricConfig = field(default_factory=MetricConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)
    #: What a (problem, kernel) pair without a row means (:data:`ABSENCE`): ``unknown`` for a
    #: full sweep, ``not_applicable`` when the table lists only the kernels that apply.
    absence: str = "unknown"
    #: Floating-point operations of a problem (expression over problem fields); null = none.
    flops: Optional[str] = None
    #: Bytes moved by a problem (expression over problem fields); null = none.
    bytes: Optional[str] = None
    rules: list[RuleConfig] = field(default_factory=list)
    family: FamilyConfig = field(default_factory=FamilyConfig)
    keys: OpKeysConfig = field(default_factory=OpKeysConfig)
    input: OpInputConfig = field(default_factory=OpInputConfig)

    def __post_init__(self) -> None:
        validate_op_config(self)
