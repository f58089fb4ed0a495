"""Problem features: the GEMM shape itself (reference system's 13 problem features)."""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar, Sequence

from sklearn.utils._param_validation import Interval

from ckpred.features.base import FeatureGroup, positive_int


class ProblemFeatures(FeatureGroup):
    """M, N, K, split_k, their log2, log2(MNK), arithmetic intensity, aspect ratios, layout.

    Features (in order): ``m, n, k, split_k, log2_m, log2_n, log2_k, log2_mnk,
    arithmetic_intensity, m_over_n, m_over_k, n_over_k`` and, if ``include_layout``,
    ``layout_code`` (a constant: layout is fixed inside a model). Arithmetic intensity is
    ``2MNK / ((MK + KN + MN) * bytes_per_element)`` FLOP per byte, as in the reference system.

    Parameters
    ----------
    bytes_per_element : int, default=1
        Bytes of one A/B element (fp8: 1, fp16: 2).
    include_layout : bool, default=True
        Emit the ``layout_code`` column (the reference system has it; it is constant per model).
    layout_code : int, default=0
        Index of the layout in ``ckpred.schema.LAYOUTS`` (rcr=0, rrr=1, crr=2, ccr=3).
    input_names : sequence of str or None, default=None
        Column names of X when it is a plain array (see :mod:`ckpred.features.base`).
    """

    input_columns: ClassVar[tuple[str, ...]] = ("m", "n", "k", "split_k")
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        "bytes_per_element": positive_int(),
        "include_layout": ["boolean"],
        "layout_code": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, *, bytes_per_element: int = 1, include_layout: bool = True, layout_code: int = 0,
                 input_names: Sequence[str] | None = None) -> None:
        self.bytes_per_element = bytes_per_element
        self.include_layout = include_layout
        self.layout_code = layout_code
        self.input_names = input_names

    def _feature_names(self) -> list[str]:
        names = ["m", "n", "k", "split_k", "log2_m", "log2_n", "log2_k", "log2_mnk",
                 "arithmetic_intensity", "m_over_n", "m_over_k", "n_over_k"]
        return names + (["layout_code"] if self.include_layout else [])

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        m, n, k, split_k = cols["m"], cols["n"], cols["k"], cols["split_k"]
        mnk = m * n * k
        intensity = 2.0 * mnk / ((m * k + k * n + m * n) * float(self.bytes_per_element))
        out = [m, n, k, split_k, xp.log2(m), xp.log2(n), xp.log2(k), xp.log2(mnk),
               intensity, m / n, m / k, n / k]
        if self.include_layout:
            out.append(xp.full(self.layout_code))
        return out
