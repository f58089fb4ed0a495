"""Cross-validation: CV schemes (:mod:`ckpred.cv.schemes`) and the driver of ``ckpred train``
(:mod:`ckpred.cv.driver`: fold planning, fitting per method, scoring, reporting, the run record).

This package's own namespace holds the scheme API only, so registering the configs (which
imports it) stays light; the driver is :func:`ckpred.cv.driver.cross_validate`.
"""

from ckpred.cv.schemes import (CVScheme, External, Fold, GroupKFold, Holdout, LeaveFamilyOut, LeaveOneGpuOut,
                               make_folds, register_scheme, registered_schemes, scheme_for)

__all__ = ["CVScheme", "External", "Fold", "GroupKFold", "Holdout", "LeaveFamilyOut", "LeaveOneGpuOut",
           "make_folds", "register_scheme", "registered_schemes", "scheme_for"]
