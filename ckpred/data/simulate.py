"""Calibrated analytical performance simulator of CK Tile ``gemm_universal`` kernels.

This is ckpred's embedded default data: for a set of problem shapes (``conf/shapes``) and the
op's kernel catalogue it produces the canonical table a real benchmark run would, so every
command works on a machine without a GPU. The model is physical and fully vectorised over
(shape, kernel); every constant below is a hardware or software property, none is fitted to
a single shape.

Model
-----
Notation: problem M, N, K; kernel tile tm x tn x tk, warps wm x wn, warp tile wtm x wtn x wtk;
b = bytes per A/B element, bc = bytes per C element (fp16 for fp8); ``clk`` = sustained clock
(``arch.clock_mhz`` x ``CLOCK_SUSTAINED``); P_cu = ``arch.peak_tflops[dtype]`` / ``arch.compute_units`` x
``CLOCK_SUSTAINED`` (MFMA peak of one CU at the sustained clock).

1. **Tiles and waves.** Tm = ceil(M/tm), Tn = ceil(N/tn), T = Tm*Tn*split_k workgroups and
   Kit = ceil(K/(split_k*tk)) main-loop iterations (split-K slices each add their C partial).
   Workgroups are dealt round-robin to the XCDs, then to the CUs of each XCD, so the busiest
   CU runs n_cu = ceil(ceil(T/XCDs) / (CUs/XCDs)) tiles (wave quantisation).
2. **Occupancy.** occ = min(LDS_CU / lds_wg, VGPR_LANE / vgpr, 8) workgroups per CU, with
   lds_wg = (tm + tn)*tk*b (x2 for the double-buffered ``compv4``) and the per-thread register
   estimate vgpr = tm*tn/256 (fp32 accumulators) + prefetch*(tm + tn)*tk*b/(4*256) + 48.
3. **Main-loop iteration, compute side.** t_mfma = 2*tm*tn*tk / (P_cu * r), r the rate of
   the warp tile's MFMA instruction (gfx950: 32x32x64 and 16x16x128 fp8, 32x32x16 and
   16x16x32 fp16 run at full rate, the older CDNA3 shapes at half rate; 16x16 shapes pay
   ``MFMA_16_EFF`` for their extra register traffic). The padded rows and columns of a tile
   are computed too, so last-tile and padding waste is in t_mfma. LDS time t_lds =
   ((tm + tn)*tk*b [stores] + tk*b*(tm*wn + tn*wm) [each warp reads its A rows and B
   columns]) / (LDS bytes/clk * clk). t_comp = max(t_mfma, t_lds) / (e_pipe * e_sched) +
   sync_pipe/clk: issue efficiency of the pipeline and scheduler, plus the per-iteration
   barrier and bookkeeping cost (``SIMULATED_PIPELINES``, ``SCHEDULER_ISSUE_EFF``).
4. **Main-loop iteration, memory side.** One iteration brings B_it = (M' + N')*tk*b bytes
   from L2 into the CU, M' = min(tm, M/Tm) and N' = min(tn, N/Tn) (out-of-bounds rows of the
   last tile are masked, not fetched): t_link = B_it / (link bytes/clk * clk). A workgroup
   alone on its CU has one stage in flight, so it also waits the memory latency L per
   iteration: max(t_comp, t_link + L).
5. **Tile time.** With s = min(1 + prologue_stages, Kit) stages loaded by the prologue
   (``compv4`` loads two, so short loops expose one latency less): alone (latency-bound)
   t_alone = t_setup + L + s*(t_link + t_comp) + (Kit - s)*max(t_comp, t_link + L) + t_epi;
   on a saturated CU (other workgroups hide the latency) t_thr = Kit*max(t_comp, t_link) +
   t_epi - store latency + t_setup/2 (half a dispatch overlaps). The epilogue t_epi = store
   latency + M'*N'*bc / link, plus for ``cshuffle`` an LDS round trip 2*tm*tn*bc / LDS bw
   and a barrier. ``persistent`` kernels pay the workgroup setup once per slot instead of
   once per tile, plus ``PERSISTENT_TILE_S`` per tile of their tile loop.
6. **CU bound.** t_cu = max(n_cu*t_thr, ceil(n_cu/occ)*t_alone): a CU either saturates its
   MFMA/LDS/link, or its few workgroups sit waiting on memory (decode shapes).
7. **Memory hierarchy (roofline).** L2 traffic T*Kit*B_it (A re-read Tn times and B Tm times:
   tile reuse) against L2 bandwidth XCDs * L2 bytes/clk * clk. Fabric reads: each XCD owning
   tiles of a row band reads its A panel (min(Tn, XCDs) copies); B panels are re-read for
   every row band (Tm times) in the proportion an XCD's share B/min(Tn, XCDs) overflows its
   L2. The unique bytes A+B come from the last-level cache when A+B+C fit in it (benchmarks
   re-run the same buffers) at ``LLC_BW_FACTOR`` x HBM, from HBM otherwise (linear mix
   between), at ``HBM_READ_EFF`` of the vendor bandwidth times the pipeline's fabric share
   (``mem`` keeps more loads in flight); re-reads come from the LLC. C is written at
   ``WRITE_EFF`` of HBM bandwidth (per epilogue).
8. **Total.** t = ``LAUNCH_S`` + (t_cu^p + t_l2^p + t_fabric^p)^(1/p), a smooth roofline
   max (p = ``SMOOTH_P``) since limits overlap imperfectly; TFLOPS = 2*M*N*K / t.
9. **Idiosyncrasies and noise.** Each kernel gets a seeded log-normal factor (sigma
   ``KERNEL_SIGMA``: code generation, register allocation, bank conflicts the model does not
   see) and one per (kernel, M family) (sigma ``KERNEL_FAMILY_SIGMA``), so the data is not a
   closed-form function of the features. Each measurement gets run-to-run noise: log-normal
   with sigma ``NOISE_SIGMA``, with probability ``NOISE_TAIL_P`` sigma ``NOISE_TAIL_SIGMA``,
   set so two runs (``noise_seed``) differ per kernel as much as two repeated real CK Tile
   runs do (a median of 0.8% and a P90 of 3.3% in a repeated sweep of 32 kernels x 4
   shapes, where the fastest kernel changed on every shape). Random numbers
   come from a counter-based hash of (seed, shape, kernel name), so a row never depends on
   which other shapes or kernels are simulated with it.
10. **Validity.** Rows the op's rules reject (``op.validity``) are ``is_valid=False`` with the
    rule's reason; ``RUNTIME_FAIL_P`` of the rule-valid rows fail as if at run time (reason
    ``runtime failure (simulated)``), always the same rows for a seed.

Calibration
-----------
``python -m ckpred simulate calibrate=true`` (or ``scripts/research/calibrate_simulator.py``)
compares the simulator's best kernel per shape with AMD's real fp8/rcr/gfx950 measurements of
168 shapes (``p1_oracle_best_results.csv``), by M family (:func:`calibration_report`). The
targets: median |log(sim / real best TFLOPS)| <= 0.26, every family's median <= ln 2, and the
real best kernel inside the simulator's top 5% for at least 60% of shapes. The parameters are
physical and global (no per-shape terms); they were set from the decode shapes (latency and
launch overhead), the compute-bound large shapes (issue efficiency: real CK Tile fp8 GEMMs
reach about 45% of the MFMA peak) and the K=256 shapes (C write bandwidth). The figures, and
how hard the default set makes selection, are in docs/results.md ("Simulator calibration").
"""

