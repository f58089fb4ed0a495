"""Hardware features: constants of the GPU profile (the reference system's 12).

Inside a per-arch model these are constant columns and carry no signal (the trees never split
on them); they exist for cross-arch models and for the side-by-side replica of the reference.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, ClassVar, Sequence

from sklearn.utils._param_validation import Interval

from ckpred.features.base import FeatureGroup, positive_int, positive_real

#: Constructor parameter -> output feature name, in output order (``total_simds`` is derived).
_FEATURES: tuple[str, ...] = ("cus", "simds_per_cu", "total_simds", "shader_engines", "clock_mhz",
                              "max_waves_per_cu", "wave_size", "lds_kib", "l1_kib", "l2_mib",
                              "llc_mib", "xcds")


class HardwareFeatures(FeatureGroup):
    """Twelve constant columns describing the GPU (defaults: gfx950 / MI355X).

    Features (in order): ``hw_cus, hw_simds_per_cu, hw_total_simds, hw_shader_engines,
    hw_clock_mhz, hw_max_waves_per_cu, hw_wave_size, hw_lds_kib, hw_l1_kib, hw_l2_mib,
    hw_llc_mib, hw_xcds`` where ``total_simds = cus * simds_per_cu`` and ``l2_mib`` is the
    whole chip's L2 (per-XCD L2 times XCDs).

    Parameters
    ----------
    cus, simds_per_cu, shader_engines, clock_mhz, max_waves_per_cu, wave_size, lds_kib,
    l1_kib, xcds : int
        Hardware profile values (``conf/arch``).
    l2_mib, llc_mib : float
        Total L2 and last-level (Infinity) cache in MiB; ``llc_mib`` may be 0.
    input_names : sequence of str or None, default=None
        Unused columns' names when X is a plain array (kept for a uniform interface).
    """

    input_columns: ClassVar[tuple[str, ...]] = ()
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **FeatureGroup._parameter_constraints,
        **{name: positive_int() for name in ("cus", "simds_per_cu", "shader_engines", "clock_mhz",
                                              "max_waves_per_cu", "wave_size", "lds_kib", "l1_kib",
                                              "xcds")},
        "l2_mib": positive_real(),
        "llc_mib": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(self, *, cus: int = 256, simds_per_cu: int = 4, shader_engines: int = 32,
                 clock_mhz: int = 2400, max_waves_per_cu: int = 32, wave_size: int = 64,
                 lds_kib: int = 160, l1_kib: int = 32, l2_mib: float = 32.0, llc_mib: float = 256.0,
                 xcds: int = 8, input_names: Sequence[str] | None = None) -> None:
        self.cus = cus
        self.simds_per_cu = simds_per_cu
        self.shader_engines = shader_engines
        self.clock_mhz = clock_mhz
        self.max_waves_per_cu = max_waves_per_cu
        self.wave_size = wave_size
        self.lds_kib = lds_kib
        self.l1_kib = l1_kib
        self.l2_mib = l2_mib
        self.llc_mib = llc_mib
        self.xcds = xcds
        self.input_names = input_names

    def constants(self) -> list[float]:
        """The feature values (the same for every row), in output order."""
        values = {name: getattr(self, name) for name in _FEATURES if name != "total_simds"}
        values["total_simds"] = self.cus * self.simds_per_cu
        return [float(values[name]) for name in _FEATURES]

    def _feature_names(self) -> list[str]:
        return [f"hw_{name}" for name in _FEATURES]

    def _compute(self, cols: dict[str, Any], xp: Any) -> list[Any]:
        return [xp.full(value) for value in self.constants()]
