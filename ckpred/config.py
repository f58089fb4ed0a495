"""The config layer: composing and validating Hydra configs (commands, tests, notebooks, scripts).

Only the command layer (:mod:`ckpred.cli`, :mod:`ckpred.commands`) and callers outside the
package use this module. A composed config is turned into its schema dataclasses
(:mod:`ckpred.schema`) once, here: engine modules take those objects or plain values, never
an OmegaConf node.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from ckpred import schema, vocab
from ckpred.cv.schemes import registered_schemes
from ckpred.errors import ConfigValueError, InputFileError, UnknownConfigKeyError, UnusedConfigKeyError
from ckpred.util import claim_run_dir
from ckpred.yamlfile import MAX_BYTES, check_yaml

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
    ckpred.errors.UnknownConfigKeyError
        When a key the schema does not declare was added (``+model.n_estimatorz=5``).
    """
    check_known_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as exc:
        key = str(exc.full_key)
        raise ConfigValueError(key, "???", f"a value: the key is mandatory, pass {key}=<value>") from exc
    except OmegaConfBaseException as exc:
        # An interpolation that does not resolve (``model.max_bin=${oops}``) or resolves to a
        # value of the wrong type only fails here, when the values are read.
        key = str(getattr(exc, "full_key", "") or getattr(exc, "key", "") or "?")
        raw = _raw_value(cfg, key)
        reason = " ".join(str(getattr(exc, "msg", exc)).split("\n")[0].split())
        raise ConfigValueError(key, raw, f"a value that resolves to the key's type ({reason})") from None


def _raw_value(cfg: DictConfig, key: str) -> Any:
    """The unresolved value at ``key`` (``${...}`` stays as written), or ``?`` if not found."""
    node: Any = cfg
    for part in key.replace("[", ".").replace("]", "").split("."):
        try:
            node = node._get_node(int(part) if part.isdigit() else part)
        except Exception:  # noqa: BLE001 - best effort for the message only
            return "?"
        if node is None:
            return "?"
    return node._value() if hasattr(node, "_value") else node


def check_known_keys(cfg: object, prefix: str = "") -> None:
    """Refuse keys a schema node does not declare, in ``cfg`` and every node below it.

    Hydra's ``+key=value`` adds a key even to a node checked against a dataclass (it bypasses
    OmegaConf's struct flag), and :func:`OmegaConf.to_object` then sets it as a plain attribute
    that nothing reads: ``+model.n_estimatorz=5`` would train with the default tree count and
    exit 0. Nodes typed as free mappings (``dict[str, ...]`` fields such as a feature group's
    ``params``) are not schema nodes and keep their keys.
    """
    if isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            node = cfg._get_node(i)
            if isinstance(node, (DictConfig, ListConfig)):
                check_known_keys(node, f"{prefix}[{i}]")
        return
    if not isinstance(cfg, DictConfig) or cfg._is_none() or cfg._is_missing():
        return
    kind = OmegaConf.get_type(cfg)
    known = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    for key in cfg.keys():
        full = f"{prefix}.{key!s}" if prefix else str(key)
        node = cfg._get_node(key)
        assert node is not None  # one of cfg's own keys
        if known is not None and key not in known:
            raise UnknownConfigKeyError(full, OmegaConf.to_container(node) if isinstance(
                node, (DictConfig, ListConfig)) else node._value(), known)
        if isinstance(node, (DictConfig, ListConfig)):
            check_known_keys(node, full)


def unused_keys(obj: object, prefix: str = "") -> dict[str, str]:
    """Every key of a validated config that the options it selected do not read, with why.

    ``obj`` is what :func:`to_object` returns; each schema dataclass may declare
    ``unused_keys()`` (relative key -> what would read it), e.g. ``data.path`` under
    ``data.source=simulated``. Nested dataclasses are searched too (``cv.data.path``).
    """
    if not dataclasses.is_dataclass(obj):
        return {}
    own = obj.unused_keys() if hasattr(obj, "unused_keys") else {}
    out = {f"{prefix}{key}": why for key, why in own.items()}
    for f in dataclasses.fields(obj):
        if f.name not in own:
            out.update(unused_keys(getattr(obj, f.name), f"{prefix}{f.name}."))
    return out


