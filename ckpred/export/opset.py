"""The ONNX operator sets and IR version every graph ckpred writes or checks uses."""

from __future__ import annotations

#: Operator sets of every exported graph (ai.onnx.ml 5 for the double TreeEnsemble).
OPSET: dict[str, int] = {"": 21, "ai.onnx.ml": 5}
#: IR version written into the models (onnxruntime 1.20+ reads it).
IR_VERSION = 10
