"""skl2onnx converters for LightGBM models and the target transform, in double precision.

Why not onnxmltools' graph as it is: its LightGBM converter emits ``ai.onnx.ml``
``TreeEnsembleRegressor`` (opset 3), whose thresholds are float32 attributes and whose output is
float32. LightGBM compares ``feature <= threshold`` in double and sums leaves in double; a
float32 ensemble takes the wrong branch whenever a feature lies between the float32-rounded and
the double threshold (a prototype saw 216-288 of 460,800 rows change), and loses precision on
the summed score. onnxruntime 1.31 runs a double ``TreeEnsembleRegressor`` but still returns
float32, so here the trees go to the ``ai.onnx.ml`` opset 5 ``TreeEnsemble`` operator with
double split thresholds, double leaf weights and a double output.

The tree structure itself still comes from onnxmltools' converter (``convert_lightgbm``: it
parses LightGBM's JSON dump, expands categorical set splits into ``BRANCH_EQ`` chains and sets
the missing-value direction); :func:`convert_lightgbm_double` runs that converter against a
container that intercepts the ``TreeEnsembleRegressor`` node and re-emits its attributes —
still holding LightGBM's full double values, before ONNX would round them — as a
``TreeEnsemble`` node. Splits on LightGBM's ``Zero`` missing type (``zero_as_missing=True``) are
refused: onnxmltools maps them like NaN splits, which would not branch like LightGBM on 0.

Target transforms: :class:`sklearn.compose.TransformedTargetRegressor` gets a parser that
emits the regressor and then the inverse of its ``transformer_`` as a separate operator, so the
graph predicts in the same space as ``pipeline.predict``. Inverses are registered per
transformer class in :data:`TARGET_INVERSES` (``Log1pTarget`` -> ``Exp(x) - 1``,
``IdentityTarget`` -> identity); an unregistered transformer is refused with its class name.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from lightgbm import LGBMRanker, LGBMRegressor
from onnx import TensorProto, numpy_helper
from onnxmltools.convert.lightgbm.operator_converters.LightGbm import convert_lightgbm
from skl2onnx import update_registered_converter
from skl2onnx._parse import _parse_sklearn
from skl2onnx.common._container import ModelComponentContainer
from skl2onnx.common._registration import register_converter, register_shape_calculator
from skl2onnx.common._topology import Operator, Scope, Variable
from skl2onnx.common.data_types import DoubleTensorType
from sklearn.compose import TransformedTargetRegressor

from ckpred.export.converters import register_converters
from ckpred.models import IdentityTarget, Log1pTarget

#: ai.onnx.ml opset 5 ``TreeEnsemble`` node modes.
_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
          "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6}

#: Alias of each model in skl2onnx's registry.
LGBM_REGRESSOR_ALIAS = "CkpredLgbmRegressor"
LGBM_RANKER_ALIAS = "CkpredLgbmRanker"
TTR_ALIAS = "CkpredTransformedTargetRegressor"
TARGET_INVERSE_ALIAS = "CkpredTargetInverse"

#: Transformer class -> function(scope, container, input_name, output_name) emitting the inverse.
TARGET_INVERSES: dict[type, Callable[..., None]] = {}


# -- LightGBM ------------------------------------------------------------------------------------
def _v3_to_v5(attrs: dict[str, Any]) -> dict[str, Any]:
    """Turn flat ``TreeEnsembleRegressor`` attributes into ``TreeEnsemble`` (opset 5) ones.

    Values are kept as Python floats (doubles) throughout.
    """
    if attrs.get("post_transform", "NONE") != "NONE":
        raise ValueError(f"LightGBM model with post_transform {attrs['post_transform']!r} cannot be "
                         "exported as a score (only regression and ranking objectives are)")
    if attrs.get("n_targets", 1) != 1:
        raise ValueError(f"LightGBM model with {attrs['n_targets']} targets: only one is supported")
    treeids, nodeids = attrs["nodes_treeids"], attrs["nodes_nodeids"]
    leaf_weight = _leaf_weights(attrs)
    interior: dict[tuple[int, int], int] = {}
    leaves: dict[tuple[int, int], int] = {}
    for i, (t, n) in enumerate(zip(treeids, nodeids)):
        if attrs["nodes_modes"][i] == "LEAF":
            leaves[(t, n)] = len(leaves)
        else:
            interior[(t, n)] = len(interior)
    leaf_weights = [leaf_weight.get(key, 0.0) for key in sorted(leaves, key=leaves.__getitem__)]
    out = _interior_nodes(attrs, interior, leaves)
    roots = _tree_roots(sorted(set(treeids)), interior, leaves, out)
    return {
        "n_targets": 1,
        "aggregate_function": 1,  # SUM
        "post_transform": 0,  # NONE
        "tree_roots": roots,
        "nodes_featureids": out["nodes_featureids"],
        "nodes_modes": numpy_helper.from_array(np.asarray(out["nodes_modes"], dtype=np.uint8), "nodes_modes"),
        "nodes_splits": numpy_helper.from_array(np.asarray(out["nodes_splits"], dtype=np.float64), "nodes_splits"),
        "nodes_truenodeids": out["nodes_truenodeids"],
        "nodes_trueleafs": out["nodes_trueleafs"],
        "nodes_falsenodeids": out["nodes_falsenodeids"],
        "nodes_falseleafs": out["nodes_falseleafs"],
        "nodes_missing_value_tracks_true": out["nodes_missing_value_tracks_true"],
        "leaf_targetids": [0] * len(leaf_weights),
        "leaf_weights": numpy_helper.from_array(np.asarray(leaf_weights, dtype=np.float64), "leaf_weights"),
    }


def _leaf_weights(attrs: dict[str, Any]) -> dict[tuple[int, int], float]:
    """(tree, node) -> the leaf's summed weight (one target only)."""
    leaf_weight: dict[tuple[int, int], float] = {}
    for t, n, target, w in zip(attrs["target_treeids"], attrs["target_nodeids"], attrs["target_ids"],
                               attrs["target_weights"]):
        if target != 0:
            raise ValueError("multi-target tree ensembles are not supported")
        leaf_weight[(t, n)] = leaf_weight.get((t, n), 0.0) + float(w)
    return leaf_weight


