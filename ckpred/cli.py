"""Command-line entry: ``python -m ckpred <command> [hydra overrides...]``.

The CLI is thin on purpose. It pops the command word, hands the rest of ``argv`` to that
command's ``@hydra.main(version_base="1.3")`` entry point (so ``-m`` multirun, sweepers and
launchers work unchanged), validates the composed config against its schemas and calls a plain
function of the config, whose return value is what a sweeper optimises.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, NamedTuple

from omegaconf import DictConfig


class Command(NamedTuple):
    config_name: str
    #: ``module:function`` of the task; imported only when the command runs.
    task: str
    summary: str
    #: Config key a bare positional argument is translated to (``sweep-report <dir>`` ->
    #: ``dir=<dir>``); empty = the command takes Hydra overrides only.
    positional: str = ""
    #: Config nodes whose keys come from the op, not from a config file: ``<node>.<key>=v`` adds
    #: the key when no file declares it (as ``++<node>.<key>=v``), so an op written in YAML alone
    #: needs no ``problem/<op>.yaml``; the command checks the keys against the op.
    open_nodes: tuple[str, ...] = ()


#: Every command, with the primary config it composes and a one-line summary for ``--help``.
COMMANDS: dict[str, Command] = {
    "train": Command("train", "ckpred.commands.train:train",
                     "train the kernel-selection model with shape-grouped CV; report it against baselines"),
    "ingest": Command("ingest", "ckpred.commands.ingest:ingest_command",
                      "read benchmark output (JSON, streaming log, CSV, parquet) into the canonical table"),
    "export": Command("export", "ckpred.commands.export:export_command",
                      "compile the model to ONNX (selector + scorer) with a manifest, parity-checked"),
    "select": Command("select", "ckpred.commands.select:select_command",
                      "pick the top-k kernels for one problem with an exported model", open_nodes=("problem",)),
    "simulate": Command("simulate", "ckpred.commands.simulate:simulate_command",
                        "simulate CK Tile GEMM benchmarks (embedded default data); calibrate=true reports vs real"),
    "tune": Command("tune", "ckpred.commands.tune:tune",
                    "optuna search over model hyperparameters; objective = CV mean efficiency of train"),
    "replay": Command("replay", "ckpred.commands.replay:replay_command",
                      "replay autotune budgets on a train run's measured tables: efficiency vs benchmarks",
                      positional="run_dir"),
    "sweep-report": Command("sweep_report", "ckpred.commands.sweep_report:sweep_report",
                            "one table of a sweep's jobs (train -m / tune), best mean efficiency first",
                            positional="dir"),
}


def _load_task(spec: str) -> Callable[[DictConfig], Any]:
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: python -m ckpred <command> [hydra overrides...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "Each command takes Hydra overrides, e.g. `python -m ckpred train arch=gfx950 dtype=fp8`;",
              "`python -m ckpred <command> --help` shows its config, `-m` runs a sweep."]
    return "\n".join(lines)


#: Hydra options followed by a value (that value is not a positional argument).
_HYDRA_VALUE_OPTIONS = frozenset({"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                                  "-c", "--cfg", "-p", "--package", "--experimental-rerun"})


def _positional_to_override(argv: list[str], key: str) -> list[str]:
    """Turn the first bare argument (no ``=``, not an option or its value) into ``key='<arg>'``."""
    out, done, after_option = [], not key, False
    for arg in argv:
        if not done and not after_option and "=" not in arg and not arg.startswith("-"):
            # Quoted so any path survives Hydra's override grammar; escape quotes (Hydra's rule).
            out.append(f"{key}='{arg.replace(chr(39), chr(92) + chr(39))}'")
            done = True
        else:
            out.append(arg)
        after_option = arg in _HYDRA_VALUE_OPTIONS
    return out


def _open_node_overrides(argv: list[str], nodes: tuple[str, ...]) -> list[str]:
    """``<node>.<key>=v`` as ``++<node>.<key>=v`` (add or override) for each of ``nodes``."""
    out, after_option = [], False
    for arg in argv:
        key = arg.split("=", 1)[0]
        if not after_option and "=" in arg and key.split(".", 1)[0] in nodes and "." in key:
            arg = "++" + arg
        out.append(arg)
        after_option = arg in _HYDRA_VALUE_OPTIONS
    return out


def _check_override_syntax(name: str, argv: list[str]) -> None:
    """Refuse an override Hydra's grammar cannot parse, naming it (Hydra's own message names
    only the offending token, not which override it came from)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    from ckpred.config import CONF_DIR

    parser = OverridesParser.create()
    after_option = False
    for arg in argv:
        if not after_option and not arg.startswith("-"):
            try:
                override = parser.parse_override(arg)
            except HydraException as exc:
                reason = " ".join(str(exc).split("\n")[0].split())
                print(f"ckpred {name}: error: cannot parse override {arg!r}: {reason} (Hydra override grammar: "
                      "quote values with special characters, e.g. key='a,b')", file=sys.stderr)
                raise SystemExit(1) from None
            group = CONF_DIR / override.key_or_group.split("@")[0]
            plain = override.value_type == ValueType.ELEMENT and not override.is_delete()
            value = override.value() if plain else ""
            names = value if isinstance(value, list) else [value]
            if group.is_dir() and not all(isinstance(v, str) for v in names):
                # Hydra itself fails on this with a traceback ("must be a string or a list").
                options = sorted(p.stem for p in group.glob("*.yaml"))
                print(f"ckpred {name}: error: config group '{override.key_or_group}' has invalid value {value!r}; "
                      f"allowed: an option name, one of {options}", file=sys.stderr)
                raise SystemExit(1)
        after_option = arg in _HYDRA_VALUE_OPTIONS


def run_command(name: str, argv: list[str]) -> Any:
    """Run command ``name`` with Hydra arguments ``argv`` (as if typed after the command)."""
    import hydra

    from ckpred.config import check_overrides_used, register_schemas, to_object
    from ckpred.errors import CkpredError

    command = COMMANDS[name]
    argv = _open_node_overrides(_positional_to_override(argv, command.positional), command.open_nodes)
    _check_override_syntax(name, argv)
    register_schemas()

    @hydra.main(version_base="1.3", config_path="pkg://ckpred.conf", config_name=command.config_name)
    def entry(cfg: DictConfig) -> Any:
        try:
            from hydra.core.hydra_config import HydraConfig

            # value checks of every schema, and no override the selected options ignore, before any work
            check_overrides_used(to_object(cfg), list(HydraConfig.get().overrides.task))
            return _load_task(command.task)(cfg)
        except CkpredError as exc:
            # ckpred's own errors already say where, what and what is allowed: print that
            # line instead of Hydra's traceback. SystemExit passes through Hydra's handler.
            print(f"ckpred {name}: error: {exc}", file=sys.stderr)
            raise SystemExit(1) from exc

    saved = sys.argv
    sys.argv = [f"ckpred {name}", *argv]
    try:
        return entry()
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"ckpred: unknown command {name!r}; known commands: {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(_usage(), file=sys.stderr)
        return 2
    run_command(name, rest)
    return 0