from __future__ import annotations

import hashlib
import json
import logging
import dataclasses
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from ckpred import dtypes
from ckpred.data.shapes import load_shapes
from ckpred.data.table import conform, read_table, write_table
from ckpred.errors import CkpredError, ConfigValueError, InputFileError
from ckpred.kernels.base import ArchSpec, DtypeSpec, LayoutSpec, OpDefinition, load_op
from ckpred.schema import RecipeConfig, SimulateConfig, arch_value
from ckpred.util import OwnFile, atomic_path, resolve_path

log = logging.getLogger(__name__)

#: Bump when the model changes: cached tables of older versions are regenerated.
SIMULATOR_VERSION = "1.0.0"

# -- physical parameters -----------------------------------------------------------------------
#: Sustained clock under dense MFMA load as a fraction of the maximum (boost) clock.
CLOCK_SUSTAINED = 0.85
#: Memory latency seen by a workgroup's global loads (L2 miss to LLC/HBM), seconds.
LATENCY_S = 280e-9
#: Kernel launch and completion overhead visible in a timed run, seconds.
LAUNCH_S = 2.0e-6
#: Workgroup dispatch and setup (argument loads, tile index, address setup), seconds.
WG_SETUP_S = 150e-9
#: Per-tile scheduling cost inside a persistent kernel's tile loop, seconds.
PERSISTENT_TILE_S = 40e-9
#: Latency of the epilogue's global stores before the workgroup retires, seconds.
STORE_LATENCY_S = 300e-9
#: Efficiency of 16x16 MFMA shapes relative to 32x32 ones (more A/B register traffic).
MFMA_16_EFF = 0.95
#: Register file of one SIMD lane (VGPR + AGPR) and the cap on workgroups per CU.
VGPR_LANE = 512
MAX_WG_PER_CU = 8
#: Fraction of HBM bandwidth a streaming read reaches.
HBM_READ_EFF = 0.85
#: Last-level cache (Infinity Cache) bandwidth relative to HBM bandwidth.
LLC_BW_FACTOR = 1.3
#: Fraction of HBM bandwidth reached by C writes, per epilogue.
WRITE_EFF = {"default": 0.40, "cshuffle": 0.42}
#: Smooth-max exponent combining the CU, L2 and fabric limits.
SMOOTH_P = 2.0


@dataclass(frozen=True)
class SimulatedPipeline:
    """What a CK Tile pipeline does per main-loop iteration."""

    #: Issue efficiency of the MFMA/LDS work (software pipelining quality).
    issue_eff: float
    #: Per-iteration barrier and bookkeeping cost, clocks.
    sync_clk: float
    #: Iterations whose load latency the prologue already covers (beyond the first).
    prologue_stages: int
    #: LDS buffers (2 = double buffered).
    lds_buffers: int
    #: Register prefetch stages (for the VGPR estimate).
    prefetch: int
    #: Share of the fabric bandwidth its load pattern reaches.
    fabric: float


SIMULATED_PIPELINES: dict[str, SimulatedPipeline] = {
    "compv3": SimulatedPipeline(issue_eff=0.60, sync_clk=120, prologue_stages=0, lds_buffers=1, prefetch=1, fabric=0.93),
    "compv4": SimulatedPipeline(issue_eff=0.58, sync_clk=170, prologue_stages=1, lds_buffers=2, prefetch=1, fabric=0.93),
    "mem": SimulatedPipeline(issue_eff=0.48, sync_clk=100, prologue_stages=0, lds_buffers=1, prefetch=2, fabric=1.0),
}
#: Issue efficiency factor of each scheduler (interwave interleaves waves at a small MFMA cost).
SCHEDULER_ISSUE_EFF: dict[str, float] = {"intrawave": 1.0, "interwave": 0.96}


