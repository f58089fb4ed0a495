"""Hostile inputs to the Python runtime: every one ends in a named ckpred error, never another.

Classes of input: tampered or inconsistent exports (file bytes, manifest hashes, renamed, stale,
shortened or forged catalogues, wrong kernel ids, path traversal), malformed manifests (not
UTF-8, not JSON, NaN, missing keys, wrong types; plus a structured hypothesis fuzz), corrupt
models re-signed, bad problems (bools, floats, text, beyond int64, negative, zero below the
field's minimum), bad top_k/threads/cache_size/batch, the select CLI, symlinked export
directories. The tamper cases are shared with the C++ selector's test (test_cpp_hostile.py),
which must refuse the same exports.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpred.errors import CkpredError, ConfigValueError, ModelMismatchError
from ckpred.export import manifest as mf
from ckpred.runtime import KernelSelector
from ckpred.util import max_threads
from export_helpers import export_gemm, forge, gemm, re_exporting


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return export_gemm(tmp_path_factory.mktemp("hostile") / "gemm_universal_gfx950_fp8_rcr", n_estimators=10)


@pytest.fixture(scope="module")
def selector(export) -> KernelSelector:
    return KernelSelector.load(export, cache_size=0)


# -- tampering helpers (also used by test_cpp_hostile.py) --------------------------------------------
def read(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())


def write(d: Path, man: dict[str, Any]) -> None:
    (d / "manifest.json").write_text(json.dumps(man))


def resign_files(d: Path, man: dict[str, Any]) -> None:
    """Recompute every file's sha256 in the manifest (what a forger does after editing a file)."""
    for name in man["files"]:
        man["files"][name]["sha256"] = hashlib.sha256((d / name).read_bytes()).hexdigest()


def resign_catalogue(man: dict[str, Any]) -> None:
    """Recompute the catalogue's count and hash from its (edited) rows."""
    section = man["catalogue"]
    section["count"] = len(section["rows"])
    section["hash"] = gemm().catalogue_hash(mf.catalogue_frame(section))


def _flip_model_byte(d: Path) -> None:
    data = bytearray((d / "model.onnx").read_bytes())
    data[-10] ^= 0x01
    (d / "model.onnx").write_bytes(bytes(data))


