"""Command-line entry: ``python -m ckpred <command> [hydra overrides...]``.

The CLI is thin on purpose. It pops the command word, hands the rest of ``argv`` to that
command's ``@hydra.main(version_base="1.3")`` entry point (so ``-m`` multirun, sweepers and
launchers work unchanged), validates the composed config against its schemas and calls a plain
function of the config, whose return value is what a sweeper optimises.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, NamedTuple

import yaml
from omegaconf import DictConfig

from ckpred.errors import CkpredError, UnknownConfigKeyError
from ckpred.util import RUN_MARKER, check_replaceable, resolve_path


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
    "plan": Command("plan", "ckpred.commands.plan:plan_command",
                    "choose the (problem, kernel) pairs to benchmark first on a new GPU, as a CSV ingest reads back",
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


#: Hydra's mode options (option -> mode): Hydra refuses two modes with a traceback.
_HYDRA_MODES = {"-m": "multirun", "--multirun": "multirun", "-c": "cfg", "--cfg": "cfg", "--info": "info",
                "-sc": "shell_completion", "--shell-completion": "shell_completion"}
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
    # lazy: Hydra's override parser and ckpred.config cost ~0.13 s over this module; --help and
    # an unknown command answer without them
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


#: Longest config key ckpred takes (a key is a dotted path of schema names, never this long).
MAX_KEY_CHARS = 255
#: Words of an error line longer than this are shortened when printed (a 10,000-character path).
MAX_WORD_CHARS = 200


def _shown(text: str) -> str:
    """``text`` safe to print on a terminal: control and other non-printable characters escaped
    (an ESC would start a terminal escape sequence), overlong words shortened."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))
    return re.sub(rf"\S{{{MAX_WORD_CHARS + 1},}}", lambda m: f"{m.group()[:60]}...[{len(m.group()):,} characters]",
                  text)


def _refuse(name: str, message: str) -> None:
    print(f"ckpred {name}: error: {_shown(message)}", file=sys.stderr)
    raise SystemExit(1)


def _check_arguments(name: str, argv: list[str]) -> None:
    """Refuse, before Hydra echoes or parses them, two Hydra modes at once, an argument holding a
    control character (ESC, CR, BEL, ...: a terminal would act on them) and an overlong key."""
    modes = [a for a in argv if a.split("=", 1)[0] in _HYDRA_MODES]
    if len(set(_HYDRA_MODES[m.split("=", 1)[0]] for m in modes)) > 1:
        _refuse(name, f"options {modes} together; allowed: one of -m/--multirun, -c/--cfg, --info, "
                      "-sc/--shell-completion (Hydra runs one mode at a time)")
    for arg in argv:
        bad = next((c for c in arg if not c.isprintable()), None)
        if bad is not None:
            _refuse(name, f"argument '{_shown(arg)}' holds the control character {ascii(bad)} at position "
                          f"{arg.index(bad)}; allowed: printable characters")
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" in arg and len(key) > MAX_KEY_CHARS:
            _refuse(name, f"config key '{key[:60]}...' ({len(key):,} characters) is too long; allowed: a key of at "
                          f"most {MAX_KEY_CHARS} characters")


