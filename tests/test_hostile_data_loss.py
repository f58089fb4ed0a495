"""Hostile inputs that used to lose data or run code from data: each is now refused by name.

Grouped as in the hostile-input report (ids in brackets):

* outputs never replace what ckpred did not write: a user's directory, ``out=.``, ``out=``
  (the working directory), a symlinked directory, ``${oc.env:HOME}`` [od01 od02 od03 cl15
  cl16], and the same for exports, datasets, table files, rejects and logs;
* a command re-run on its own previous output replaces it, with the umask's mode [ig35 cl32];
* a file truncated while it is ingested ends in a named error, never a partial table or
  SIGBUS, and leaves no temporary files [ig05 ig06];
* modules named by an export, an op YAML or a feature group are imported only when the user
  installed or allowed them [x06p pl02 pl08 ft03];
* a partition manifest that disagrees with its files is refused by both backends, which read
  the same rows [dk08 dk10 dk11 dk12 dk13 dk15 dk16 dk18].
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

import ckpred.cli
from ckpred.errors import ConfigValueError, InputFileError, ModelMismatchError, OutputPathError
from tests.conftest import data_file
from tests.test_hostile import TRACEBACK, assert_named, digest, run

#: The real 4-shape CK table (fp16 parity sweep).
FOUR_SHAPES = ("ck_gemm_gfx950_results", "parity_sweep_results.csv")
INGEST = ["ingest", "dtype=fp16", "data.source=path"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hydra._internal.utils.is_under_debugger", lambda: False)


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    path.write_bytes(data_file(*FOUR_SHAPES).read_bytes())
    return path


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry below ``root``: file bytes, ``dir`` or the target of a symlink."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def user_dir(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("thesis")
    (path / "sub" / "important.dat").write_text("data")
    return path


# -- F04: code named by data -------------------------------------------------------------------------
_PWN = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n"


def _plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A module ``name`` on sys.path (the working directory, as ``python -m`` has it) that
    writes a marker file when imported."""
    marker = tmp_path / f"PWNED_{name}"
    (tmp_path / f"{name}.py").write_text(_PWN.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CKPRED_ALLOW_PLUGINS", raising=False)
    return marker


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export_helpers import export_gemm

    return export_gemm(tmp_path_factory.mktemp("plug") / "gemm_universal_gfx950_fp8_rcr", n_estimators=5)


def test_a_forged_export_naming_a_plugin_runs_nothing(export: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """x06p: the manifest (and its copy in model.onnx, hashes recomputed) names a module of
    the working directory as its op's plug-in. Loading refuses it before importing it; the
    caller may allow it explicitly."""
    import shutil

    from ckpred.runtime import KernelSelector
    from test_hostile_runtime import embed, read, write

    marker = _plugin_module(tmp_path, monkeypatch, "rt_plug")
    forged = tmp_path / "forged"
    shutil.copytree(export, forged)
    man = read(forged)
    man["op_config"]["plugin"] = "rt_plug:X"
    embed(forged, man)
    write(forged, man)
    with pytest.raises(ModelMismatchError) as err:
        KernelSelector.load(forged)
    message = str(err.value)
    assert "\n" not in message and "'rt_plug' is not one, so it was not imported" in message
    assert "CKPRED_ALLOW_PLUGINS=rt_plug" in message and "allow_plugins=['rt_plug']" in message
    assert not marker.exists() and "rt_plug" not in sys.modules
    with pytest.raises(ModelMismatchError, match="a subclass of ckpred.kernels.declared.DeclaredOp in rt_plug"):
        KernelSelector.load(forged, allow_plugins=["rt_plug"])  # allowed: imported, then refused by its type
    assert marker.exists()
    sys.modules.pop("rt_plug", None)
    assert KernelSelector.load(export).manifest["op"] == "gemm_universal"  # the packaged plug-in loads


def _user_conf(tmp_path: Path) -> Path:
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(Path(__file__).parent / "fixtures" / "user_op", conf)
    return conf


@pytest.mark.parametrize(("case", "edit", "key"), [
    ("pl02 op plugin", lambda op, feats: (op.replace("name: tmm\n", "name: tmm\nplugin: evilplug:X\n"), feats),
     "op.plugin"),
    ("pl08 op plugin of the standard library", lambda op, feats: (op.replace("name: tmm\n", "name: tmm\nplugin: this:X\n"),
                                                                  feats), "op.plugin"),
    ("ft03 feature class", lambda op, feats: (op, feats.replace("  - kind: expressions", "  - kind: evilplug:F\n"
                                                                "  - kind: expressions", 1)), "features.groups[0].kind"),
])
def test_configs_naming_a_module_import_nothing(case: str, edit: Callable[[str, str], tuple[str, str]], key: str,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """pl02 / pl08 / ft03: ``plugin:`` in an op YAML and ``kind: module:Class`` in a feature set
    are refused at compose, naming the module and how to allow it, before it is imported (the
    standard library's ``this`` would print the Zen of Python)."""
    marker = _plugin_module(tmp_path, monkeypatch, "evilplug")
    conf = _user_conf(tmp_path)
    op_file, feats_file = conf / "op" / "tmm.yaml", conf / "features" / "tmm_feats.yaml"
    op_text, feats_text = edit(op_file.read_text(), feats_file.read_text())
    op_file.write_text(op_text)
    feats_file.write_text(feats_text)
    sys.modules.pop("this", None)
    rc, out, err = run(["train", f"--config-dir={conf}", "op=tmm", "features=tmm_feats", "data=path",
                        "data.path=none.csv"], capsys)
    module = "this" if "this:" in op_text else "evilplug"
    assert_named(rc, err, "train", f"'{key}'", f"{module!r} is not one, so it was not imported",
                 f"CKPRED_ALLOW_PLUGINS={module}")
    assert not marker.exists() and "evilplug" not in sys.modules and "this" not in sys.modules
    assert "Beautiful is better" not in out
    if module == "evilplug":  # allowed by the user: passes compose (the op plug-in is imported there)
        monkeypatch.setenv("CKPRED_ALLOW_PLUGINS", "evilplug")
        rc, _, err = run(["train", f"--config-dir={conf}", "op=tmm", "features=tmm_feats", "data=path",
                          "data.path=none.csv"], capsys)
        assert_named(rc, err, "train", "evilplug" if key == "op.plugin" else "none.csv")
        assert marker.exists() == (key == "op.plugin")
    sys.modules.pop("evilplug", None)


def test_plugin_policy_allows_ckpred_registered_and_listed_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpred.plugins import allowed_plugins, is_allowed, registered_modules

    monkeypatch.delenv("CKPRED_ALLOW_PLUGINS", raising=False)
    assert {"ckpred.kernels.gemm_universal", "ckpred.kernels.grouped_conv_fwd"} <= registered_modules()
    assert is_allowed("ckpred.features.conv") and not is_allowed("ckpred.__main__")
    assert not is_allowed("mypkg.ops") and not is_allowed("os") and not is_allowed("../x")
    with allowed_plugins(["mypkg"]):
        assert is_allowed("mypkg.ops") and not is_allowed("mypkgx")
    assert not is_allowed("mypkg.ops")
    monkeypatch.setenv("CKPRED_ALLOW_PLUGINS", "mypkg, other.mod")
    assert is_allowed("mypkg") and is_allowed("other.mod.sub") and not is_allowed("other")
    with pytest.raises(ConfigValueError, match="allow_plugins"):
        with allowed_plugins(["../evil"]):
            pass
