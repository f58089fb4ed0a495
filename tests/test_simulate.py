"""The simulator: shape sets, table contract, determinism, validity, noise, physics, cache, log, calibration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ckpred.data.simulate as sim
from ckpred.commands.simulate import simulate_command
from ckpred.config import compose
from ckpred.data.shapes import load_shapes, read_shapes_csv
from ckpred.data.table import canonical_columns, read_table
from ckpred.errors import ConfigValueError, InputFileError
from ckpred.kernels.gemm_universal import OP
from tests.conftest import data_file


@pytest.fixture(scope="module")
def cfg():  # type: ignore[no-untyped-def]
    return compose("simulate", ["shapes=tiny"])


@pytest.fixture(scope="module")
def tiny(cfg) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    return sim.simulate(load_shapes(cfg.shapes), OP, cfg.arch, cfg.dtype, cfg.layout, seed=0)


def _per_shape(table: pd.DataFrame, column: str = "tflops") -> np.ndarray:
    shapes = table.groupby(["m", "n", "k"], sort=False).ngroups
    return table[column].to_numpy().reshape(shapes, -1)


# -- shape sets ----------------------------------------------------------------------------------
def test_default_set_has_the_real_mix() -> None:
    shapes = load_shapes(compose("simulate", []).shapes)
    assert len(shapes) == 168 and not shapes.duplicated().any()
    assert (shapes.m == 1).sum() == 60  # about a third decode shapes, like AMD's 168
    assert sorted(set(shapes.m[shapes.m > 1])) == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 20480]
    assert (shapes[shapes.m > 1].groupby("m").size() == 9).all()
    assert list(shapes.columns) == ["m", "n", "k", "split_k"] and (shapes.split_k == 1).all()


@pytest.mark.parametrize("name", ["tiny", "llm", "wide", "edge"])
def test_every_named_set_loads(name: str) -> None:
    shapes = load_shapes(compose("simulate", [f"shapes={name}"]).shapes)
    assert len(shapes) >= 12 and not shapes[["m", "n", "k"]].duplicated().any()
    fams = set(OP.family(shapes))
    if name == "tiny":
        assert len(shapes) == 12 and fams == set(OP.families)
    if name == "llm":
        assert shapes.m.min() == 1 and shapes.m.max() == 20480 and fams == set(OP.families)
    if name == "wide":
        assert ((shapes.m == shapes.n) & (shapes.n == shapes.k)).sum() >= 10  # cubes
        assert (shapes.k >= 32768).any() and (shapes.k <= 128).any() and (shapes.n >= 65536).any()
        assert {7, 61, 127}.issubset(set(shapes.m))  # primes
    if name == "edge":
        assert (shapes.n == 1).any() and (shapes.k == 1).any() and (shapes.n < 64).any()


@pytest.mark.slow
def test_max_shapes_thins_evenly() -> None:
    shapes = load_shapes(compose("simulate", ["shapes.max_shapes=10"]).shapes)
    full = load_shapes(compose("simulate", []).shapes)
    assert len(shapes) == 10 and shapes.iloc[0].equals(full.iloc[0]) and shapes.iloc[-1].equals(full.iloc[-1])


def test_shapes_file(tmp_path: Path) -> None:
    good = tmp_path / "shapes.csv"
    good.write_text("name,M,N,K\na,1,4096,2048\nb,128,1536,7168\n\nc,1,4096,2048\n")
    cfg = compose("simulate", ["shapes=file", f"shapes.path={good}"])
    assert load_shapes(cfg.shapes)[["m", "n", "k"]].values.tolist() == [[1, 4096, 2048], [128, 1536, 7168]]
    bad = tmp_path / "bad.csv"
    bad.write_text("M,N,K\n1,2,3\n4,x5,6\n")
    with pytest.raises(InputFileError, match=r"bad\.csv.*line 3: N='x5' is not a positive integer"):
        read_shapes_csv(bad)
    (tmp_path / "nok.csv").write_text("M,N\n1,2\n")
    with pytest.raises(InputFileError, match=r"nok\.csv.*line 1.*lacks column\(s\) \['K'\]"):
        read_shapes_csv(tmp_path / "nok.csv")
    with pytest.raises(InputFileError, match="missing.csv"):
        load_shapes(compose("simulate", ["shapes=file", f"shapes.path={tmp_path / 'missing.csv'}"]).shapes)


@pytest.mark.parametrize(("override", "key"), [("shapes.max_shapes=-1", "shapes.max_shapes"),
                                               ("shapes.families.mix.count=-2", "shapes.families.mix.count"),
                                               ("shapes.families.mix.n=[1,2]", "shapes.families.mix.n")])
def test_bad_shape_config_names_key(override: str, key: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        compose("simulate", ["shapes=tiny", override])
    assert err.value.key == key


# -- the table -------------------------------------------------------------------------------------
def test_table_contract(tiny: pd.DataFrame) -> None:
    assert list(tiny.columns) == canonical_columns(OP)
    assert len(tiny) == 12 * 4608
    assert (tiny.op == "gemm_universal").all() and (tiny.arch == "gfx950").all() and (tiny.run_id == "sim-seed0").all()
    valid = tiny[tiny.is_valid]
    assert (valid.tflops > 0).all() and (tiny.loc[~tiny.is_valid, "tflops"] == 0).all()
    assert (tiny.loc[~tiny.is_valid, "invalid_reason"] != "").all() and (valid.invalid_reason == "").all()
    flops = OP.flops(valid)
    np.testing.assert_allclose(valid.tflops * valid.latency_ms * 1e9, flops, rtol=1e-9)


def test_deterministic_and_row_independent(cfg, tiny: pd.DataFrame) -> None:  # type: ignore[no-untyped-def]
    shapes = load_shapes(cfg.shapes)
    again = sim.simulate(shapes, OP, cfg.arch, cfg.dtype, cfg.layout, seed=0)
    pd.testing.assert_frame_equal(tiny, again)
    # A row depends on its shape, kernel and seed only, not on what is simulated with it.
    part = sim.simulate(shapes.iloc[[5, 2]], OP, cfg.arch, cfg.dtype, cfg.layout, seed=0)
    expect = pd.concat([tiny.iloc[5 * 4608:6 * 4608], tiny.iloc[2 * 4608:3 * 4608]], ignore_index=True)
    pd.testing.assert_frame_equal(part, expect)
    other = sim.simulate(shapes.iloc[:2], OP, cfg.arch, cfg.dtype, cfg.layout, seed=1)
    assert not np.allclose(other.tflops, tiny.tflops[: len(other)])


def test_validity_follows_rules_plus_a_few_runtime_failures(tiny: pd.DataFrame) -> None:
    rule_valid, _ = OP.validity(tiny, tiny, layout="rcr")
    assert not (tiny.is_valid & ~rule_valid).any()
    runtime = ~tiny.is_valid & rule_valid
    assert (tiny.loc[runtime, "invalid_reason"] == sim.RUNTIME_FAIL_REASON).all()
    assert 0.001 < runtime.sum() / rule_valid.sum() < 0.012
    invalid_share = 1 - _per_shape(tiny, "is_valid").mean(axis=1)
    assert 0.10 < invalid_share.mean() < 0.30  # about the ~19% of real runs
    # N=4096 (not a multiple of 192): 864 of 4,608 kernels rejected by rule, as on real gfx950.
    assert 0.18 < invalid_share[0] < 0.21


def test_noise_has_the_real_run_to_run_size(cfg, tiny: pd.DataFrame) -> None:  # type: ignore[no-untyped-def]
    rerun = sim.simulate(load_shapes(cfg.shapes), OP, cfg.arch, cfg.dtype, cfg.layout, seed=0, noise_seed=7)
    both = tiny.is_valid & rerun.is_valid
    diff = np.abs(tiny.tflops[both] / rerun.tflops[both] - 1)
    assert 0.006 < np.median(diff) < 0.010  # real: 0.8%
    assert 0.025 < np.quantile(diff, 0.9) < 0.042  # real: 3.3%
    assert (tiny.is_valid == rerun.is_valid).all()  # failures belong to the machine, not the run


def test_selection_is_hard_and_physical(cfg, tiny: pd.DataFrame) -> None:  # type: ignore[no-untyped-def]
    perf = _per_shape(tiny)
    best = perf.max(axis=1)
    peak = cfg.arch.peak_tflops["fp8"]
    m = tiny.m.to_numpy()[:: 4608]
    assert (best[m == 1] < 0.005 * peak).all()  # decode: memory/launch bound
    k = tiny.k.to_numpy()[:: 4608]
    assert (best[m >= 4096] > 0.15 * peak).all() and (best[(m >= 4096) & (k >= 4096)] > 0.35 * peak).all()
    assert (best < 0.6 * peak).all()  # real CK Tile fp8 on gfx950 peaks at ~44% of the MFMA peak
    eff = perf / best[:, None]
    assert len(set(perf.argmax(axis=1))) >= 6  # the best kernel changes with the shape
    static = eff.mean(axis=0).max()
    assert 0.6 < static < 0.95  # the best single kernel is clearly below the oracle
    assert eff.mean() < 0.5  # a random pick is far below


def test_unknown_arch_is_refused(cfg) -> None:  # type: ignore[no-untyped-def]
    other = compose("simulate", ["arch=gfx1151", "dtype=fp16"])
    kernels = OP.catalogue("gfx950", "fp16", "rcr").head(3)
    with pytest.raises(ValueError, match="arch.isa.*gfx1151.*micro-architecture constants for"):
        sim.model_latency(load_shapes(cfg.shapes), kernels, arch=other.arch, dtype=other.dtype)


# -- cache, log, command -------------------------------------------------------------------------
def test_cache_is_reused_and_regenerated_on_version_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose("simulate", ["shapes=tiny", "shapes.max_shapes=2", f"data.cache_dir={tmp_path}"])
    first = sim.simulated_table(cfg)
    files = list(tmp_path.glob("*.parquet"))
    assert len(files) == 1 and "tiny" in files[0].name
    assert (first.source == "simulated:tiny").all()
    calls: list[int] = []
    real_simulate = sim.simulate
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: calls.append(1) or real_simulate(*a, **k))
    pd.testing.assert_frame_equal(sim.simulated_table(cfg), first)
    assert calls == []  # read back from the cache
    monkeypatch.setattr(sim, "SIMULATOR_VERSION", sim.SIMULATOR_VERSION + "-next")
    again = sim.simulated_table(cfg)
    assert calls == [1] and len(list(tmp_path.glob("*.parquet"))) == 2
    pd.testing.assert_frame_equal(again, first)
    seeded = compose("simulate", ["shapes=tiny", "shapes.max_shapes=2", f"data.cache_dir={tmp_path}", "data.seed=3"])
    assert sim.cache_path(seeded, load_shapes(seeded.shapes)) != sim.cache_path(cfg, load_shapes(cfg.shapes))


def test_command_writes_out_and_reuses_the_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["shapes=tiny", "shapes.max_shapes=2", f"data.cache_dir={tmp_path / 'cache'}"]
    share = simulate_command(compose("simulate", [*base, f"out={tmp_path / 'a.parquet'}"]))
    first = read_table(tmp_path / "a.parquet", OP)
    assert share == pytest.approx(first.is_valid.mean()) and len(first) == 2 * 4608
    simulate_command(compose("simulate", [*base, f"out={tmp_path / 'b' / 'b.parquet'}"]))
    (cached,) = (tmp_path / "cache").glob("*.parquet")
    assert (tmp_path / "b" / "b.parquet").read_bytes() == cached.read_bytes()
    assert "9,216 rows" in capsys.readouterr().out


def test_streaming_log_round_trips_through_ingest(tiny: pd.DataFrame, tmp_path: Path) -> None:
    from ckpred.data.ingest import read_files

    table = tiny[tiny.m.isin([64, 2048]) & (tiny.tile_k == 256)].reset_index(drop=True)
    log = sim.write_log(table, tmp_path / "run.log")
    lines = log.read_text().splitlines()
    assert lines[0] == "=" * 80 and lines[1].startswith("Shape 0: M=64 N=7168 K=2048 dtype=fp8 layout=rcr")
    assert len([ln for ln in lines if ln.startswith("{")]) == table.is_valid.sum()  # failures print nothing
    back = read_files(log, OP, arch="gfx950", dtype="fp8", layout="rcr").table
    assert back.is_valid.all() and len(back) == table.is_valid.sum()
    merged = back.merge(table, on=["m", "n", "k", "kernel_name"], suffixes=("", "_sim"))
    assert len(merged) == len(back)
    np.testing.assert_allclose(merged.tflops, merged.tflops_sim, atol=0.0051)
    for name in OP.kernel_names:
        assert (merged[name] == merged[f"{name}_sim"]).all()


@pytest.mark.slow
def test_cli_writes_table_and_log(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ckpred", "simulate", "shapes=tiny", "shapes.max_shapes=2",
                          f"out={tmp_path / 't.parquet'}", f"log={tmp_path / 't.log'}",
                          f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "simulated 9,216 rows (2 shapes x 4,608 kernels" in out.stdout
    assert len(read_table(tmp_path / "t.parquet", OP)) == 9216 and (tmp_path / "t.log").stat().st_size > 0


# -- calibration against real gfx950 measurements --------------------------------------------------
@pytest.mark.slow
def test_calibration_meets_targets() -> None:
    path = data_file("ck_gemm_gfx950_results", "p1_oracle_best_results.csv")
    cfg = compose("simulate", [f"calibration_file={path}"])
    lines: list[str] = []
    report = sim.calibrate(cfg, out=lines.append)
    s = report["summary"]
    assert s["shapes"] == 168
    assert s["median_abs_log"] <= 0.26
    assert s["family_median_abs_log"] <= np.log(2.0)
    assert set(s["by_family"]) == set(OP.families)
    assert "median |log ratio|" in lines[0] and "top 5%" in lines[0]


def test_calibration_refuses_another_dtype(tmp_path: Path) -> None:
    path = data_file("ck_gemm_gfx950_results", "p1_oracle_best_results.csv")
    cfg = compose("simulate", ["dtype=fp16", f"calibration_file={path}"])
    with pytest.raises(ConfigValueError, match="dtype=fp8 layout=rcr"):
        sim.calibrate(cfg)
    bad = tmp_path / "oracle.csv"
    bad.write_text("m,n,k,best\n1,2,3,4\n")
    with pytest.raises(InputFileError, match=r"oracle\.csv.*oracle_best_tflops"):
        sim.read_oracle_table(bad)