def _interior_nodes(attrs: dict[str, Any], interior: dict[tuple[int, int], int],
                    leaves: dict[tuple[int, int], int]) -> dict[str, list[Any]]:
    """The opset 5 ``nodes_*`` lists of the interior nodes, in their new numbering."""
    modes = attrs["nodes_modes"]
    # (tree, node) -> position in the flat v3 arrays
    where = {(t, n): i for i, (t, n) in enumerate(zip(attrs["nodes_treeids"], attrs["nodes_nodeids"]))}
    out: dict[str, list[Any]] = {k: [] for k in (
        "nodes_featureids", "nodes_modes", "nodes_splits", "nodes_truenodeids", "nodes_trueleafs",
        "nodes_falsenodeids", "nodes_falseleafs", "nodes_missing_value_tracks_true")}

    def child(t: int, n: int) -> tuple[int, int]:
        return (leaves[(t, n)], 1) if (t, n) in leaves else (interior[(t, n)], 0)

    for (t, n), _ in sorted(interior.items(), key=lambda kv: kv[1]):
        i = where[(t, n)]
        out["nodes_featureids"].append(int(attrs["nodes_featureids"][i]))
        out["nodes_modes"].append(_MODES[modes[i]])
        out["nodes_splits"].append(float(attrs["nodes_values"][i]))
        true_id, true_leaf = child(t, attrs["nodes_truenodeids"][i])
        false_id, false_leaf = child(t, attrs["nodes_falsenodeids"][i])
        out["nodes_truenodeids"].append(true_id)
        out["nodes_trueleafs"].append(true_leaf)
        out["nodes_falsenodeids"].append(false_id)
        out["nodes_falseleafs"].append(false_leaf)
        out["nodes_missing_value_tracks_true"].append(int(attrs["nodes_missing_value_tracks_true"][i]))
    return out


