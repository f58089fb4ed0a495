"""ckpred: compile GPU kernel benchmark data into a fast, deployable kernel-selection model."""

__version__ = "0.1.0"