def check_overrides_used(obj: object, overrides: list[str]) -> None:
    """Refuse a command-line override of a key the composed config does not read.

    ``train data.path=x.csv`` without ``data=path`` would train on simulated data and exit 0;
    the refusal names the key, its value and the option that reads it. Group choices that set
    a whole node (``data=path``) and Hydra's own keys are not checked.

    Raises
    ------
    ckpred.errors.UnusedConfigKeyError
        For the first override at or below a key of :func:`unused_keys`.
    """
    unused = unused_keys(obj)
    if not unused:
        return
    parser = OverridesParser.create()
    for text in overrides:
        override = parser.parse_override(text)
        if override.is_delete() or override.key_or_group.split(".")[0].split("/")[0] == "hydra":
            continue
        path = override.package if override.package else override.key_or_group
        for key, why in unused.items():
            if path == key or path.startswith(key + "."):
                raise UnusedConfigKeyError(path, override.get_value_element_as_str(), why)


def compose(config_name: str, overrides: list[str] | None = None, config_dir: str | Path | None = None) -> Any:
    """Compose ``config_name`` from the packaged config tree with Hydra's compose API and return
    it as its schema dataclass (``compose("train")`` is a :class:`ckpred.schema.TrainConfig`),
    what the command of that name hands the engine.

    ``config_dir`` is a user config dir searched before the package's, as ``--config-dir`` on the
    command line.

    The result is validated with :func:`to_object` and :func:`check_overrides_used`, so bad
    values fail here exactly as they fail on the command line; the vocabulary of the config
    dirs is installed (:func:`use_config_dirs`). :func:`compose_node` returns the OmegaConf node.
    """
    return _compose(config_name, overrides, config_dir)[0]


def compose_node(config_name: str, overrides: list[str] | None = None,
                 config_dir: str | Path | None = None) -> DictConfig:
    """:func:`compose`, returning the validated OmegaConf node instead (to save or print it as YAML)."""
    return _compose(config_name, overrides, config_dir)[1]


def _compose(config_name: str, overrides: list[str] | None, config_dir: str | Path | None) -> tuple[Any, DictConfig]:
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="ckpred.conf", version_base="1.3"):
        search = [f"hydra.searchpath=[file://{Path(config_dir).absolute()}]"] if config_dir else []
        cfg = hydra_compose(config_name=config_name, overrides=[*search, *(overrides or [])],
                            return_hydra_config=True)
    use_config_dirs(cfg.hydra.runtime.config_sources)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    obj = to_object(cfg)
    check_overrides_used(obj, list(overrides or []))
    return obj, cfg


def use_config_dirs(sources: ListConfig | list[Any]) -> None:
    """Install the vocabulary (dtypes, layouts, arch configs) of the config dirs Hydra searched
    (``hydra.runtime.config_sources``, in order), so the schema checks and every lookup by name
    see a user's files as well as the package's (:mod:`ckpred.vocab`)."""
    dirs = OmegaConf.to_container(sources)
    assert isinstance(dirs, list)
    vocab.use(vocab.read(vocab.config_dirs(dirs)))