def _tree_roots(trees: list[int], interior: dict[tuple[int, int], int], leaves: dict[tuple[int, int], int],
                out: dict[str, list[Any]]) -> list[int]:
    """Each tree's root node; a single-leaf tree gets a node appended to ``out`` (see below)."""
    roots = []
    for t in trees:
        if (t, 0) in interior:
            roots.append(interior[(t, 0)])
            continue
        # A single-leaf tree (LightGBM makes them when no split gains): TreeEnsemble needs a
        # node, so add one whose both branches lead to that leaf.
        leaf = leaves[(t, 0)]
        roots.append(len(out["nodes_featureids"]))
        for key, value in (("nodes_featureids", 0), ("nodes_modes", 0), ("nodes_splits", 0.0),
                           ("nodes_truenodeids", leaf), ("nodes_trueleafs", 1),
                           ("nodes_falsenodeids", leaf), ("nodes_falseleafs", 1),
                           ("nodes_missing_value_tracks_true", 0)):
            out[key].append(value)
    return roots


class _TreeRewriter:
    """Container proxy: lets onnxmltools build its nodes, turns its tree node into opset 5 double."""

    def __init__(self, container: ModelComponentContainer) -> None:
        self._container = container
        self.rewritten = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)

    def add_node(self, op_type: str, inputs: str | list[str], outputs: str | list[str], op_domain: str = "",
                 op_version: int | None = None, **attrs: Any) -> None:
        if op_type == "TreeEnsembleRegressor":
            name = attrs.pop("name", None)
            # skl2onnx 1.20 refuses ai.onnx.ml opset 5 in its bookkeeping, so the node is declared
            # at version 3 here and convert_pipeline raises the model's ai.onnx.ml import to 5.
            self._container.add_node("TreeEnsemble", inputs, outputs, op_domain="ai.onnx.ml", op_version=3,
                                     name=name, **_v3_to_v5(attrs))
            self.rewritten += 1
            return
        self._container.add_node(op_type, inputs, outputs, op_domain=op_domain, op_version=op_version, **attrs)


def _check_lightgbm_dump(model: LGBMRegressor | LGBMRanker) -> None:
    """Refuse what onnxmltools' tree parsing would get subtly wrong."""
    dump = model.booster_.dump_model()

    def walk(node: dict[str, Any]) -> None:
        if "split_index" not in node:
            return
        if node.get("missing_type") == "Zero":
            raise ValueError(
                "LightGBM model has splits with missing_type 'Zero' (zero_as_missing=True); the ONNX "
                "tree ensemble cannot send exact zeros down the default branch like LightGBM does. "
                "Train with zero_as_missing=False (the default).")
        walk(node["left_child"])
        walk(node["right_child"])

    for tree in dump["tree_info"]:
        walk(tree["tree_structure"])


def lightgbm_shape_calculator(operator: Operator) -> None:
    """One double score per row; the features feeding the trees must be double."""
    input_type = operator.inputs[0].type
    if not isinstance(input_type, DoubleTensorType):
        raise TypeError(
            f"{type(operator.raw_operator).__name__} must be fed double features to branch like LightGBM; "
            f"got {type(input_type).__name__} (a feature converter emitted float32?)")
    n = operator.inputs[0].get_first_dimension()
    operator.outputs[0].type = DoubleTensorType([n, 1])


def convert_lightgbm_double(scope: Scope, operator: Operator, container: ModelComponentContainer) -> None:
    """skl2onnx converter of ``LGBMRegressor``/``LGBMRanker``: onnxmltools' trees, in double."""
    _check_lightgbm_dump(operator.raw_operator)
    proxy = _TreeRewriter(container)
    convert_lightgbm(scope, operator, proxy)
    if proxy.rewritten != 1:
        raise RuntimeError(f"expected onnxmltools to emit one TreeEnsembleRegressor, it emitted {proxy.rewritten}")