@dataclass(frozen=True)
class Microarch:
    """Per-architecture micro-architectural constants not in the arch config (public specs)."""

    #: LDS bandwidth per CU, bytes/clk.
    lds_bytes_per_clk: float
    #: L2 -> CU fill bandwidth per CU, bytes/clk.
    link_bytes_per_clk: float
    #: L2 bandwidth per XCD, bytes/clk.
    l2_bytes_per_clk: float
    #: K of the full-rate MFMA instruction per (dtype class, warp-tile M): other K run at half rate.
    full_rate_k: Mapping[str, Mapping[int, int]]


_CDNA3 = Microarch(128, 128, 2048, {"fp8": {32: 16, 16: 32}, "fp16": {32: 8, 16: 16}})
_CDNA4 = Microarch(256, 128, 2048, {"fp8": {32: 64, 16: 128}, "fp16": {32: 16, 16: 32}})
#: gfx90a (CDNA2) uses the CDNA3 constants: same LDS and L2 widths, fp16 full rate at 32x32x8.
MICROARCH: dict[str, Microarch] = {"gfx942": _CDNA3, "gfx90a": _CDNA3, "gfx950": _CDNA4}

# -- idiosyncrasies, noise, failures ---------------------------------------------------------------
#: Log-normal sigma of a kernel's own speed factor (same on every shape) ...
KERNEL_SIGMA = 0.03
#: ... and of its factor per M family (what a kernel does well on decode it may not on prefill).
KERNEL_FAMILY_SIGMA = 0.02
#: Run-to-run noise: log-normal sigma, and a wider sigma with probability NOISE_TAIL_P
#: (two runs then differ like repeated real CK Tile runs: see the module docstring, step 9).
NOISE_SIGMA = 0.006
NOISE_TAIL_P = 0.20
NOISE_TAIL_SIGMA = 0.029
#: Share of rule-valid (shape, kernel) pairs that fail at run time, and their reason.
RUNTIME_FAIL_P = 0.005
RUNTIME_FAIL_REASON = "runtime failure (simulated): kernel launch returned an error"

_DTYPE_CLASS = {"fp8": "fp8", "bf8": "fp8", "fp16": "fp16", "bf16": "fp16", "fp32": "fp16"}


# -- counter-based random numbers ------------------------------------------------------------------
def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(*keys: npt.ArrayLike) -> np.ndarray:
    """A 64-bit hash of broadcast integer keys (same keys -> same value, on every platform)."""
    with np.errstate(over="ignore"):
        h = np.zeros((), dtype=np.uint64)
        for key in keys:
            h = _splitmix64(np.bitwise_xor(h, np.asarray(key).astype(np.uint64)))
        return np.asarray(h)