def run_dir(out_dir: str, command: str) -> Path:
    """Output folder of a command run: ``out_dir`` (the config's) if set, else Hydra's run dir, else
    (outside ``@hydra.main``: tests, notebooks) ``runs/<command>/<time>``; created if missing
    and marked as this command's run folder (:func:`ckpred.util.claim_run_dir`).

    The run writes files of fixed names into it, so a folder that is not new, empty or a run
    folder of this command ckpred made (``out_dir=.``, a user's folder, ``hydra.run.dir=.``
    where files are) is refused naming the key, before any work.

    Under ``-m`` a set ``out_dir`` gets the job number appended (``<out_dir>/<job.num>``, like
    Hydra's sweep dir): every job of the sweep would otherwise write into the same folder.
    """
    # lazy: ckpred.runs (scipy through ckpred.evaluate) costs ~0.15 s over pandas; every command imports
    # this module, only the run folders of train and tune need it
    from ckpred.runs import run_directory

    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None  # None outside @hydra.main
    key, value = "out_dir", out_dir
    if value:
        if hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN:
            value = f"{value}/{hydra_cfg.job.num}"
    elif hydra_cfg is not None:
        value = hydra_cfg.runtime.output_dir
        key = "hydra.run.dir" if hydra_cfg.mode == RunMode.RUN else "hydra.sweep.dir"
    else:
        value = str(Path("runs") / command / datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    return claim_run_dir(key, value, run_directory(command))


#: The schema of each command's primary config (``conf/<name>.yaml`` starts with ``base_<name>``).
PRIMARY_SCHEMAS: dict[str, type] = {
    "ingest": schema.IngestConfig, "simulate": schema.SimulateConfig, "train": schema.TrainConfig,
    "export": schema.ExportConfig, "select": schema.SelectConfig, "tune": schema.TuneConfig,
    "sweep_report": schema.SweepReportConfig, "replay": schema.ReplayConfig, "plan": schema.PlanConfig,
}


def _checked_file_source() -> None:
    """Have Hydra check every config file it reads from a directory (``--config-dir``, a search
    path) with :func:`ckpred.yamlfile.check_yaml` before OmegaConf loads it (idempotent).

    OmegaConf expands a YAML alias bomb before any schema sees the file, and its loader's errors
    (duplicate keys, tags, bytes that are not UTF-8) reach the user as tracebacks. The check
    replaces Hydra's ``file://`` config source by a subclass of the one Hydra registered (Hydra
    keeps a registered class of the same name). A refusal raises
    :class:`ckpred.errors.InputFileError`, or on the command line (:data:`COMMAND_LINE` set)
    prints its one line and exits with status 1 (Hydra would add its own lines to it).
    """
    Plugins.instance()  # Hydra registers its own config sources first
    registry = SourcesRegistry.instance()
    base = registry.resolve("file")
    if getattr(base, "ckpred_checked", False):
        return

    class FileConfigSource(base):  # type: ignore[misc,valid-type]
        ckpred_checked = True

        def load_config(self, config_path: str) -> Any:
            path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
            if os.path.isfile(path):
                try:
                    with open(path, "rb") as fh:
                        check_yaml(fh.read(MAX_BYTES + 1), path)
                except InputFileError as exc:
                    if COMMAND_LINE is None:
                        raise
                    print(f"ckpred {COMMAND_LINE}: error: {exc}", file=sys.stderr)
                    raise SystemExit(1) from None
            return super().load_config(config_path)

    registry.types["file"] = FileConfigSource


#: The command being run from the command line (set by :mod:`ckpred.cli`); None in a program.
COMMAND_LINE: str | None = None


def register_schemas() -> None:
    """Register every schema under ``base_<group>`` and check config files before Hydra loads
    them (:func:`_checked_file_source`); idempotent."""
    _checked_file_source()

    cs = ConfigStore.instance()
    for name, node in PRIMARY_SCHEMAS.items():
        cs.store(name=f"base_{name}", node=node)
    cs.store(group="arch", name="base_arch", node=schema.ArchConfig)
    cs.store(group="dtype", name="base_dtype", node=schema.DtypeConfig)
    cs.store(group="layout", name="base_layout", node=schema.LayoutConfig)
    cs.store(group="op", name="base_op", node=schema.OpConfig)
    cs.store(group="data", name="base_data", node=schema.DataConfig)
    cs.store(group="shapes", name="base_shapes", node=schema.ShapesConfig)
    cs.store(group="features", name="base_features", node=schema.FeaturesConfig)
    cs.store(group="model", name="base_model", node=schema.ModelConfig)
    cs.store(group="target", name="base_target", node=schema.TargetConfig)
    for name, scheme in registered_schemes().items():  # each CV scheme's options, its name set
        node = OmegaConf.structured(scheme.config)
        node.name = name
        cs.store(group="cv", name=f"base_{name}", node=node)
    cs.store(group="problem", name="base_problem", node={})


def feature_set(name: str) -> Any:
    """Compose ``conf/features/<name>.yaml`` on its own and return it validated.

    Returns
    -------
    ckpred.schema.FeaturesConfig
        A fresh copy (composition is cached per name: it costs a Hydra initialisation).
    """
    return copy.deepcopy(_feature_set(name))


@functools.lru_cache(maxsize=None)
def _feature_set(name: str) -> Any:
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="ckpred.conf", version_base="1.3"):
        cfg = hydra_compose(config_name=None, overrides=[f"+features={name}"])
    GlobalHydra.instance().clear()
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema.FeaturesConfig), cfg.features))