# -- TransformedTargetRegressor -------------------------------------------------------------------
def _parse_ttr(scope: Scope, model: TransformedTargetRegressor, inputs: list[Variable],
               custom_parsers: dict[type, Callable[..., list[Variable]]] | None = None) -> list[Variable]:
    """Parse a TTR as its regressor followed by the inverse of its target transformer."""
    raw = _parse_sklearn(scope, model.regressor_, inputs, custom_parsers=custom_parsers)
    inverse = scope.declare_local_operator(TARGET_INVERSE_ALIAS, model.transformer_)
    inverse.inputs = list(raw[:1])
    out = scope.declare_local_variable("variable", DoubleTensorType())
    inverse.outputs.append(out)
    return [out]


def _ttr_shape_calculator(operator: Operator) -> None:  # pragma: no cover - TTR is replaced by its parser
    raise RuntimeError("TransformedTargetRegressor is parsed into its parts; this is never called")


def _ttr_converter(scope: Scope, operator: Operator, container: ModelComponentContainer) -> None:  # pragma: no cover
    raise RuntimeError("TransformedTargetRegressor is parsed into its parts; this is never called")


def _target_inverse_shape_calculator(operator: Operator) -> None:
    n = operator.inputs[0].get_first_dimension()
    operator.outputs[0].type = DoubleTensorType([n, 1])


def _target_inverse_converter(scope: Scope, operator: Operator, container: ModelComponentContainer) -> None:
    transformer = operator.raw_operator
    emit = next((fn for cls, fn in TARGET_INVERSES.items() if type(transformer) is cls), None)
    if emit is None:
        raise TypeError(
            f"no ONNX inverse for target transformer {type(transformer).__module__}."
            f"{type(transformer).__name__}; known: {sorted(c.__name__ for c in TARGET_INVERSES)} "
            "(register one in ckpred.export.lightgbm.TARGET_INVERSES)")
    emit(scope, container, operator.inputs[0].full_name, operator.outputs[0].full_name)


def expm1_inverse(scope: Scope, container: ModelComponentContainer, x: str, y: str) -> None:
    """``y = exp(x) - 1`` in double (the inverse of log1p)."""
    one = scope.get_unique_variable_name("one")
    container.add_initializer(one, TensorProto.DOUBLE, [], [1.0])
    e = scope.get_unique_variable_name("exp")
    container.add_node("Exp", [x], [e], name=scope.get_unique_operator_name("Exp"))
    container.add_node("Sub", [e, one], [y], name=scope.get_unique_operator_name("Sub"))


def identity_inverse(scope: Scope, container: ModelComponentContainer, x: str, y: str) -> None:
    """``y = x``."""
    container.add_node("Identity", [x], [y], name=scope.get_unique_operator_name("Identity"))


def register_target_inverse(cls: type, emit: Callable[..., None]) -> None:
    """Register the ONNX inverse of target transformer class ``cls``."""
    TARGET_INVERSES[cls] = emit


_REGISTERED = False


def register() -> None:
    """Register the LightGBM, TTR and target-inverse converters with skl2onnx (idempotent).

    Also registers the feature transformers' converters
    (:func:`ckpred.export.converters.register_converters`, on every call: groups loaded since
    the last call get theirs) and ckpred's target transformers.
    """
    global _REGISTERED
    # Every call: feature groups loaded since the last one (an op's own module:Class group) get
    # their converter too.
    register_converters()
    if _REGISTERED:
        return
    update_registered_converter(LGBMRegressor, LGBM_REGRESSOR_ALIAS, lightgbm_shape_calculator,
                                convert_lightgbm_double)
    update_registered_converter(LGBMRanker, LGBM_RANKER_ALIAS, lightgbm_shape_calculator,
                                convert_lightgbm_double)
    update_registered_converter(TransformedTargetRegressor, TTR_ALIAS, _ttr_shape_calculator,
                                _ttr_converter, parser=_parse_ttr)
    register_shape_calculator(TARGET_INVERSE_ALIAS, _target_inverse_shape_calculator, overwrite=True)
    register_converter(TARGET_INVERSE_ALIAS, _target_inverse_converter, overwrite=True)
    register_target_inverse(Log1pTarget, expm1_inverse)
    register_target_inverse(IdentityTarget, identity_inverse)
    _REGISTERED = True