def _normal(h: np.ndarray) -> np.ndarray:
    """Standard normal numbers from hashes (Box-Muller on two derived uniforms)."""
    with np.errstate(over="ignore"):
        u1 = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
        u2 = ((_splitmix64(h) >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _uniform(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return ((_splitmix64(h ^ np.uint64(0x5DEECE66D)) >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53


def _name_keys(names: np.ndarray) -> np.ndarray:
    """Stable integer key of each kernel name (crc32), so idiosyncrasies follow the kernel."""
    return np.fromiter((zlib.crc32(str(n).encode()) for n in names), dtype=np.uint64, count=len(names))


def run_noise(h: np.ndarray) -> np.ndarray:
    """Multiplicative run-to-run noise factors (log-normal mixture, see the module docstring)."""
    z = _normal(h)
    tail = _uniform(h) < NOISE_TAIL_P
    return np.exp(np.where(tail, NOISE_TAIL_SIGMA, NOISE_SIGMA) * z)


# -- the physical model ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Machine:
    """The arch and dtype constants the latency model reads (scalars, in SI units)."""

    ua: Microarch
    dtype_name: str
    #: Bytes per A/B and per C element.
    b: float
    bc: float
    cus: float
    xcds: float
    #: Sustained clock, Hz.
    clk: float
    #: LDS per CU, L2 per die and the last-level cache, bytes.
    lds_cu: float
    l2_xcd: float
    llc: float
    #: HBM bandwidth, bytes/s.
    hbm: float
    #: Sustained peak FLOP/s of one CU.
    p_cu: float


def _machine(arch: ArchSpec, dtype: DtypeSpec) -> _Machine:
    """The constants of ``arch`` (by ISA: a product of a known ISA, gfx90a_mi210 or a user's copy
    with ``isa: gfx950``, has its constants) and ``dtype``; refuses an ISA or dtype the simulator
    has no constants for."""
    arch_name = str(arch_value(arch, "name"))
    dtype_name = str(getattr(dtype, "name", dtype))
    isa = str(arch_value(arch, "isa") or arch_name)
    ua = MICROARCH.get(isa)
    if ua is None:
        raise ConfigValueError("arch.isa", isa, f"one of the ISAs the simulator has micro-architecture constants for "
                                                f"{sorted(MICROARCH)} (an arch config's isa, else its name)")
    peak = dict(arch_value(arch, "peak_tflops")).get(dtype_name)
    if not peak:
        raise ValueError(f"arch {arch_name} has no peak_tflops for dtype {dtype_name}; "
                         f"known: {sorted(dict(arch_value(arch, 'peak_tflops')))}")
    cus = float(arch_value(arch, "compute_units"))
    return _Machine(
        ua=ua, dtype_name=dtype_name,
        b=float(dtypes.bytes_per_element(dtype)), bc=float(dtypes.c_bytes_per_element(dtype)),
        cus=cus, xcds=float(arch_value(arch, "dies")),
        clk=float(arch_value(arch, "clock_mhz")) * 1e6 * CLOCK_SUSTAINED,
        lds_cu=float(arch_value(arch, "shared_memory_kib")) * 1024.0,
        l2_xcd=float(arch_value(arch, "l2_mib_per_die")) * 2.0**20,
        llc=float(arch_value(arch, "llc_mib")) * 2.0**20,
        hbm=float(arch_value(arch, "memory_bandwidth_gbs")) * 1e9,
        p_cu=peak * 1e12 / cus * CLOCK_SUSTAINED)


@dataclass(frozen=True)
class _Grid:
    """Problems down, kernels across: the (shapes, 1) problem and (1, kernels) kernel arrays."""

    M: np.ndarray
    N: np.ndarray
    K: np.ndarray
    split: np.ndarray
    tm: np.ndarray
    tn: np.ndarray
    tk: np.ndarray
    wm: np.ndarray
    wn: np.ndarray
    wtm: np.ndarray
    wtk: np.ndarray
    #: Each kernel's :class:`SimulatedPipeline` and scheduler issue efficiency, and its epilogue
    #: and persistence flags.
    pipes: list[SimulatedPipeline]
    sched_eff: np.ndarray
    cshuffle: np.ndarray
    persistent: np.ndarray

    def per_pipe(self, attr: str) -> np.ndarray:
        """One :class:`SimulatedPipeline` attribute per kernel, shape (1, kernels)."""
        return np.array([getattr(p, attr) for p in self.pipes], dtype=np.float64)[None, :]


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].to_numpy(np.float64)


def _grid(problems: pd.DataFrame, kernels: pd.DataFrame) -> _Grid:
    """The arrays of ``problems`` (m, n, k, optional split_k) and ``kernels``; refuses a pipeline
    the simulator does not model."""
    M, N = _col(problems, "m")[:, None], _col(problems, "n")[:, None]
    split = np.maximum(_col(problems, "split_k")[:, None], 1.0) if "split_k" in problems else np.ones_like(M)
    K = np.maximum(_col(problems, "k")[:, None] / split, 1.0)
    tm, tn, tk = (_col(kernels, c)[None, :] for c in ("tile_m", "tile_n", "tile_k"))
    pipe = kernels["pipeline"].to_numpy()
    unknown = sorted(set(pipe) - set(SIMULATED_PIPELINES))
    if unknown:
        raise ValueError(f"the simulator models pipelines {sorted(SIMULATED_PIPELINES)}; catalogue has {unknown}")
    sched = kernels["scheduler"].to_numpy()
    return _Grid(
        M=M, N=N, K=K, split=split, tm=tm, tn=tn, tk=tk,
        wm=_col(kernels, "warp_m")[None, :], wn=_col(kernels, "warp_n")[None, :],
        wtm=_col(kernels, "warp_tile_m")[None, :], wtk=_col(kernels, "warp_tile_k")[None, :],
        pipes=[SIMULATED_PIPELINES[p] for p in pipe],
        sched_eff=np.array([SCHEDULER_ISSUE_EFF.get(s, 1.0) for s in sched])[None, :],
        cshuffle=(kernels["epilogue"].to_numpy() == "cshuffle")[None, :],
        persistent=kernels["persistent"].to_numpy(bool)[None, :])


@dataclass(frozen=True)
class _Tiling:
    """Step 1 of the model: output tiles per dimension, K iterations, workgroups, tiles per CU,
    and the useful rows and columns of a tile (step 4)."""

    Tm: np.ndarray
    Tn: np.ndarray
    Kit: np.ndarray
    T: np.ndarray
    n_cu: np.ndarray
    m_eff: np.ndarray
    n_eff: np.ndarray


def _tiling(g: _Grid, mc: _Machine) -> _Tiling:
    Tm, Tn, Kit = np.ceil(g.M / g.tm), np.ceil(g.N / g.tn), np.ceil(g.K / g.tk)
    T = Tm * Tn * g.split  # split-K: split_k workgroups per output tile, each on K/split_k
    cus_xcd = mc.cus / mc.xcds
    n_cu = np.ceil(np.ceil(T / mc.xcds) / cus_xcd)
    return _Tiling(Tm=Tm, Tn=Tn, Kit=Kit, T=T, n_cu=n_cu,
                   m_eff=np.minimum(g.tm, g.M / Tm), n_eff=np.minimum(g.tn, g.N / Tn))


def _cu_time(g: _Grid, mc: _Machine, t: _Tiling) -> np.ndarray:
    """Steps 2-6 of the model: the time the busiest CU needs for its tiles."""
    tm, tn, tk, b, clk, ua = g.tm, g.tn, g.tk, mc.b, mc.clk, mc.ua
    # 2. occupancy
    lds_wg = (tm + tn) * tk * b * g.per_pipe("lds_buffers")
    vgpr = tm * tn / 256.0 + g.per_pipe("prefetch") * (tm + tn) * tk * b / (4.0 * 256.0) + 48.0
    occ = np.maximum(1.0, np.minimum(np.minimum(np.floor(mc.lds_cu / lds_wg), np.floor(VGPR_LANE / vgpr)),
                                     MAX_WG_PER_CU))
    # 3. compute side of one iteration
    full_k = ua.full_rate_k[_DTYPE_CLASS[mc.dtype_name]]
    full = np.array([full_k.get(int(m_), -1) for m_ in g.wtm[0]])[None, :]
    rate = np.where(g.wtk == full, 1.0, 0.5) * np.where(g.wtm == 16, MFMA_16_EFF, 1.0)
    rate = np.where(g.wtm > 32, 0.5, rate)  # 64x4 tiles: a slow instruction
    t_mfma = 2.0 * tm * tn * tk / (mc.p_cu * rate)
    lds_bytes = (tm + tn) * tk * b + tk * b * (tm * g.wn + tn * g.wm)
    t_lds = lds_bytes / (ua.lds_bytes_per_clk * clk)
    t_comp = np.maximum(t_mfma, t_lds) / (g.per_pipe("issue_eff") * g.sched_eff) + g.per_pipe("sync_clk") / clk
    # 4. memory side of one iteration
    link = ua.link_bytes_per_clk * clk
    t_link = (t.m_eff + t.n_eff) * tk * b / link
    # 5. tile time, alone and on a saturated CU
    stages = np.minimum(1.0 + g.per_pipe("prologue_stages"), t.Kit)
    kit_exp = t.Kit - stages
    it_lat = np.maximum(t_comp, t_link + LATENCY_S)
    it_thr = np.maximum(t_comp, t_link)
    c_tile = t.m_eff * t.n_eff * mc.bc
    t_epi = STORE_LATENCY_S + c_tile / link + np.where(g.cshuffle, 2.0 * tm * tn * mc.bc / (ua.lds_bytes_per_clk * clk)
                                                       + 100.0 / clk, 0.0)
    t_epi_thr = t_epi - STORE_LATENCY_S
    setup = np.where(g.persistent, PERSISTENT_TILE_S + WG_SETUP_S / np.maximum(t.n_cu / occ, 1.0), WG_SETUP_S)
    t_alone = setup + LATENCY_S + stages * (t_link + t_comp) + kit_exp * it_lat + t_epi
    t_thr = setup * np.where(g.persistent, 1.0, 0.5) + t.Kit * it_thr + t_epi_thr
    # 6. CU bound
    return np.maximum(t.n_cu * t_thr, np.ceil(t.n_cu / occ) * t_alone)


def _memory_times(g: _Grid, mc: _Machine, t: _Tiling) -> tuple[np.ndarray, np.ndarray]:
    """Step 7 of the model: the L2 time and the fabric (LLC and HBM) time."""
    b, bc, split, xcds, hbm = mc.b, mc.bc, g.split, mc.xcds, mc.hbm
    a_bytes, b_bytes, c_bytes = g.M * g.K * split * b, g.N * g.K * split * b, g.M * g.N * bc * split
    l2_traffic = t.T * t.Kit * (t.m_eff + t.n_eff) * g.tk * b
    t_l2 = l2_traffic / (xcds * mc.ua.l2_bytes_per_clk * mc.clk)
    b_share = b_bytes / split / np.minimum(t.Tn, xcds)
    b_miss = np.clip(1.0 - mc.l2_xcd / np.maximum(b_share, 1.0), 0.0, 1.0)
    reread = a_bytes * (np.minimum(t.Tn, xcds) - 1.0) + b_bytes * (t.Tm - 1.0) * b_miss
    unique = a_bytes + b_bytes
    in_llc = np.clip(mc.llc / (unique + c_bytes), 0.0, 1.0)
    bw_llc = hbm * LLC_BW_FACTOR * HBM_READ_EFF
    bw_read = 1.0 / (in_llc / bw_llc + (1.0 - in_llc) / (hbm * HBM_READ_EFF))
    fabric = g.per_pipe("fabric")
    t_fabric = (unique / bw_read + reread / bw_llc) / fabric \
        + c_bytes / (hbm * np.where(g.cshuffle, WRITE_EFF["cshuffle"], WRITE_EFF["default"]))
    return t_l2, t_fabric


def model_latency(problems: pd.DataFrame, kernels: pd.DataFrame, *, arch: ArchSpec, dtype: DtypeSpec) -> np.ndarray:
    """Noise-free latency in seconds of every kernel on every problem, shape (shapes, kernels).

    ``problems`` has columns m, n, k (and optionally split_k); ``kernels`` the gemm_universal
    kernel fields. Formulas: module docstring, steps 1-8.
    """
    mc = _machine(arch, dtype)
    g = _grid(problems, kernels)
    t = _tiling(g, mc)
    t_cu = _cu_time(g, mc, t)
    t_l2, t_fabric = _memory_times(g, mc, t)
    # 8. total
    p = SMOOTH_P
    t_body = (t_cu**p + t_l2**p + t_fabric**p) ** (1.0 / p)
    return LAUNCH_S + t_body


# -- the table --------------------------------------------------------------------------------------
_CATALOGUES: dict[tuple[str, ...], pd.DataFrame] = {}


def _catalogue(op: OpDefinition, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec) -> pd.DataFrame:
    """``op.catalogue(...)``, memoised per (op, arch, dtype, layout): building 4,608 names costs
    half a second and the frame is only read here."""
    key = (op.name, str(arch_value(arch, "name")), str(getattr(dtype, "name", dtype)),
           str(getattr(dtype, "bytes_per_element", "")), str(getattr(layout, "name", layout)))
    if key not in _CATALOGUES:
        _CATALOGUES[key] = op.catalogue(arch, dtype, layout)
    return _CATALOGUES[key]


def simulate(shapes_df: pd.DataFrame, op: OpDefinition, arch: ArchSpec, dtype: DtypeSpec, layout: LayoutSpec, *,
             seed: int = 0, noise_seed: int | None = None, source: str = "simulated") -> pd.DataFrame:
    """Simulate a benchmark run of the op's catalogue on ``shapes_df``: the canonical table.

    Parameters
    ----------
    shapes_df
        Problems with columns m, n, k (split_k optional, default 1).
    op
        The op definition (its catalogue, validity rules and FLOP count are used; to simulate
        another catalogue, bind it with :meth:`~ckpred.kernels.base.OpDefinition.bind_catalogue`).
    arch, dtype, layout
        Composed config groups (or objects with the same attributes).
    seed
        Seed of the simulated machine: kernel idiosyncrasies, runtime failures and, unless
        ``noise_seed`` is given, the run-to-run noise.
    noise_seed
        Seed of the run-to-run noise alone (a second "run" of the same machine).
    source
        Value of the ``source`` column.

    Returns
    -------
    DataFrame
        One row per (shape, kernel), shapes-major, with the canonical columns
        (:func:`ckpred.data.table.canonical_columns`) in order and types.
    """
    cat = _catalogue(op, arch, dtype, layout)
    problems = _problems(shapes_df)
    S, Q = len(problems), len(cat)
    noise_seed = seed if noise_seed is None else noise_seed

    latency = model_latency(problems, cat, arch=arch, dtype=dtype)  # (S, Q) seconds
    latency, row_key = _measured(latency, problems, cat, op, seed=seed, noise_seed=noise_seed)

    p_rep = problems.loc[np.repeat(np.arange(S), Q)].reset_index(drop=True)
    k_rep = cat.loc[np.tile(np.arange(Q), S)].reset_index(drop=True)
    valid, reason = op.validity(p_rep, k_rep, arch=arch, dtype=dtype, layout=layout)
    fail = valid & (_uniform(_hash(seed, 4, row_key)).ravel() < RUNTIME_FAIL_P)
    reason = np.where(fail, RUNTIME_FAIL_REASON, reason)
    valid = valid & ~fail

    lat = latency.ravel()
    flops = op.flops(p_rep)
    moved = _bytes_moved(p_rep, dtype)
    frame = pd.concat([p_rep, k_rep.drop(columns=["kernel_id"])], axis=1)
    frame["op"] = op.name
    frame["arch"] = str(arch_value(arch, "name"))
    frame["dtype"] = str(getattr(dtype, "name", dtype))
    frame["layout"] = str(getattr(layout, "name", layout))
    frame["tflops"] = np.where(valid, flops / lat / 1e12, 0.0)
    frame["latency_ms"] = np.where(valid, lat * 1e3, 0.0)
    frame["bandwidth_gbs"] = np.where(valid, moved / lat / 1e9, np.nan)
    frame["is_valid"] = valid
    frame["invalid_reason"] = reason
    frame["repeats"] = 1
    frame["spread"] = np.nan
    frame["source"] = source
    frame["run_id"] = f"sim-seed{seed}" if noise_seed == seed else f"sim-seed{seed}-noise{noise_seed}"
    return conform(frame, op)


def _problems(shapes_df: pd.DataFrame) -> pd.DataFrame:
    """The m, n, k and split_k (default 1) columns of ``shapes_df`` as int64, indexed 0..n-1."""
    problems = shapes_df.reset_index(drop=True).copy()
    if "split_k" not in problems:
        problems["split_k"] = 1
    return problems[["m", "n", "k", "split_k"]].astype("int64")


def _bytes_moved(p_rep: pd.DataFrame, dtype: DtypeSpec) -> np.ndarray:
    """Bytes each problem reads (A and B) and writes (C) once."""
    b, bc = float(dtypes.bytes_per_element(dtype)), float(dtypes.c_bytes_per_element(dtype))
    m, n, k = (p_rep[c].to_numpy(np.float64) for c in ("m", "n", "k"))
    return (m * k + n * k) * b + m * n * bc


def _measured(latency: np.ndarray, problems: pd.DataFrame, cat: pd.DataFrame, op: OpDefinition, *,
              seed: int, noise_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The noise-free ``latency`` (shapes, kernels) times each kernel's idiosyncrasy (per kernel
    and per kernel and M family, from ``seed``) over the run-to-run noise (from ``noise_seed``),
    and the hash key of each (shape, kernel) row."""
    name_key = _name_keys(cat["kernel_name"].to_numpy())[None, :]
    fam_codes = pd.Categorical(op.family(problems), categories=list(op.families)).codes
    fam = fam_codes.astype(np.uint64)[:, None]
    shape_key = _hash(problems["m"].to_numpy(), problems["n"].to_numpy(),
                      problems["k"].to_numpy(), problems["split_k"].to_numpy())[:, None]
    idio = np.exp(KERNEL_SIGMA * _normal(_hash(seed, 1, name_key))
                  + KERNEL_FAMILY_SIGMA * _normal(_hash(seed, 2, name_key, fam)))
    row_key = _hash(shape_key, name_key)
    return latency * idio / run_noise(_hash(noise_seed, 3, row_key)), row_key


# -- calibration against real measurements ---------------------------------------------------------
#: Calibration targets of issue 3: median |log ratio| of the best TFLOPS, worst family median,
#: and the share of shapes whose real best kernel is in the simulator's top 5%.
CALIBRATION_TARGETS = {"median_abs_log": 0.26, "family_median_abs_log": float(np.log(2.0)), "top5pct_share": 0.60}


def read_oracle_table(path: str | Path) -> pd.DataFrame:
    """Read a real oracle-best table (columns m, n, k, oracle_best_tflops, oracle_best_kernel).

    Raises
    ------
    ckpred.errors.InputFileError
        When the file is missing or lacks a column (the message names both).
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), "no such file (calibration_file must be an oracle-best CSV)")
    real = pd.read_csv(path)
    need = ["m", "n", "k", "oracle_best_tflops", "oracle_best_kernel"]
    missing = [c for c in need if c not in real.columns]
    if missing:
        raise InputFileError(str(path), f"line 1: missing column(s) {missing}; have {list(real.columns)}")
    return real


def calibration_report(table: pd.DataFrame, real: pd.DataFrame, op: OpDefinition) -> dict[str, Any]:
    """Compare a simulated table with real per-shape best measurements.

    Returns per-shape rows (``shapes``: m, n, k, family, real/sim best TFLOPS, |log ratio|,
    percentile rank of the real best kernel in the simulator's order, 0 = best) and the
    summary figures: median and P90 of |log(sim best / real best)|, the same by family, and the
    share of shapes whose real best kernel is in the simulator's top 5%.
    """
    keys = ["m", "n", "k"]
    valid = table.loc[table["is_valid"], [*keys, "kernel_name", "tflops"]].copy()
    groups = valid.groupby(keys, sort=False)["tflops"]
    valid["rank_pct"] = (groups.rank(ascending=False, method="first") - 1.0) / groups.transform("size")
    best = groups.max().rename("sim_best").reset_index()
    rows = real[[*keys, "oracle_best_tflops", "oracle_best_kernel"]].merge(best, on=keys, how="left")
    ranked = valid.rename(columns={"kernel_name": "oracle_best_kernel"})[[*keys, "oracle_best_kernel", "rank_pct"]]
    rows = rows.merge(ranked, on=[*keys, "oracle_best_kernel"], how="left")
    # A real best kernel the simulator reports as failed ranks last.
    rows["rank_pct"] = rows["rank_pct"].fillna(1.0)
    rows["abs_log"] = np.abs(np.log(rows["sim_best"] / rows["oracle_best_tflops"]))
    rows["family"] = op.family(rows)
    summary: dict[str, Any] = {
        "shapes": int(len(rows)),
        "median_abs_log": float(rows["abs_log"].median()),
        "p90_abs_log": float(rows["abs_log"].quantile(0.9)),
        "median_ratio": float(np.exp(np.log(rows["sim_best"] / rows["oracle_best_tflops"]).median())),
        "top5pct_share": float((rows["rank_pct"] <= 0.05).mean()),
        "median_rank_pct": float(rows["rank_pct"].median()),
        "by_family": {},
    }
    for fam in op.families:
        sub = rows[rows["family"] == fam]
        if len(sub):
            summary["by_family"][fam] = {
                "shapes": int(len(sub)),
                "median_abs_log": float(sub["abs_log"].median()),
                "p90_abs_log": float(sub["abs_log"].quantile(0.9)),
                "median_ratio": float(np.exp(np.log(sub["sim_best"] / sub["oracle_best_tflops"]).median())),
                "top5pct_share": float((sub["rank_pct"] <= 0.05).mean()),
            }
    summary["family_median_abs_log"] = max(v["median_abs_log"] for v in summary["by_family"].values())
    summary["meets_targets"] = bool(
        summary["median_abs_log"] <= CALIBRATION_TARGETS["median_abs_log"]
        and summary["family_median_abs_log"] <= CALIBRATION_TARGETS["family_median_abs_log"]
        and summary["top5pct_share"] >= CALIBRATION_TARGETS["top5pct_share"])
    return {"summary": summary, "shapes": rows}


def format_calibration(report: Mapping[str, Any]) -> str:
    """Human-readable calibration report."""
    s = report["summary"]
    lines = [f"calibration over {s['shapes']} real shapes (sim best vs real best TFLOPS)",
             f"  median |log ratio| {s['median_abs_log']:.3f} (target <= {CALIBRATION_TARGETS['median_abs_log']:.2f})"
             f"   P90 {s['p90_abs_log']:.3f}   median ratio x{s['median_ratio']:.3f}",
             f"  real best kernel in the simulator's top 5%: {100 * s['top5pct_share']:.1f}% of shapes "
             f"(target >= {100 * CALIBRATION_TARGETS['top5pct_share']:.0f}%); median percentile rank "
             f"{100 * s['median_rank_pct']:.1f}%",
             "  by M family:  shapes  median|log|  P90|log|  median ratio  top-5% share"]
    for fam, v in s["by_family"].items():
        lines.append(f"    {fam:<8} {v['shapes']:>8}  {v['median_abs_log']:>11.3f}  {v['p90_abs_log']:>8.3f}"
                     f"  {v['median_ratio']:>12.3f}  {100 * v['top5pct_share']:>11.1f}%")
    lines.append(f"  worst family median |log| {s['family_median_abs_log']:.3f} (target <= ln 2 = 0.693); "
                 f"targets {'met' if s['meets_targets'] else 'NOT met'}")
    return "\n".join(lines)


# -- cached tables for configs, the streaming log, the command ------------------------------------
def _plain(node: Any) -> Any:
    return dataclasses.asdict(node) if dataclasses.is_dataclass(node) and not isinstance(node, type) else node


def cache_key(cfg: RecipeConfig | SimulateConfig, shapes: pd.DataFrame) -> str:
    """Hash of everything a simulated table depends on: simulator version, op, arch, dtype,
    layout, seed and the shapes themselves (so an edited shapes file is a new table)."""
    payload = {
        "version": SIMULATOR_VERSION,
        "op": _plain(cfg.op), "arch": _plain(cfg.arch), "dtype": _plain(cfg.dtype),
        "layout": _plain(cfg.layout), "seed": int(cfg.data.seed),
        "shapes": shapes[["m", "n", "k", "split_k"]].to_numpy().tolist(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(cfg: RecipeConfig | SimulateConfig, shapes: pd.DataFrame) -> Path:
    """Where :func:`simulated_table` caches the table of ``cfg`` (under ``data.cache_dir``)."""
    name = f"simulated-{cfg.op.name}-{cfg.arch.name}-{cfg.dtype.name}-{cfg.layout.name}-{cfg.shapes.name}"
    return resolve_path(cfg.data.cache_dir) / f"{name}-{cache_key(cfg, shapes)}.parquet"


def simulated_table(cfg: RecipeConfig | SimulateConfig) -> pd.DataFrame:
    """The simulated canonical table of a composed config (``data.source=simulated``).

    Uses ``cfg.op``, ``arch``, ``dtype``, ``layout``, ``shapes`` and ``data.seed``. The table is
    cached as parquet under ``data.cache_dir`` (resolved against the original working
    directory) with a key that includes :data:`SIMULATOR_VERSION`, so a changed model or
    config regenerates it and an unchanged one is read back.
    """
    op = load_op(cfg.op)
    shapes = load_shapes(cfg.shapes)
    path = cache_path(cfg, shapes)
    if path.is_file():
        cached, problem = _read_cache(path, op, shapes)
        if cached is not None:
            return cached
        # A damaged cache file (truncated by a full disk, a copy or an older writer) is only a
        # cache: say so and regenerate it; the rewrite below replaces it in one rename.
        log.warning("simulator cache %s is unusable (%s); regenerating it", path, problem)
    table = simulate(shapes, op, cfg.arch, cfg.dtype, cfg.layout, seed=int(cfg.data.seed),
                     source=f"simulated:{cfg.shapes.name}")
    write_table(table, path, op)
    return table


def _read_cache(path: Path, op: OpDefinition, shapes: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """The cached table at ``path`` if it is whole and holds exactly ``shapes``, else ``(None, why)``.

    Checked: parquet that reads completely (a truncated file has no footer), the canonical
    columns of ``op``, and the set of (m, n, k, split_k) shapes the cache key promises.
    """
    try:
        table = read_table(path, op)
    except (pa.ArrowException, OSError, CkpredError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    cols = ["m", "n", "k", "split_k"]
    want = set(map(tuple, shapes[cols].to_numpy(np.int64).tolist()))
    have = set(map(tuple, table[cols].drop_duplicates().to_numpy(np.int64).tolist()))
    if want != have:
        return None, f"it holds {len(have)} shapes, the config asks for {len(want)} others"
    return table, ""


_MAJOR = {"r": "RowMajor", "c": "ColumnMajor"}
#: The rule around each shape header of the streaming log.
_RULE = "=" * 80


def _is_log_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(len(_RULE) + 10)
    return head == f"{_RULE}\nShape 0: ".encode()


#: A streaming log as :func:`write_log` writes it: a write replaces an existing file only when it
#: is one (or empty).
LOG_FILE = OwnFile("a streaming log (a rule line, then 'Shape 0: ...')", _is_log_file)


def write_log(table: pd.DataFrame, path: str | Path, *, acc_dtype: str = "fp32", c_dtype: str | None = None) -> Path:
    """Write ``table`` in CK Tile's streaming benchmark log format (:mod:`ckpred.data.readers.stream_log`).

    One ``Shape i: M=.. N=.. K=.. dtype=.. layout=..`` header between ``=====`` rules per shape,
    then one JSON object per valid row with latency, TFLOPS and bandwidth printed with 2
    decimals; invalid rows print nothing, as failed kernels do in a real run. Written beside
    ``path`` and renamed over it; an existing ``path`` that is not such a log is refused
    (:data:`LOG_FILE`).
    """
    path = Path(path)
    rule = _RULE
    with atomic_path(path, LOG_FILE) as tmp, tmp.open("w") as fh:
        for i, ((m, n, k, split_k, dtype, layout), group) in enumerate(
                table.groupby(["m", "n", "k", "split_k", "dtype", "layout"], sort=False)):
            a, b, c = layout
            cdt = c_dtype or dtypes.load_dtype(dtype).c_dtype
            stride = {"r": k, "c": m}[a], {"r": n, "c": k}[b], {"r": n, "c": m}[c]
            problem = (f'"problem": {{"split_k": {split_k}, "m": {m}, "n": {n}, "k": {k}, '
                       f'"stride_a": {stride[0]}, "stride_b": {stride[1]}, "stride_c": {stride[2]}, '
                       f'"dtype_a": "{dtype}", "dtype_b": "{dtype}", "dtype_acc": "{acc_dtype}", '
                       f'"dtype_c": "{cdt}", "layout_a": "{_MAJOR[a]}", "layout_b": "{_MAJOR[b]}", '
                       f'"layout_c": "{_MAJOR[c]}", "structured_sparsity": false}}')
            fh.write(f"{rule}\nShape {i}: M={m} N={n} K={k} dtype={dtype} layout={layout}\n{rule}\n")
            ok = group[group["is_valid"]]
            bandwidth = ok["bandwidth_gbs"].fillna(0.0).to_numpy()
            fh.writelines(
                f'{{"name": "{name}", {problem}, "perf_result": {{"latency(ms)": {lat:.2f}, '
                f'"tflops(TFlops)": {tf:.2f}, "bandwidth(GB/s)": {bw:.2f}}}}}\n'
                for name, lat, tf, bw in zip(ok["kernel_name"].to_numpy(), ok["latency_ms"].to_numpy(),
                                             ok["tflops"].to_numpy(), bandwidth))
    return path


def calibrate(cfg: SimulateConfig, *, out: Callable[[str], object] = print) -> dict[str, Any]:
    """Simulate the shapes of ``cfg.calibration_file`` and compare with their real best TFLOPS.

    The config's arch, dtype and layout must match the file's (gfx950, fp8, rcr for AMD's
    p1_oracle_best_results.csv, whose kernel names carry dtype and layout).
    """
    op = load_op(cfg.op)
    real = read_oracle_table(resolve_path(cfg.calibration_file))
    parsed = op.parse_name(str(real["oracle_best_kernel"].iloc[0]))
    want = f"dtype={parsed.get('dtype')} layout={parsed.get('layout')} (from the kernel names of {cfg.calibration_file})"
    if (parsed.get("dtype"), parsed.get("layout")) != (cfg.dtype.name, cfg.layout.name):
        raise ConfigValueError("dtype/layout", f"{cfg.dtype.name}/{cfg.layout.name}", want)
    table = simulate(real[["m", "n", "k"]], op, cfg.arch, cfg.dtype, cfg.layout, seed=int(cfg.data.seed),
                     source="simulated:calibration")
    report = calibration_report(table, real, op)
    out(format_calibration(report))
    return report
