"""A dtype the package does not know, added as one YAML file in a user config dir, end to end.

The config dir holds ``dtype/mxfp4.yaml`` (a packed 4-bit type: half a byte per element), an
arch config whose peak lists it, and the YAML op ``tmm`` whose ``precision`` field holds it
beside ``bfloat16`` (the table's spelling of bf16, an alias in the package's dtype config); the
op's rules and features read ``dtype_bytes(precision)``. Nothing in the package names mxfp4: ingest,
train and export run with ``dtype=mxfp4``, ``select`` answers on the command line, the Python
runtime loads the export in a process that never saw the config dir (the manifest carries the
dtype), and the C++ selector gives the same answers.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpred.cli import main
from test_cpp import binary  # noqa: F401  (fixture: builds the C++ selector)
from test_user_op_end_to_end import USER_CONF, write_table
from tests.conftest import REPO

MXFP4 = """\
# MX fp4 (E2M1, 32-element blocks with an E8M0 scale): 4 bits per element.
defaults:
  - base_dtype
  - _self_
name: mxfp4
bytes_per_element: 0.5
c_dtype: bf16
aliases: [float4_e2m1fn_x2]
"""
#: A rule naming the new dtype by its alias: loading the export must know what it spells.
RULE = """\
  - expr: "block_m * block_n * dtype_bytes('float4_e2m1fn_x2') <= hw.lds_bytes"
    message: "the C tile in fp4 exceeds LDS"