#: Config groups a plain override may choose at the root besides the schema's keys.
_ROOT_GROUPS = frozenset({"experiment"})


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, depth first."""
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _unknown_key(schema: type, key: str) -> tuple[str, list[str]] | None:
    """``(key prefix, keys allowed there)`` when ``key`` leaves the schema of ``schema``, else None.

    The walk stops (accepting the key) where the schema has no fixed keys: a free mapping, a
    list, an untyped node, or a config group of :data:`_ROOT_GROUPS` at the root."""
    node: Any = schema
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None
        # A schema with registered subclasses (the CV schemes' configs under CVConfig) takes any
        # of their keys here (:func:`_check_cv_key` checks the chosen scheme's).
        family = [node, *_subclasses(node)]
        owner = next((cls for cls in family if part in {f.name for f in dataclasses.fields(cls)}), node)
        names = sorted({f.name for cls in family for f in dataclasses.fields(cls)})
        node = owner
        if part not in names:
            if i == 0 and part in _ROOT_GROUPS:
                return None
            return ".".join(parts[:i + 1]), sorted(set(names) | (_ROOT_GROUPS if i == 0 else set()))
        node = typing.get_type_hints(node)[part]
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) is typing.Union and len(args) == 1:  # Optional[X]
            node = args[0]
    return None


#: Commands that write their outputs into their run folder (Hydra's when no ``out_dir`` is given).
_RUN_FOLDER_COMMANDS = ("train", "tune")


def _check_run_folder(name: str, key: str, value: str) -> None:
    """Refuse a ``hydra.run.dir`` that is not new, empty or this command's run folder before
    Hydra writes ``.hydra/`` and the job's log into it (the command checks it again)."""
    # lazy: ckpred.runs loads pandas (~0.47 s over this module); only a hydra.run.dir= override needs it
    from ckpred.runs import run_directory

    try:
        check_replaceable(key, value, run_directory(COMMANDS[name].config_name))
    except CkpredError as exc:
        _refuse(name, str(exc))


def _check_creatable(name: str, key: str, value: str) -> None:
    """Refuse a directory Hydra would fail to create (under /proc, below a file, too long): its
    first missing component is made and removed again, so nothing is left behind."""
    # lazy: ckpred.schema costs ~0.06 s over this module; --help and an unknown command answer without it
    from ckpred.schema import check_output_path

    try:
        check_output_path(key, value, kind="dir")
        path = resolve_path(value)
        missing = next((p for p in [path, *path.parents][::-1] if not p.exists()), None)
        if missing is not None:
            missing.mkdir()
            missing.rmdir()
    except CkpredError as exc:
        _refuse(name, str(exc))
    except OSError as exc:
        _refuse(name, f"config key '{key}' has invalid value {value!r}; allowed: a directory this system can "
                      f"create ({exc.strerror})")


def _check_cv_key(name: str, key: str, value: object, chosen: str) -> None:
    """Refuse ``cv.<key>`` that the chosen CV scheme (``cv=<chosen>``) does not read, naming the
    schemes that do (Hydra's own error would be a struct-mode message with no hint)."""
    # lazy: ckpred.cv.schemes (with ckpred.schema) costs ~0.07 s over this module; --help and an unknown
    # command answer without it
    from ckpred.cv.schemes import registered_schemes

    field = key.split(".")[1]
    schemes = registered_schemes()
    if chosen not in schemes:
        return  # an unknown scheme name is refused by name when the config is composed
    if field in {f.name for f in dataclasses.fields(schemes[chosen].config)}:
        return
    readers = [s for s, scheme in schemes.items() if field in {f.name for f in dataclasses.fields(scheme.config)}]
    _refuse(name, f"config key '{key}' (= {value!r}) is not read by cv={chosen}; "
                  f"{', '.join(f'cv={s}' for s in readers)} read{'s' if len(readers) == 1 else ''} it "
                  "(select that scheme, or drop the key)")


def _chosen_cv(config_name: str, overrides: list[Any]) -> str:
    """The CV scheme a command's run uses: a ``cv=<name>`` override, else its primary config's default."""
    # lazy: ckpred.config costs ~0.07 s over this module; --help and an unknown command answer without it
    from ckpred.config import CONF_DIR

    for override in overrides:
        if override.key_or_group == "cv" and isinstance(override.value(), str):
            return str(override.value())

    defaults = (yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text()) or {}).get("defaults") or []
    return next((str(d["cv"]) for d in defaults if isinstance(d, dict) and "cv" in d), "")


def _is_hydras(key: str) -> bool:
    """Whether ``key`` is Hydra's own (``hydra.run.dir``, the group ``hydra/launcher``)."""
    return key.split(".")[0].split("/")[0] == "hydra"


