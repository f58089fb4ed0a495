"""The declared layout holds: configs at the top level shipped in the wheel, user config dirs."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


def _packages_on_disk() -> set[str]:
    found = {str(p.parent.relative_to(REPO)).replace(os.sep, ".") for p in (REPO / "ckpred").rglob("__init__.py")}
    return found | {"ckpred.conf"}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == _packages_on_disk()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, cwd=out)
    (path,) = out.glob("ckpred-*.whl")
    return path


@pytest.mark.slow
def test_wheel_carries_every_config_and_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for cfg in (REPO / "conf").rglob("*.yaml"):
        assert f"ckpred/conf/{cfg.relative_to(REPO / 'conf').as_posix()}" in names
    for module in (REPO / "ckpred").rglob("*.py"):
        assert module.relative_to(REPO).as_posix() in names


@pytest.mark.slow
def test_wheel_composes_configs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([sys.executable, "-c", "import ckpred, ckpred.config as c; print(ckpred.__file__); "
                            "print(c.CONF_DIR)"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in probe.stdout.split()), probe.stdout
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "arch=gfx942", "dtype=fp16", "--cfg", "job"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert "name: gfx942" in job.stdout


def test_user_config_dir_adds_an_option_without_editing_the_package(tmp_path: Path) -> None:
    user = tmp_path / "my_conf" / "arch"
    user.mkdir(parents=True)
    gfx950 = (REPO / "conf" / "arch" / "gfx950.yaml").read_text()
    (user / "mygpu.yaml").write_text(gfx950.replace("name: gfx950", "name: mygpu").replace("cus: 256", "cus: 128"))
    job = subprocess.run([sys.executable, "-m", "ckpred", "train", "--config-dir", str(tmp_path / "my_conf"),
                          "arch=mygpu", "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert "name: mygpu" in job.stdout and "cus: 128" in job.stdout
