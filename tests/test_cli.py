"""The CLI through a subprocess, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from ckpred.cli import COMMANDS


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
