"""The command layer: one thin module per CLI command.

These modules, :mod:`ckpred.cli` and :mod:`ckpred.config` are the only places that compose
configs or touch Hydra; each command picks its output locations and hands the composed config
(or plain arguments) to the engine modules (data, kernels, features, models, fitting, cv,
evaluate, export, runtime).
"""
