"""Python runtime: verification (tampering, mismatches), selection, no-kernel routing, OOD, CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ckpred.errors import ConfigValueError, ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.export.build import export_pipeline, reference_selection
from ckpred.runtime import KernelSelector
from export_helpers import TRAIN_SHAPES, configs, fit_pipeline, gemm, synthetic_table

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    op, cfg = gemm(), configs()
    table = synthetic_table(op, cfg, TRAIN_SHAPES)
    pipe = fit_pipeline(op, cfg, table)
    d = tmp_path_factory.mktemp("rt") / "gemm_universal_gfx950_fp8_rcr"
    export_pipeline(pipe, op=op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout, out_dir=d,
                    training=mf.training_section(table, op, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout))
    return op, cfg, pipe, d


@pytest.fixture()
def copy(model, tmp_path):
    d = tmp_path / model[3].name
    shutil.copytree(model[3], d)
    return d


@pytest.mark.slow
def test_select_matches_sklearn_pipeline(model) -> None:
    op, cfg, pipe, d = model
    sel = KernelSelector.load(d, arch="gfx950", dtype="fp8", layout="rcr")
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    for shape in [(128, 1536, 7168), (1, 7168, 4096), (3000, 4096, 512)]:
        answer = sel.select(*shape, top_k=5)
        full = pd.DataFrame([dict(m=shape[0], n=shape[1], k=shape[2], split_k=1)]).merge(cat, how="cross")
        valid, _ = op.validity(full, full, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        ids, scores, n = reference_selection(pipe.predict(op.encode_frame(full)), valid, 5)
        assert answer.ok and answer.num_valid == n
        assert list(answer.ids) == ids.tolist()
        assert list(answer.kernels) == cat["kernel_name"].to_numpy()[ids].tolist()
        assert np.max(np.abs(np.array(answer.scores) - scores)) <= 1e-6


def test_problem_forms_agree_and_defaults_fill(model) -> None:
    sel = KernelSelector.load(model[3])
    a = sel.select(128, 1536, 7168)
    assert a == sel.select(m=128, n=1536, k=7168) == sel.select({"m": 128, "n": 1536, "k": 7168, "split_k": 1})
    assert a.problem == {"m": 128, "n": 1536, "k": 7168, "split_k": 1}
    assert sel.select(M=128, N=1536, K=7168).ids == a.ids
    with pytest.raises(ConfigValueError, match="'problem.q' has invalid value 4; allowed: a field of op"):
        sel.select(m=1, n=2, k=3, q=4)
    with pytest.raises(ConfigValueError, match="'problem.k' has invalid value None; allowed: a value .required"):
        sel.select(m=1, n=2)
    with pytest.raises(ConfigValueError, match="'problem.m' has invalid value 1.5; allowed: an integer in"):
        sel.select(m=1.5, n=2, k=3)
    with pytest.raises(ConfigValueError, match="'top_k' has invalid value 0"):
        sel.select(1, 2, 3, top_k=0)


def test_degenerate_and_unsupported_shapes_get_no_kernel_with_reason(model) -> None:
    sel = KernelSelector.load(model[3])
    for shape in [(64, 1, 4096), (64, 4096, 1)]:
        a = sel.select(*shape)
        assert not a.ok and a.kernels == () and a.num_valid == 0
        assert "degenerate" in a.reason
    a = sel.select(13, 17, 19)  # primes: no tile divides K (rcr needs K % tile_k == 0)
    assert not a.ok and "K not a multiple of tile_k" in a.reason


def test_out_of_distribution_is_flagged(model) -> None:
    sel = KernelSelector.load(model[3])
    inside = sel.select(128, 1536, 7168)
    assert not inside.out_of_distribution and inside.ood_fields == {}
    far = sel.select(100000, 1536, 7168)
    assert far.ok and far.out_of_distribution and far.ood_fields == {"m": (100000, (1, 16384))}


def test_cache_is_bounded_and_hits(model) -> None:
    sel = KernelSelector.load(model[3], cache_size=2)
    first = sel.select(128, 1536, 7168)
    assert sel.select(128, 1536, 7168) is first and sel.cache_hits == 1
    sel.select(256, 1536, 7168)
    sel.select(512, 1536, 7168)
    assert len(sel._cache) == 2
    assert sel.select(128, 1536, 7168) is not first  # evicted, recomputed
    assert sel.select(128, 1536, 7168, top_k=2).ids == first.ids[:2]


def test_changing_top_k_between_calls_answers_each_top_k(model) -> None:
    # run() keeps the top_k input of its last call: a changed top_k must not reuse the old one
    sel = KernelSelector.load(model[3], cache_size=0)
    fresh = {k: KernelSelector.load(model[3], cache_size=0).select(128, 1536, 7168, top_k=k) for k in (1, 3, 7)}
    assert len({len(a.ids) for a in fresh.values()}) == 3
    for k in (3, 1, 7, 7, 3, 1):
        assert sel.select(128, 1536, 7168, top_k=k) == fresh[k]
    assert sel.run(np.array([[128, 1536, 7168, 1]]), 2)[0].shape == (1, 2)
    assert sel.run(np.array([[128, 1536, 7168, 1]]), 4)[0].shape == (1, 4)


def test_select_many_equals_select(model) -> None:
    sel = KernelSelector.load(model[3], cache_size=0)
    probs = pd.DataFrame(TRAIN_SHAPES[:6] + [(64, 1, 64)], columns=["m", "n", "k"])
    many = sel.select_many(probs, top_k=4, batch=3)
    assert many == [sel.select(*row, top_k=4) for row in probs.itertuples(index=False)]


def test_tampered_model_is_refused(copy) -> None:
    data = bytearray((copy / "model.onnx").read_bytes())
    data[-10] ^= 0x01
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ModelMismatchError, match=r"model.onnx: sha256 .* does not match"):
        KernelSelector.load(copy)


def test_swapped_manifest_is_refused(copy) -> None:
    """Editing the manifest (and fixing its hashes) still fails: the model embeds its manifest."""
    man = json.loads((copy / "manifest.json").read_text())
    man["arch"] = "gfx942"
    (copy / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ModelMismatchError, match="does not match the manifest embedded"):
        KernelSelector.load(copy)


def test_edited_catalogue_in_manifest_is_refused(copy) -> None:
    man = json.loads((copy / "manifest.json").read_text())
    man["catalogue"]["rows"][3][1] = "gemm_universal_something_else"
    (copy / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ModelMismatchError, match="does not match the manifest embedded in model.onnx"):
        KernelSelector.load(copy)


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"arch": "gfx942"}, "arch: model is for 'gfx950', asked for 'gfx942'"),
    ({"dtype": "fp16", "layout": "rrr"}, "dtype: model is for 'fp8', asked for 'fp16'; layout: model is for 'rcr'"),
])
def test_mismatched_arch_dtype_layout_is_refused(model, kwargs, text) -> None:
    with pytest.raises(ModelMismatchError) as err:
        KernelSelector.load(model[3], **kwargs)
    assert text in str(err.value)


def test_mismatched_catalogue_is_refused(model) -> None:
    op, cfg, _, d = model
    cat = op.catalogue(cfg.arch, cfg.dtype, cfg.layout)
    other = cat.copy()
    other.loc[7, "kernel_name"] = other.loc[8, "kernel_name"]
    with pytest.raises(ModelMismatchError, match="kernel catalogue differs.*first difference at kernel_id 7"):
        KernelSelector.load(d, catalogue=other)
    with pytest.raises(ModelMismatchError, match="has 4608 kernels.*has 4607"):
        KernelSelector.load(d, catalogue=cat.iloc[:-1])


def test_missing_file_and_missing_manifest(copy, tmp_path) -> None:
    (copy / "scorer.onnx").unlink()
    with pytest.raises(ModelMismatchError, match="scorer.onnx: listed in the manifest but missing"):
        KernelSelector.load(copy)
    with pytest.raises(FileNotFoundError, match="no manifest"):
        KernelSelector.load(tmp_path)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpred", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_select_cli(model, tmp_path) -> None:
    d = model[3]
    out = _cli("select", f"model_dir={d}", "problem.m=128", "problem.n=1536", "problem.k=7168", "top_k=3", "json=true",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    want = KernelSelector.load(d).select(128, 1536, 7168, top_k=3).to_dict()
    assert got == json.loads(json.dumps(want))
    table = _cli("select", f"model_dir={d}", "problem.m=64", "problem.n=1", "problem.k=4096", cwd=tmp_path)
    assert table.returncode == 0 and "no kernel" in table.stdout and "degenerate" in table.stdout
    wrong = _cli("select", f"model_dir={d}", "arch=gfx942", "problem.m=1", "problem.n=2", "problem.k=3", cwd=tmp_path)
    assert wrong.returncode != 0 and "arch: model is for 'gfx950', asked for 'gfx942'" in wrong.stderr
    missing = _cli("select", "problem.m=1", "problem.n=2", "problem.k=3", cwd=tmp_path)
    assert missing.returncode != 0 and "python -m ckpred export op=gemm_universal arch=gfx950" in missing.stderr