"""
LDS_KIB = 16
PROBLEMS = [(512, 256, 1024, "mxfp4"), (64, 128, 256, "fp16"), (2048, 512, 1024, "mxfp4"),
            (100, 300, 700, "bfloat16")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("user_dtype")
    conf = tmp / "conf"
    shutil.copytree(USER_CONF, conf)
    (conf / "dtype").mkdir()
    (conf / "dtype" / "mxfp4.yaml").write_text(MXFP4)
    arch = (REPO / "conf" / "arch" / "gfx950.yaml").read_text()
    # the edits below must hit (a renamed key would otherwise leave the packaged LDS in the copy)
    assert "shared_memory_kib: 160\n" in arch and arch.rstrip().splitlines()[-1].startswith("  ")
    (conf / "arch").mkdir()
    # a small LDS, so the op's rule (staged tiles x dtype_bytes(precision) <= LDS) tells sizes apart
    (conf / "arch" / "gfx950_fp4.yaml").write_text(
        arch.replace("name: gfx950", "name: gfx950_fp4\nisa: gfx950")
        .replace("shared_memory_kib: 160", f"shared_memory_kib: {LDS_KIB}")
        + "  mxfp4: 10066.0\n")
    op = (conf / "op" / "tmm.yaml").read_text()
    # kernel names spell the run's dtype, as CK's do ({dtype}: one of the dtypes in use)
    (conf / "op" / "tmm.yaml").write_text(op.replace("values: [fp16, bf16, fp32]", "values: [fp16, bfloat16, mxfp4]")
                                          .replace('template: "bm{', 'template: "{dtype}_bm{')
                                          .replace("rules:\n", "rules:\n" + RULE))
    csv = tmp / "tmm.csv"
    lines = gzip.open(write_table(tmp / "tmm.csv.gz", n_shapes=18), "rt").read().splitlines()
    csv.write_text("\n".join(line.replace(",fp32,", ",mxfp4,").replace(",bf16,", ",bfloat16,") for line in lines)
                   + "\n")
    common = ["--config-dir", str(conf), "op=tmm", "arch=gfx950_fp4", "dtype=mxfp4"]
    recipe = ["features=tmm_feats", "data=path", f"data.path={csv}"]

    def cli(command: str, *args: str) -> None:
        assert main([command, *common, f"hydra.run.dir={tmp / 'hydra' / command}", *args]) == 0

    cli("ingest", f"data.path={csv}", f"out={tmp / 'tmm.parquet'}")
    cli("train", *recipe, "model.n_estimators=20", "model.n_jobs=1", "cv.n_splits=3", "plots=false", "progress=false",
        f"out_dir={tmp / 'run'}")
    cli("export", *recipe, f"run_dir={tmp / 'run'}", f"out_dir={tmp / 'ex'}")
    return conf, tmp, tmp / "ex" / "tmm_gfx950_fp4_mxfp4_rcr"


@pytest.mark.slow
def test_ingest_keeps_every_precision(exported: tuple[Path, Path, Path]) -> None:
    import pandas as pd

    _, tmp, _ = exported
    table = pd.read_parquet(tmp / "tmm.parquet")
    assert set(table["precision"]) == {"fp16", "bfloat16", "mxfp4"} and set(table["dtype"]) == {"mxfp4"}


def test_the_rules_read_the_new_dtypes_size_and_the_alias(exported: tuple[Path, Path, Path]) -> None:
    """``(block_m + block_n) * 64 * dtype_bytes(precision) * num_stages <= lds``: mxfp4 counts half
    a byte, bfloat16 two (bf16's), in the op's numpy rules and in the exported selector's mask."""
    import pandas as pd

    from ckpred.config import compose
    from ckpred.kernels.base import load_op
    from ckpred.runtime import KernelSelector
    from test_user_op_end_to_end import KERNELS

    conf, _, model = exported
    cfg = compose("select", ["op=tmm", "arch=gfx950_fp4", "dtype=mxfp4", "problem.rows=64", "problem.cols=64",
                             "problem.depth=64", "problem.precision=fp16"], config_dir=conf)
    op = load_op(cfg.op)
    kernels = pd.DataFrame(KERNELS, columns=["block_m", "block_n", "num_warps", "num_stages"])
    sel = KernelSelector.load(model, cache_size=0)
    for precision, size in (("mxfp4", 0.5), ("fp16", 2), ("bfloat16", 2)):
        problems = pd.DataFrame({"rows": [64] * len(kernels), "cols": 64, "depth": 64, "precision": precision})
        valid, _ = op.validity(problems, kernels, arch=cfg.arch, dtype=cfg.dtype, layout=cfg.layout)
        fits = [(bm + bn) * 64 * size * s <= LDS_KIB * 1024 for bm, bn, _, s in KERNELS]
        assert list(valid) == fits and 0 < sum(fits) < len(fits)
        # the selector's mask: no kernel it answers breaks the rule for the problem's precision
        for name in sel.select(64, 64, 64, precision, top_k=54).kernels:
            bm, bn, w, s = (int(part[1:].lstrip("mnws")) for part in name.split("_")[1:])
            assert (bm + bn) * 64 * size * s <= LDS_KIB * 1024


def test_select_on_the_command_line(exported: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    conf, tmp, model = exported
    capsys.readouterr()
    assert main(["select", "--config-dir", str(conf), "op=tmm", "arch=gfx950_fp4", "dtype=mxfp4",
                 f"exports_dir={tmp / 'ex'}", "problem.rows=512", "problem.cols=256", "problem.depth=1024",
                 "problem.precision=mxfp4", "top_k=3", "json=true"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["ok"] and len(got["kernels"]) == 3


@pytest.mark.slow
def test_python_runtime_loads_it_without_the_config_dir(exported: tuple[Path, Path, Path]) -> None:
    """A fresh process that never composed the user's configs: the manifest's vocabulary says
    what mxfp4 is."""
    _, _, model = exported
    code = ("import json, sys; from ckpred.runtime import KernelSelector; "
            f"sel = KernelSelector.load({str(model)!r}, arch='gfx950_fp4', dtype='mxfp4', cache_size=0); "
            f"print(json.dumps([sel.select(*p, top_k=5).to_dict() for p in {PROBLEMS!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=model.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    answers = json.loads(out.stdout)
    assert all(a["ok"] for a in answers) and all(k["name"].startswith("mxfp4_bm") for k in answers[0]["kernels"])
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["dtype"] == "mxfp4"
    assert manifest["vocabulary"]["dtypes"]["mxfp4"] == {"bytes_per_element": 0.5, "c_dtype": "bf16",
                                                          "accumulator": "fp32", "aliases": ["float4_e2m1fn_x2"]}


def test_cpp_selector_gives_the_python_answers(exported: tuple[Path, Path, Path], binary: Path) -> None:  # noqa: F811
    from ckpred.runtime import KernelSelector

    _, _, model = exported
    out = subprocess.run([str(binary), str(model), "--dtype", "mxfp4", "--top-k", "5",
                          *[",".join(map(str, p)) for p in PROBLEMS]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    sel = KernelSelector.load(model, cache_size=0)
    for line, p in zip(out.stdout.splitlines(), PROBLEMS):
        got, want = json.loads(line), sel.select(*p, top_k=5)
        assert [k["id"] for k in got["kernels"]] == list(want.ids)
        assert [k["score"] for k in got["kernels"]] == list(want.scores)


def test_without_the_config_dir_the_dtype_is_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "dtype=mxfp4", "--cfg", "job"])
    err = capsys.readouterr().err
    assert "dtype/mxfp4" in err and "fp16" in err  # Hydra names the options there are
