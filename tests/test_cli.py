"""The CLI through a subprocess, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from ckpred.cli import COMMANDS
from ckpred.config import CONF_DIR


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckpred", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for name, cmd in COMMANDS.items():
        assert name in out.stdout and cmd.summary in out.stdout


def test_unknown_command_lists_known_ones() -> None:
    out = _run("trian")
    assert out.returncode == 2
    assert "unknown command 'trian'" in out.stderr
    for name in COMMANDS:
        assert name in out.stderr



def _required_groups(config_name: str) -> list[str]:
    """The config groups a command's primary config leaves for the command line (``group: ???``)."""
    defaults = yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text()).get("defaults") or []
    return [next(iter(d)) for d in defaults if isinstance(d, dict) and list(d.values()) == ["???"]]


@pytest.mark.slow  # runs every command's --help in its own process
def test_help_of_a_command_with_a_required_group_names_it_without_a_traceback() -> None:
    """--help composes the command's config: a group it requires (plan's arch) is named in one
    line instead of Hydra's traceback, and given, the help prints, as train's does without one."""
    required = {name: _required_groups(cmd.config_name) for name, cmd in COMMANDS.items()}
    assert required["plan"] == ["arch"]
    for name, groups in required.items():
        if not groups:
            continue
        out = _run(name, "--help")
        assert out.returncode == 1 and "Traceback" not in out.stderr, (name, out.stderr[-2000:])
        assert out.stderr.startswith(f"ckpred {name}: error: You must specify '{groups[0]}'"), (name, out.stderr)
        assert "gfx942" in out.stderr and "--help arch=gfx942" in out.stderr
    for args in (["plan", "--help", "arch=gfx942"], ["train", "--help"]):
        out = _run(*args)
        assert out.returncode == 0 and "== Config ==" in out.stdout and "Traceback" not in out.stderr, args