def _edit(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        man = read(d)
        fn(man)
        write(d, man)
    return apply


def _rename_row(man: dict[str, Any]) -> None:
    man["catalogue"]["rows"][3][1] += "_renamed"


def _rename_row_resigned(man: dict[str, Any]) -> None:
    _rename_row(man)
    resign_catalogue(man)


def _stale_resigned(man: dict[str, Any]) -> None:
    """An older catalogue whose kernel order differs (rows 0 and 1 swapped), re-signed."""
    rows = man["catalogue"]["rows"]
    rows[0][1:], rows[1][1:] = rows[1][1:], rows[0][1:]
    resign_catalogue(man)


def _shorten(man: dict[str, Any]) -> None:
    man["catalogue"]["rows"].pop()


def _shorten_resigned(man: dict[str, Any]) -> None:
    _shorten(man)
    resign_catalogue(man)


def _forge(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """Edit the manifest, write the edit into model.onnx's metadata too, re-sign the files."""
    def apply(d: Path) -> None:
        man = read(d)
        fn(man)
        forge(d, man)
    return apply


_shorten_forged = _forge(_shorten_resigned)


def _corrupt_model_resigned(d: Path) -> None:
    (d / "model.onnx").write_bytes((d / "model.onnx").read_bytes()[:5000])
    man = read(d)
    resign_files(d, man)
    write(d, man)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def fn(man: dict[str, Any]) -> None:
        node = man
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return fn


def _delete(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda man: man.pop(key)


def _raw(text: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        (d / "manifest.json").write_bytes(text((d / "manifest.json").read_bytes()))
    return apply


#: name -> (tamper(dir), what the Python error says, what the C++ error says)
TAMPERS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "model_bytes": (_flip_model_byte, r"model.onnx: sha256 .* does not match", "does not match the manifest's"),
    "manifest_sha256": (_edit(_set(("files", "model.onnx", "sha256"), "0" * 64)), "sha256 .* does not match",
                        "does not match the manifest's"),
    "renamed_row": (_edit(_rename_row), "does not match the manifest embedded", "does not match the manifest embedded"),
    # The model's metadata forged to match, the catalogue hash not re-signed: the re-hash catches it.
    "renamed_row_forged": (_forge(_rename_row), "catalogue rows do not hash", "catalogue rows do not hash"),
    "renamed_row_resigned": (_edit(_rename_row_resigned), "does not match the manifest embedded",
                             "does not match the manifest embedded"),
    "stale_catalogue_resigned": (_edit(_stale_resigned), "does not match the manifest embedded",
                                 "does not match the manifest embedded"),
    "shortened_catalogue": (_edit(_shorten), r"key 'catalogue.rows' is '<4607 rows>'; expected catalogue.count = 4608",
                            "key 'catalogue.rows' is <4607 rows>; expected catalogue.count = 4608"),
    "shortened_resigned": (_edit(_shorten_resigned), "does not match the manifest embedded",
                           "does not match the manifest embedded"),
    # A complete forgery (model metadata rewritten, every hash re-signed): Python still compares
    # with its op's catalogue; both compare the number of kernels the graph ranks.
    "shortened_forged": (_shorten_forged, "kernel catalogue differs: model has 4607 kernels",
                         "the selector graph ranks 4608 kernels, the manifest's catalogue has 4607 rows"),
    "kernel_id_order": (_edit(_set(("catalogue", "rows", 5, 0), 7)), r"catalogue.rows\[5\]\[0\] \(kernel_id\)' is 7",
                        "catalogue.rows[5][0] (kernel_id)' is 7"),
    "bool_cell_as_int": (_edit(_set(("catalogue", "rows", 2, 17), 1)), r"rows\[2\]\[17\] \(persistent\)' is 1",
                         "rows[2][17] (persistent)' is 1"),
    "path_traversal": (_edit(_set(("graphs", "selector", "file"), "../model.onnx")),
                       "graphs.selector.file' is '../model.onnx'; expected a file name",
                       "graphs.selector.file' is '../model.onnx'; expected a file name"),
    "count_beyond_int64": (_edit(_set(("catalogue", "count"), 2**64)), "catalogue.count' is 18446744073709551616",
                           "catalogue.count' is 18446744073709551616"),
    "count_string": (_edit(_set(("catalogue", "count"), "4608")), "catalogue.count' is '4608'",
                     "catalogue.count' is '4608'"),
    "missing_catalogue": (_edit(_delete("catalogue")), "key 'catalogue' is missing", "key 'catalogue' is missing"),
    "missing_files": (_edit(_delete("files")), "key 'files' is missing", "key 'files' is missing"),
    "fields_not_list": (_edit(_set(("problem_fields",), {"m": 1})), "problem_fields' is {'m': 1}",
                        "problem_fields' is {'m': 1}"),
    "bad_range": (_edit(_set(("training", "problem_ranges", "m"), [5, 1])), r"problem_ranges.m' is \[5, 1\]",
                  "problem_ranges.m' is [5, 1]"),
    "op_not_a_name": (_edit(_set(("op",), "os.path")), "key 'op' is 'os.path'", "key 'op' is 'os.path'"),
    "not_json": (_raw(lambda b: b[: len(b) // 2]), "not valid JSON", "not valid JSON"),
    "not_utf8": (_raw(lambda b: b.replace(b'"gfx950"', b'"gfx\xff950"', 1)), "not UTF-8", "not UTF-8"),
    "nan_constant": (_raw(lambda b: b.replace(b'"count": 4608', b'"count": NaN', 1)), "not valid JSON",
                     "not valid JSON"),
    "deep_nesting": (_raw(lambda b: b[:-1] + b', "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"), "not valid JSON",
                     "not valid JSON"),
    "empty_file": (_raw(lambda b: b""), "not valid JSON", "not valid JSON"),
    "top_level_list": (_raw(lambda b: b"[" + b + b"]"), r"key '\(top level\)' is \[", "key '(top level)' is ["),
    "corrupt_model_resigned": (_corrupt_model_resigned, "model.onnx: not a readable ONNX model",
                               "model.onnx: not a readable ONNX model"),
}


@pytest.fixture()
def tampered(export, tmp_path, request) -> Path:
    d = tmp_path / export.name
    shutil.copytree(export, d)
    TAMPERS[request.param][0](d)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("tampered", sorted(TAMPERS), indirect=True)
def test_tampered_export_is_refused_with_a_named_error(tampered, request) -> None:
    name = request.node.callspec.params["tampered"]
    with pytest.raises(ModelMismatchError, match=TAMPERS[name][1]) as err:
        KernelSelector.load(tampered)
    assert "\n" not in str(err.value)


def test_forged_catalogue_is_caught_by_the_graph_width_without_the_op(export, tmp_path) -> None:
    d = tmp_path / export.name
    shutil.copytree(export, d)
    _shorten_forged(d)
    with pytest.raises(ModelMismatchError, match="the selector graph ranks 4608 kernels, the manifest's catalogue "
                                                 "has 4607 rows"):
        KernelSelector.load(d, check_catalogue=False)


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"arch": "gfx942"}, "arch: model is for 'gfx950', asked for 'gfx942'"),
    ({"dtype": "bf16"}, "dtype: model is for 'fp8', asked for 'bf16'"),
    ({"op": "grouped_conv_fwd"}, "op: model is for 'gemm_universal', asked for 'grouped_conv_fwd'"),
])
def test_wrong_arch_dtype_op_is_refused(export, kwargs, text) -> None:
    with pytest.raises(ModelMismatchError, match=text):
        KernelSelector.load(export, **kwargs)


# -- problems and arguments --------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "key", "allowed"), [
    ({"m": True}, "problem.m", "an integer in [1, 9223372036854775807]"),
    ({"m": 1.5}, "problem.m", "an integer in [1,"),
    ({"m": 128.0}, "problem.m", "an integer in [1,"),
    ({"m": "12x"}, "problem.m", "an integer in [1,"),
    ({"m": "1_000"}, "problem.m", "an integer in [1,"),
    ({"m": "\u0661\u0662"}, "problem.m", "an integer in [1,"),  # Arabic-Indic digits: int() reads them, C++ does not
    ({"m": None}, "problem.m", "an integer in [1,"),
    ({"m": 2**63}, "problem.m", "an integer in [1, 9223372036854775807]"),
    ({"m": -5}, "problem.m", "an integer in [1,"),
    ({"m": 0}, "problem.m", "an integer in [1,"),
    ({"split_k": 0}, "problem.split_k", "an integer in [1,"),
    ({"q": 4}, "problem.q", "a field of op 'gemm_universal'"),
])
def test_bad_problem_values_are_refused(selector, fields, key, allowed) -> None:
    problem = {"m": 128, "n": 1536, "k": 7168, **fields}
    with pytest.raises(ConfigValueError) as err:
        selector.select(problem)
    assert err.value.key == key and allowed in err.value.allowed


def test_problem_values_that_are_integers_are_accepted(selector) -> None:
    import numpy as np

    want = selector.select(128, 1536, 7168)
    assert selector.select(np.int64(128), np.int32(1536), "7168") == want
    assert selector.select(2**63 - 1, 1536, 7168).out_of_distribution  # the largest int64 is a legal value


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"top_k": 2.7}, "top_k"), ({"top_k": True}, "top_k"), ({"top_k": 0}, "top_k"), ({"top_k": 2**63}, "top_k"),
    ({"top_k": "3"}, "top_k"),
])
def test_bad_top_k_is_refused(selector, kwargs, key) -> None:
    with pytest.raises(ConfigValueError, match=f"'{key}'"):
        selector.select(128, 1536, 7168, **kwargs)


