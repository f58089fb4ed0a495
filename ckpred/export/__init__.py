"""Export: ONNX converters of ckpred transformers, graphs, manifest (see DESIGN.md)."""
