"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

Every YAML option of a group starts with ``defaults: [base_<group>, _self_]`` so Hydra checks
its keys and types against its dataclass when the config is composed. The dataclasses live in
one module per kind of group (:mod:`~ckpred.schema.arch`: hardware; :mod:`~ckpred.schema.op`;
:mod:`~ckpred.schema.data`: data, features, shapes; :mod:`~ckpred.schema.train`: model, target,
cv, baselines and the recipe; :mod:`~ckpred.schema.commands`: the other commands) and are all
importable from here. Value rules that a type cannot express (ranges, allowed names) live in
``__post_init__`` and run when :func:`ckpred.config.to_object` turns the composed config into
these dataclasses; their errors name the key, the bad value and what is allowed.

Adding a config group means adding its dataclass to the module of its kind and registering it in
:func:`ckpred.config.register_schemas`; adding an *option* to a group is only a YAML file: the
dtypes, layouts and arch configs a check accepts are the files of the config dirs
(:mod:`ckpred.vocab`), not lists in these modules.
"""

from __future__ import annotations

from ckpred.errors import check
from ckpred.hardware import (ARCH_ALIASES, ARCH_NUMBERS, arch_constant_names, arch_constants, arch_value, dtype_names,
                             layout_names)
from ckpred.kernels.opschema import (ABSENCE, FAILURE_VALUES, FIELD_KINDS, TEMPLATE_CONTEXT, THROUGHPUT_UNITS,
                                     TIME_UNITS)
from ckpred.schema.base import (check_output_path, check_positive, check_seed, check_threads,
                                DATA_FORMATS, DATA_SOURCES, max_threads, SEED_MAX)
from ckpred.schema.arch import (arch_config, ArchConfig, check_arch_dtype, DtypeConfig, Hardware, HardwareView,
                                LayoutConfig, VENDORS)
from ckpred.schema.op import (FailureConfig, FamilyConfig, FieldSpec, KernelIdConfig, MetricConfig, OpConfig,
                              OpInputConfig, OpKeysConfig, RuleConfig)
from ckpred.schema.data import (DataConfig, FeatureGroupConfig, FeaturesConfig, ShapeFamilyConfig, ShapesConfig,
                                SimulateConfig)
from ckpred.schema.train import (ApplicabilityConfig, BaselinesConfig, CVConfig, DaskConfig, LABEL_GAINS,
                                 MODEL_BACKENDS, MODEL_NAMES, ModelConfig, PlainBaselineConfig, RANK_OBJECTIVES,
                                 RANKER_KEYS, RecipeConfig, ReferenceBaselineConfig, RowsConfig, TARGET_NAMES,
                                 TargetConfig, TrainConfig, TRANSFER_MODES, TransferConfig, ValidityModelConfig,
                                 saved_recipe)
from ckpred.schema.convert import from_mapping, to_plain, yaml_mapping
from ckpred.schema.commands import (EXPORT_SELECT, ExportAutotuneConfig, ExportConfig, ExportParityConfig,
                                    ExportRerankerConfig, IngestConfig, PLAN_KERNEL_ORDERS, PLAN_PROBLEM_ORDERS,
                                    PlanBudgetConfig, PlanConfig, ReplayConfig, SelectConfig, SWEEP_SORT,
                                    SweepReportConfig, TUNABLE, TUNE_KINDS, tune_param, TuneConfig, TuneParamConfig,
                                    TuneSettings)

__all__ = [
    "from_mapping", "saved_recipe", "to_plain", "yaml_mapping", "check", "ARCH_ALIASES", "ARCH_NUMBERS",
    "arch_constant_names", "arch_constants", "arch_value", "dtype_names", "layout_names", "ABSENCE",
    "FAILURE_VALUES", "FIELD_KINDS", "TEMPLATE_CONTEXT", "THROUGHPUT_UNITS", "TIME_UNITS", "check_arch_dtype",
    "check_output_path", "check_positive", "check_seed", "check_threads", "DATA_FORMATS", "DATA_SOURCES",
    "max_threads", "SEED_MAX", "arch_config", "ArchConfig", "DtypeConfig", "Hardware", "HardwareView",
    "LayoutConfig", "VENDORS", "FailureConfig", "FamilyConfig", "FieldSpec", "KernelIdConfig", "MetricConfig",
    "OpConfig", "OpInputConfig", "OpKeysConfig", "RuleConfig", "DataConfig", "FeatureGroupConfig", "FeaturesConfig",
    "ShapeFamilyConfig", "ShapesConfig", "SimulateConfig", "ApplicabilityConfig", "BaselinesConfig", "CVConfig",
    "DaskConfig", "LABEL_GAINS", "MODEL_BACKENDS", "MODEL_NAMES", "ModelConfig", "PlainBaselineConfig",
    "RANK_OBJECTIVES", "RANKER_KEYS", "RecipeConfig", "ReferenceBaselineConfig", "RowsConfig", "TARGET_NAMES",
    "TargetConfig", "TrainConfig", "TRANSFER_MODES", "TransferConfig", "ValidityModelConfig", "EXPORT_SELECT",
    "ExportAutotuneConfig", "ExportConfig", "ExportParityConfig", "ExportRerankerConfig", "IngestConfig",
    "PLAN_KERNEL_ORDERS", "PLAN_PROBLEM_ORDERS", "PlanBudgetConfig", "PlanConfig", "ReplayConfig", "SelectConfig",
    "SWEEP_SORT", "SweepReportConfig", "TUNABLE", "TUNE_KINDS", "tune_param", "TuneConfig", "TuneParamConfig",
    "TuneSettings"
]