def _check_override_keys(name: str, argv: list[str]) -> None:
    """Refuse, before Hydra composes anything, an override whose key the command's schema does
    not have (with the closest key: Hydra's own error offers none without ``+``) and a Hydra run
    or sweep dir that cannot be created."""
    # lazy: Hydra's override parser and ckpred.config cost ~0.13 s over this module; --help and
    # an unknown command answer without them
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ckpred.config import PRIMARY_SCHEMAS

    schema = PRIMARY_SCHEMAS[COMMANDS[name].config_name]
    parser = OverridesParser.create()
    parsed = [parser.parse_override(a) for a, after in zip(argv, [False, *[a in _HYDRA_VALUE_OPTIONS for a in argv]])
              if not after and not a.startswith("-")]
    chosen_cv = _chosen_cv(COMMANDS[name].config_name, parsed)
    after_option = False
    for arg in argv:
        if not after_option and not arg.startswith("-"):
            override = parser.parse_override(arg)
            key = override.key_or_group
            if key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in arg:
                _check_creatable(name, key, str(override.value()))
            if key == "hydra.run.dir" and "${" not in arg and COMMANDS[name].config_name in _RUN_FOLDER_COMMANDS:
                _check_run_folder(name, key, str(override.value()))
            plain = not (override.is_add() or override.is_force_add() or override.is_delete())
            if plain and override.package is None and not _is_hydras(key):
                unknown = _unknown_key(schema, key)
                if unknown is not None:
                    _refuse(name, str(UnknownConfigKeyError(unknown[0], override.value(), unknown[1])))
                if key.startswith("cv.") and key.count(".") == 1 and hasattr(schema, "__dataclass_fields__") \
                        and "cv" in schema.__dataclass_fields__:
                    _check_cv_key(name, key, override.value(), chosen_cv)
        after_option = arg in _HYDRA_VALUE_OPTIONS


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a path the system cannot even look up (a name too long)."""
    try:
        return path.exists()
    except OSError:
        return False


class _RunDirGuard:
    """Removes the folders made for a run that ckpred then refused: the one Hydra made (with only
    ``.hydra/`` and the job's log in it), an empty ``out_dir``, and the parents the run created.
    A refused run leaves nothing behind.

    Which folders existed is recorded before Hydra starts: the ancestors of ``hydra.run.dir=``
    when given (up to its first interpolation), else of the packaged ``runs/<command>/``, and of
    an ``out_dir=`` given. A folder that existed before is never touched.
    """

    def __init__(self, config_name: str, argv: list[str]) -> None:
        def given(key: str) -> str | None:
            value = next((a.split("=", 1)[1] for a in argv if a.startswith(f"{key}=")), None)
            return value.split("${")[0].strip("'\"") if value else None

        run_base = Path(given("hydra.run.dir") or Path("runs") / config_name).absolute()
        out_dir = given("out_dir")
        self.out_dir = Path(out_dir).absolute() if out_dir else None
        bases = [run_base, *([self.out_dir] if self.out_dir else [])]
        self.candidates = {p for base in bases for p in (base, *base.parents)}
        self.existed = {p for p in self.candidates if _exists(p)}
        # the run folders already marked: a marker this run did not write stays
        self.marked = {p for p in self.existed if _exists(p / RUN_MARKER)}

    def clean(self) -> None:
        # lazy: hydra costs ~0.05 s over ckpred.config; --help and an unknown command answer without it
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.RUN:
            return  # a sweep's failed job stays: sweep-report lists it
        out = Path(hc.runtime.output_dir).absolute()
        if out not in self.existed and out.is_dir():
            self._remove_hydras(out, hc.job.name)
        for made in (out, self.out_dir):
            self._remove_empty(made)

    @staticmethod
    def _remove_hydras(out: Path, job: str) -> None:
        """Hydra's files in ``out`` when nothing else is there (else the run wrote something: keep it)."""
        hydra_files = {"config.yaml", "hydra.yaml", "overrides.yaml"}
        meta = out / ".hydra"
        if not {p.name for p in out.iterdir()} <= {".hydra", f"{job}.log", RUN_MARKER} or \
                (meta.is_dir() and not {p.name for p in meta.iterdir()} <= hydra_files):
            return
        for f in hydra_files:
            (meta / f).unlink(missing_ok=True)
        if meta.is_dir():
            meta.rmdir()
        (out / f"{job}.log").unlink(missing_ok=True)
        (out / RUN_MARKER).unlink(missing_ok=True)  # a folder Hydra made for this run: the marker is the run's

    def _remove_empty(self, made: Path | None) -> None:
        """``made`` and its parents, each while it is empty and was made by this run (the run
        folder marker this run wrote into ``made`` is removed first)."""
        if made is not None and made not in self.marked:
            try:
                if made.is_dir() and [p.name for p in made.iterdir()] == [RUN_MARKER]:
                    (made / RUN_MARKER).unlink()
            except OSError:
                pass
        for folder in ([made, *made.parents] if made else []):
            try:
                if folder in self.existed or not folder.is_dir() or any(folder.iterdir()):
                    break
            except OSError:  # a path the system cannot look up (a name too long) was never made
                break
            if folder != made and folder not in self.candidates:
                break
            folder.rmdir()


def run_command(name: str, argv: list[str]) -> Any:
    """Run command ``name`` with Hydra arguments ``argv`` (as if typed after the command)."""
    # lazy: hydra and ckpred.config cost ~0.12 s over this module; --help and an unknown command
    # answer without them
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import ConfigCompositionException

    from ckpred import config
    from ckpred.config import check_overrides_used, register_schemas, to_object, use_config_dirs

    command = COMMANDS[name]
    _check_arguments(name, argv)
    argv = _open_node_overrides(_positional_to_override(argv, command.positional), command.open_nodes)
    _check_override_syntax(name, argv)
    _check_override_keys(name, argv)
    config.COMMAND_LINE = name
    register_schemas()
    guard = _RunDirGuard(command.config_name, argv)

    @hydra.main(version_base="1.3", config_path="pkg://ckpred.conf", config_name=command.config_name)
    def entry(cfg: DictConfig) -> Any:
        try:
            # the dtypes, layouts and arch configs of the config dirs searched, then the value checks
            # of every schema, and no override the selected options ignore, before any work
            use_config_dirs(HydraConfig.get().runtime.config_sources)
            obj = to_object(cfg)  # the schema dataclasses: what the engine takes, checked once
            check_overrides_used(obj, list(HydraConfig.get().overrides.task))
            return _load_task(command.task)(obj)
        except CkpredError as exc:
            # ckpred's own errors already say where, what and what is allowed: print that
            # line instead of Hydra's traceback. SystemExit passes through Hydra's handler.
            message = str(exc)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            # a path of the config (data.path, out, ...) longer than the file system takes
            message = (f"cannot use {exc.filename or 'a path'}: {exc.strerror} (the system takes file names of at "
                       "most 255 bytes and paths of at most 4,096)")
        guard.clean()
        _refuse(name, message)

    saved = sys.argv
    sys.argv = [f"ckpred {name}", *argv]
    try:
        return entry()
    except ConfigCompositionException as exc:
        # Hydra reports a composition error itself, but not while it composes for --help: there
        # a config group the command requires (plan's arch) escapes as a traceback
        _refuse(name, f"{' '.join(str(exc).split())} (give the required groups with --help too, e.g. "
                      f"`python -m ckpred {name} --help arch=gfx942`)")
    finally:
        sys.argv = saved
        config.COMMAND_LINE = None


def quiet_waiting_threads() -> None:
    """Have OpenMP's idle threads sleep instead of spin (``OMP_WAIT_POLICY=PASSIVE``) in this
    command's process, unless the caller chose a policy.

    LightGBM's OpenMP threads (``model.n_jobs`` > 1) otherwise busy-wait between parallel
    regions; on a loaded machine they take the cores from the threads doing the work, with the
    same results (docs/results.md, "Threads"). OpenMP reads the variable once, when LightGBM is
    first loaded, which the command does after this.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    quiet_waiting_threads()
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
