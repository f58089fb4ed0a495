"""Export: ONNX converters of ckpred transformers, the selector and scorer graphs, and the export manifest."""
