"""Composing and validating configs outside the CLI (tests, notebooks, scripts)."""

from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ckpred import schema
from ckpred.errors import ConfigValueError

#: Folder of the config tree: top-level conf/ in a checkout, shipped as the package ckpred.conf.
CONF_DIR = Path(str(importlib.resources.files("ckpred.conf")))


def to_object(cfg: DictConfig) -> Any:
    """Turn a composed config into its schema dataclasses, running every value check.

    Raises
    ------
    ckpred.errors.ConfigValueError
        When a key holds a value outside its allowed set, or a mandatory key (``???``, such as
        ``problem.y`` of a conv ``select``) was not given; the message names key, value and
        what is allowed.
    """
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as exc:
        key = str(exc.full_key)
        raise ConfigValueError(key, "???", f"a value: the key is mandatory, pass {key}=<value>") from exc


def compose(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose ``config_name`` from the packaged config tree with Hydra's compose API.

    The result is validated with :func:`to_object` before it is returned, so bad values fail
    here exactly as they fail on the command line.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    schema.register()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="ckpred.conf", version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides or []))
    to_object(cfg)
    return cfg


def original_cwd() -> Path:
    """The directory the user started the command in (Hydra may run jobs elsewhere)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            from hydra.utils import get_original_cwd

            return Path(get_original_cwd())
    except ValueError:
        pass
    return Path.cwd()


def resolve_path(path: str | Path) -> Path:
    """Resolve ``path`` against the user's original working directory."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else original_cwd() / p


def run_dir(cfg: Any, command: str) -> Path:
    """Output folder of a command run: ``cfg.out_dir`` if set, else Hydra's run dir, else
    (outside ``@hydra.main``: tests, notebooks) ``runs/<command>/<time>``; created if missing.

    Under ``-m`` a set ``out_dir`` gets the job number appended (``<out_dir>/<job.num>``, like
    Hydra's sweep dir): every job of the sweep would otherwise write into the same folder.
    """
    from datetime import datetime

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None  # None outside @hydra.main
    if cfg.get("out_dir"):
        out = resolve_path(cfg.out_dir)
        if hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN:
            out = out / str(hydra_cfg.job.num)
    elif hydra_cfg is not None:
        out = Path(hydra_cfg.runtime.output_dir)
    else:
        out = resolve_path(Path("runs") / command / datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (pipelines and exports record it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Python's and each package's installed version ("not installed" when absent), for the
    provenance records of train runs and exports."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