def test_bad_batch_and_top_k_in_select_many_are_refused(selector) -> None:
    with pytest.raises(ConfigValueError, match="'batch' has invalid value 0"):
        selector.select_many([{"m": 1, "n": 2, "k": 3}], batch=0)
    with pytest.raises(ConfigValueError, match="'top_k' has invalid value 1.5"):
        selector.select_many([{"m": 1, "n": 2, "k": 3}], top_k=1.5)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"threads": 0}, "threads"), ({"threads": max_threads() + 1}, "threads"), ({"threads": True}, "threads"),
    ({"threads": 1.0}, "threads"), ({"cache_size": -1}, "cache_size"), ({"cache_size": 2.5}, "cache_size"),
])
def test_bad_load_arguments_are_refused(export, kwargs, key) -> None:
    with pytest.raises(ConfigValueError, match=f"'{key}'"):
        KernelSelector.load(export, **kwargs)
    assert 1 <= max_threads() <= (os.cpu_count() or 1)


def test_degenerate_problem_is_flagged_and_gets_no_kernel(selector) -> None:
    """N=1 is legal (>= its minimum) but degenerate: the documented fallback, flagged."""
    a = selector.select(64, 1, 4096)
    assert not a.ok and a.kernels == () and "degenerate" in a.reason
    assert a.out_of_distribution and a.ood_fields == {"n": (1, (576, 9216))}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpred", "select", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(("override", "text"), [
    ("problem.m=-5", "config key 'problem.m' has invalid value -5; allowed: an integer in [1, 9223372036854775807]"),
    ("problem.m=9223372036854775808", "config key 'problem.m' has invalid value 9223372036854775808"),
    ("threads=100000", "config key 'threads' has invalid value 100000"),
    ("+problem.q=4", "config key 'problem.q' has invalid value 4; allowed: a field of op 'gemm_universal'"),
])
def test_select_cli_refuses_bad_values_in_one_line(export, tmp_path, override, text) -> None:
    base = {"problem.m": "128", "problem.n": "1536", "problem.k": "7168"}
    key = override.split("=")[0]
    args = [f"{k}={v}" for k, v in base.items() if k != key] + [override]
    out = _cli(f"model_dir={export}", *args, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert text in out.stderr and "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if "error" in line]) == 1


# -- symlinks ----------------------------------------------------------------------------------------
def test_symlinked_export_dir_is_read_through_and_exported_into(export, tmp_path) -> None:
    real = tmp_path / "v1"
    shutil.copytree(export, real)
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)
    assert KernelSelector.load(link).select(128, 1536, 7168) == KernelSelector.load(export).select(128, 1536, 7168)
    files = {name: (export / name).read_bytes() for name in ("model.onnx", "scorer.onnx", "manifest.json")}
    mf.write_export_dir(link, files)  # follows the link: replaces v1, keeps the link
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "manifest.json").read_bytes() == files["manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v1"]  # no temporary left behind
    KernelSelector.load(link)


# -- structured fuzz over manifests ------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


def mutate(text: str, data: st.DataObject) -> dict[str, Any]:
    """One structural mutation of manifest ``text`` at a random place: delete, replace, truncate, retype."""
    man = json.loads(text)
    node: Any = man
    parent, key = None, None
    for _ in range(data.draw(st.integers(0, 5), label="depth")):
        if isinstance(node, dict) and node:
            k = data.draw(st.sampled_from(sorted(node)), label="key")
        elif isinstance(node, list) and node:
            k = data.draw(st.sampled_from([0, 1, 2, len(node) - 1]) if len(node) > 3
                          else st.integers(0, len(node) - 1), label="index")
            k = min(k, len(node) - 1)
        else:
            break
        parent, key, node = node, k, node[k]
    action = data.draw(st.sampled_from(["delete", "replace", "truncate", "stringify", "negate"]), label="action")
    if parent is None:
        return data.draw(json_values, label="whole") if action == "replace" else man
    if action == "delete":
        del parent[key]
    elif action == "replace":
        parent[key] = data.draw(json_values, label="value")
    elif action == "truncate" and isinstance(node, (list, str)):
        parent[key] = node[: len(node) // 2]
    elif action == "stringify":
        parent[key] = json.dumps(node)[:20]
    elif action == "negate" and isinstance(node, (int, float)) and not isinstance(node, bool):
        parent[key] = -node - 1
    else:
        parent[key] = None
    return man


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_manifests_give_a_named_error_never_another_exception(export, selector, tmp_path_factory,
                                                                        data) -> None:
    text = (export / "manifest.json").read_text()
    base = selector.manifest
    d = tmp_path_factory.mktemp("fuzz") / export.name
    d.mkdir()
    for name in ("model.onnx", "scorer.onnx"):  # read through links: only the manifest varies
        (d / name).symlink_to(export / name)
    man = mutate(text, data)
    (d / "manifest.json").write_text(json.dumps(man))
    try:
        sel = KernelSelector.load(d)
    except CkpredError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:  # only a change outside what the model embeds (the files' list) can load, and it answers the same
        assert {k: v for k, v in man.items() if k != "files"} == {k: v for k, v in base.items() if k != "files"}
        assert sel.select(128, 1536, 7168) == selector.select(128, 1536, 7168)


# -- structured fuzz over problems -------------------------------------------------------------------
problem_values = (st.integers(min_value=-(2**70), max_value=2**70) | st.integers(min_value=0, max_value=20000)
                  | st.floats() | st.booleans() | st.none() | st.text(max_size=6)
                  | st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=problem_values, n=problem_values, top_k=problem_values)
def test_any_problem_value_is_answered_or_refused_by_name(selector, m, n, top_k) -> None:
    try:
        answer = selector.select(m=m, n=n, k=7168, top_k=top_k)
    except ConfigValueError as exc:
        assert exc.key in ("problem.m", "problem.n", "top_k") and "\n" not in str(exc)
    else:
        assert answer.problem["m"] == int(m) and answer.ok == bool(answer.kernels)
        assert 1 <= answer.problem["m"] < 2**63 and 1 <= answer.problem["n"] < 2**63


# -- x14: loading while the export is replaced -------------------------------------------------------
@pytest.mark.slow
def test_x14_a_load_racing_re_exports_gives_the_old_or_the_new_model_never_a_refusal(export, tmp_path) -> None:
    """Two exports swapped in turn at one place (renameat2 exchange, the old one then deleted) as
    fast as they can be written, while the selector is loaded there again and again: every load
    verifies the bytes it read through one directory descriptor, so it is one export or the other."""
    import time

    from ckpred.autotune import model_hash

    other = export_gemm(tmp_path / "other" / export.name, n_estimators=4)
    shas = {hashlib.sha256((d / "model.onnx").read_bytes()).hexdigest() for d in (export, other)}
    target = tmp_path / "live" / export.name
    seen, deadline = set(), time.monotonic() + 60
    with re_exporting(target, (export, other)) as swaps:
        while len(seen) < 2 or swaps[0] < 40:
            assert time.monotonic() < deadline, f"{swaps[0]} swaps, models seen {seen}"
            sel = KernelSelector.load(target, cache_size=0, check_catalogue=False)
            assert model_hash(sel.manifest) in shas
            seen.add(model_hash(sel.manifest))
    assert seen == shas


# -- x13: the export replaced under a loaded selector -------------------------------------------------
@pytest.mark.slow
def test_x13_a_selector_keeps_its_verified_model_when_the_export_is_replaced_under_it(export, tmp_path) -> None:
    """x13: another export written over the files a selector was loaded from changes
    nothing it answers; its store lines stay keyed by the graph it verified at load, and a new
    load sees the new export."""
    from ckpred.autotune import FixedK, model_hash

    other = export_gemm(tmp_path / "other" / export.name, n_estimators=4)
    live = tmp_path / "live" / export.name
    shutil.copytree(export, live)
    sel = KernelSelector.load(live, cache_size=0)
    problems = [{"m": m, "n": n, "k": k} for m, n, k in ((128, 1536, 7168), (1, 4096, 4096), (8192, 256, 512))]
    before = [(a.kernels, a.scores) for a in (sel.select(p, top_k=5) for p in problems)]
    sha = model_hash(sel.manifest)
    new = {name: (other / name).read_bytes() for name in ("model.onnx", "scorer.onnx", "manifest.json")}
    assert hashlib.sha256(new["model.onnx"]).hexdigest() != sha
    for name, data in new.items():  # in place: the same inodes, truncated and rewritten
        with open(live / name, "r+b") as fh:
            fh.truncate(0)
            fh.write(data)
    again = KernelSelector.load(live, cache_size=0)
    assert model_hash(again.manifest) == hashlib.sha256(new["model.onnx"]).hexdigest()
    assert [(a.kernels, a.scores) for a in (again.select(p, top_k=5) for p in problems)] != before  # a different model

    assert [(a.kernels, a.scores) for a in (sel.select(p, top_k=5) for p in problems)] == before
    store = tmp_path / "store.jsonl"
    result = sel.autotune(problems[0], lambda name: 1e-3, FixedK(1), store=store)
    assert not result.from_store and result.kernel == before[0][0][0]
    (line,) = [json.loads(x) for x in store.read_text().splitlines()]
    assert line["model"] == sha


def test_configs_and_the_runtime_bound_threads_by_the_same_cpus(monkeypatch) -> None:
    """A process pinned to one CPU: the config check refuses model.n_jobs=2 as the runtime
    refuses threads=2 (the configs once counted every CPU of the machine instead)."""
    from ckpred.schema.base import check_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert max_threads() == 1
    with pytest.raises(ConfigValueError, match=r"an integer in \[1, 1\]"):
        check_threads("model.n_jobs", 2)
    check_threads("model.n_jobs", 1)
