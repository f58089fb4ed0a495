"""Kernel names: the template's parse and format, the declared op's ``format_name`` and the
ingestion's kernel resolver, pinned against their definitions.

A placeholder's text becomes ``int(text)``, ``float(text)``, ``True``/``False`` or the text
itself; a value's canonical text is ``str(int(v))``, ``repr(float(v))``, ``str(bool(v))`` or
``str(v)``, whatever the value's type. Names written in other spellings (leading zeros, ``-0``,
lower-case booleans, ``1.50``, ``2E3``) parse to the same values and format to the canonical
name; a name formats back to itself exactly when every placeholder is written canonically.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpred.data.readers.common import KernelResolver, kernel_rule_reasons
from ckpred.errors import KernelNameError
from ckpred.kernels.base import Field, load_op
from ckpred.kernels.gemm_universal import OP as GEMM
from ckpred.kernels.template import KernelTemplate

#: A template with every kind, literal '%' and braces, and a categorical value holding '%s'.
KINDS = {"tile": ("int", ()), "scale": ("float", ()), "pad": ("bool", ()),
         "pipe": ("categorical", ("mem", "memv2", "c%s"))}
TEMPLATE = KernelTemplate("k%_{pipe}_{{x}}_{tile}x_{scale}_{pad}%d", KINDS, key="op.kernel_id.template")
_BOOLS = {"True": True, "true": True, "False": False, "false": False}


def _reference_text(value: Any, kind: str) -> str:
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return repr(float(value))
    if kind == "bool":
        return str(bool(value))
    return str(value)


def _reference_format(template: KernelTemplate, values: dict[str, Any]) -> str:
    return "".join(literal + (_reference_text(values[n], template.kinds[n][0]) if n else "")
                   for literal, n in template.parts)


def _reference_value(text: str, kind: str) -> Any:
    return int(text) if kind == "int" else float(text) if kind == "float" else _BOOLS[text] if kind == "bool" else text


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        return type(exc).__name__, str(exc)


# Each placeholder written canonically or not: (text, canonical?).
_int_texts = st.integers(-10**25, 10**25).flatmap(lambda v: st.sampled_from(
    [(str(v), True), ("0" + str(v) if v >= 0 else "-0" + str(-v), False)] + ([("-0", False)] if v == 0 else [])))
_float_texts = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: (repr(v), True)),
    st.sampled_from([("1.50", False), ("2E3", False), ("2e3", False), ("007.5", False), ("-0", False), ("1", False)]))
_bool_texts = st.sampled_from([("True", True), ("False", True), ("true", False), ("false", False)])
_pipe_texts = st.sampled_from([("mem", True), ("memv2", True), ("c%s", True)])


@given(pipe=_pipe_texts, tile=_int_texts, scale=_float_texts, pad=_bool_texts)
def test_a_name_in_any_spelling_parses_to_its_values_and_formats_canonically(pipe, tile, scale, pad) -> None:
    texts = {"pipe": pipe[0], "tile": tile[0], "scale": scale[0], "pad": pad[0]}
    name = f"k%_{texts['pipe']}_{{x}}_{texts['tile']}x_{texts['scale']}_{texts['pad']}%d"
    got = TEMPLATE.parse(name)
    want = {n: _reference_value(texts[n], KINDS[n][0]) for n in TEMPLATE.names}
    assert got == want and [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert list(got) == list(TEMPLATE.names)
    canonical = TEMPLATE.format(got)
    assert canonical == _reference_format(TEMPLATE, got)
    assert (canonical == name) == all(t[1] for t in (pipe, tile, scale, pad))
    assert TEMPLATE.parse(canonical) == got


_int_values = st.one_of(st.integers(-10**30, 10**30), st.booleans(), st.integers(-99, 99).map(float),
                        st.integers(-99, 99).map(np.int64), st.floats(-1e3, 1e3), st.just("12"), st.just("x"),
                        st.just(None))
_float_values = st.one_of(st.floats(), st.integers(-10**30, 10**30), st.booleans(), st.just(np.float32(0.1)),
                          st.just("1.5"), st.just("x"))
_bool_values = st.one_of(st.booleans(), st.integers(-2, 2), st.just(np.bool_(True)), st.just(""), st.just("x"),
                         st.just(None))
_pipe_values = st.one_of(st.sampled_from(["mem", "memv2", "c%s", "other"]), st.integers(), st.just(None))


@given(values=st.fixed_dictionaries({"pipe": _pipe_values, "tile": _int_values, "scale": _float_values,
                                     "pad": _bool_values}),
       drop=st.sampled_from([None, "pipe", "tile", "scale", "pad"]))
def test_format_gives_the_canonical_text_of_any_value_or_the_same_error(values, drop) -> None:
    """Values of other types (floats and numpy ints for an int, 0/1 for a bool...) format as
    their canonical text; a missing or unconvertible value raises what the definition raises,
    for the first such placeholder in template order."""
    if drop is not None:
        values = {k: v for k, v in values.items() if k != drop}
    assert _outcome(TEMPLATE.format, values) == _outcome(_reference_format, TEMPLATE, values)


def test_a_template_with_one_or_no_placeholder_formats_and_parses() -> None:
    one = KernelTemplate("{solver}", {"solver": ("categorical", ("a<3-2>", "b"))}, key="k")
    assert one.format({"solver": "a<3-2>"}) == "a<3-2>" and one.parse("b") == {"solver": "b"}
    none = KernelTemplate("only_%_text", {}, key="k")
    assert none.format({}) == "only_%_text" and none.parse("only_%_text") == {}
    with pytest.raises(KernelNameError, match="only_"):
        none.parse("only_text")


def test_number_texts_convert_as_int_and_float_do_whatever_names_came_before() -> None:
    """Parsing looks number texts up in a table filled as they come: the values and errors are
    those of ``int``/``float`` of the text, past the table's limit too."""
    tpl = KernelTemplate("t{tile}_{scale}", {"tile": ("int", ()), "scale": ("float", ())}, key="k")
    for table in tpl._texts:
        table.limit = 3
    for text in ("7", "007", "-0", "12", "7", "-12", "1", "0"):
        got = tpl.parse(f"t{text}_{text}")
        assert got == {"tile": int(text), "scale": float(text)} and [type(v) for v in got.values()] == [int, float]
        assert all(len(table) <= 3 for table in tpl._texts)
    huge = "9" * 5000  # more digits than int() converts: its error, every time
    for _ in range(2):
        assert _outcome(tpl.parse, f"t{huge}_1") == _outcome(int, huge)
    assert tpl.parse(f"t1_{huge}")["scale"] == float("inf")


def _gemm_fields(**change: Any) -> dict[str, Any]:
    base = dict(tile_m=128, tile_n=128, tile_k=64, warp_m=2, warp_n=2, warp_k=1, warp_tile_m=32, warp_tile_n=32,
                warp_tile_k=16, pipeline="compv3", scheduler="intrawave", epilogue="cshuffle", pad_m=False,
                pad_n=False, pad_k=False, persistent=True)
    return {**base, **change}


class _Named:
    name = "bf16"


def test_declared_format_name_fills_defaults_and_takes_the_run_dtype_and_layout() -> None:
    fields = _gemm_fields()
    name = "gemm_universal_fp8_rcr_compv3_cshuffle_intrawave_False_False_False_True_128x128x64_2x2x1_32x32x16"
    assert GEMM.format_name(fields, dtype="fp8", layout="rcr") == name
    # fields with defaults may be left out; a pair list is a mapping too
    short = {k: v for k, v in fields.items() if k not in ("pad_m", "pad_n", "pad_k")}
    assert GEMM.format_name(list(short.items()), dtype="fp8", layout="rcr") == name
    # the run's dtype/layout (a config object's name) win over the mapping's; empty ones do not
    assert GEMM.format_name({**fields, "dtype": "fp16", "layout": "rrr"}, dtype=_Named(), layout="") == \
        name.replace("_fp8_rcr_", "_bf16_rrr_")
    with pytest.raises(KeyError, match="dtype"):
        GEMM.format_name(fields, dtype="", layout="rcr")
    with pytest.raises(KeyError, match="tile_m"):
        GEMM.format_name({k: v for k, v in fields.items() if k != "tile_m"}, dtype="fp8", layout="rcr")
    assert GEMM.format_name(fields, dtype="fp8", layout="rcr", form="parity") == "gemm_" + name[len("gemm_universal_"):]


@settings(deadline=None)  # the first example compiles the op's kernel rules
@given(spell=st.lists(st.booleans(), min_size=16, max_size=16), parity=st.booleans())
def test_the_resolver_merges_every_spelling_of_a_kernel_into_its_canonical_name(spell, parity) -> None:
    fields = _gemm_fields()
    canonical = GEMM.format_name(fields, dtype="fp8", layout="rcr")
    texts = canonical[len("gemm_universal_"):].split("_")
    odd = {"True": "true", "False": "false"}
    # the 9 integers are the last three 'AxBxC' groups; write them with leading zeros
    for i, text in enumerate(texts):
        if spell[i] and text in odd:
            texts[i] = odd[text]
        elif spell[i] and "x" in text:
            texts[i] = "x".join("0" + t for t in text.split("x"))
    name = ("gemm_" if parity else "gemm_universal_") + "_".join(texts)
    resolver = KernelResolver(GEMM, dtype="fp8", layout="rcr")
    assert resolver.resolve_all([canonical, name, canonical]) == [0, 0, 0]
    assert resolver.canonical_names == [canonical] and resolver.kernels == [fields]


class _StubOp:
    """An op whose name parser returns given mappings (what a plug-in could return)."""

    name = "stub"
    kernel_fields = (Field("a"), Field("b"), Field("c", default=7))
    kernel_names = ("a", "b", "c")

    def __init__(self, parsed: dict[str, dict[str, Any]]) -> None:
        self.parsed = parsed

    def parse_name(self, name: str) -> dict[str, Any]:
        if name not in self.parsed:
            raise KernelNameError(name, "not a stub name")
        return dict(self.parsed[name])

    def format_name(self, kernel: dict[str, Any], *, dtype: str, layout: str) -> str:
        if kernel["a"] == 99:
            raise ValueError("no name for a=99")
        return f"a{kernel['a']}_b{kernel['b']}_c{kernel['c']}"


def test_the_resolver_names_the_first_field_at_fault_and_keeps_what_the_parser_gives() -> None:
    big = 2**63
    op = _StubOp({"none": {"a": 1, "b": None}, "big": {"a": big, "b": 1}, "nob": {"a": big},
                  "noa": {"b": big}, "edge": {"a": True, "b": -big, "c": big - 1}, "fp16": {"a": 1, "dtype": "fp16"},
                  "rrr": {"a": 1, "b": 2, "layout": "rrr"}, "unnamed": {"a": 99, "b": 1},
                  "other": {"a": 1, "b": 2, "c": 7}})
    resolver = KernelResolver(op, dtype="fp8", layout="rcr")
    names = ["none", "big", "nob", "noa", "edge", "fp16", "rrr", "unnamed", "other", "junk", None]
    assert resolver.resolve_all(names) == [
        0, f"unparseable kernel name: a={big} is beyond int64", f"unparseable kernel name: a={big} is beyond int64",
        "unparseable kernel name: the name gives no a", 1,
        "dtype mismatch: kernel name says dtype=fp16, config has dtype=fp8",
        "layout mismatch: kernel name says layout=rrr, config has layout=rcr", 2, 3,
        "unparseable kernel name: not a stub name", "missing kernel name: got None"]
    assert resolver.kernels == [{"a": 1, "b": None, "c": 7}, {"a": True, "b": -big, "c": big - 1},
                                {"a": 99, "b": 1, "c": 7}, {"a": 1, "b": 2, "c": 7}]
    # a kernel the op cannot name keeps the name it was given
    assert resolver.canonical_names == ["a1_bNone_c7", f"aTrue_b{-big}_c{big - 1}", "unnamed", "a1_b2_c7"]
    # no dtype/layout in the config: nothing to mismatch
    free = KernelResolver(op, dtype=None, layout=None)
    assert free.resolve_all(["fp16", "rrr"]) == ["unparseable kernel name: the name gives no b", 0]
    assert free.resolve_fields({"a": 99, "b": 1}) == ("unnamed kernel: the op cannot name {'a': 99, 'b': 1} "
                                                      "(ValueError: no name for a=99)")
    assert free.resolve_fields({"a": 5, "b": 1}) == ("unnamed kernel: the op cannot name {'a': 5, 'b': 1} "
                                                     "(KeyError: 'c')")
    assert free.resolve_fields({"a": 1, "b": 2, "c": 7}) == 0


def test_the_resolver_judges_each_name_of_a_batch_as_it_judges_it_alone() -> None:
    """Kernel fields are checked a column at a time over a batch of names (a column of ints by
    its least and greatest value); a batch with a field at fault somewhere has each name
    checked on its own. Either way a name gets what it gets resolved alone."""
    big = 2**63
    op = _StubOp({"edges": {"a": -big, "b": big - 1}, "bools": {"a": True, "b": False}, "over": {"a": 1, "b": big},
                  "under": {"a": -big - 1, "b": 1}, "noa": {"b": 1, "c": big}, "mixed": {"a": 1, "b": 2.5, "c": "x"},
                  "none": {"a": None, "b": 3}})
    over = f"unparseable kernel name: b={big} is beyond int64"
    under = f"unparseable kernel name: a={-big - 1} is beyond int64"
    noa = "unparseable kernel name: the name gives no a"
    for names, want in ((["edges", "bools", "mixed", "none"], [0, 1, 2, 3]), (["edges", "over"], [0, over]),
                        (["under", "bools"], [under, 0]), (["noa", "bools"], [noa, 0]),
                        (["edges", "over", "bools", "under", "noa", "mixed"], [0, over, 1, under, noa, 2])):
        batch, alone = KernelResolver(op, dtype=None, layout=None), KernelResolver(op, dtype=None, layout=None)
        assert batch.resolve_all(names) == [alone.resolve(n) for n in names] == want
        assert batch.kernels == alone.kernels and batch.canonical_names == alone.canonical_names
    assert batch.canonical_names == [f"a{-big}_b{big - 1}_c7", "aTrue_bFalse_c7", "a1_b2.5_cx"]


def test_the_kernel_frame_is_built_once_per_kernel_count_and_each_caller_gets_its_own() -> None:
    op = _StubOp({"x": {"a": 1, "b": 2}, "y": {"a": 3, "b": 4}})
    resolver = KernelResolver(op, dtype=None, layout=None)
    resolver.resolve_all(["x"])
    first = resolver.frame()
    first["a"] = 100
    del first["b"]
    again = resolver.frame()
    assert again.to_dict("records") == [{"a": 1, "b": 2, "c": 7, "kernel_name": "a1_b2_c7"}]
    resolver.resolve_all(["y"])
    assert resolver.frame()["kernel_name"].tolist() == ["a1_b2_c7", "a3_b4_c7"]


def test_kernel_rules_judge_only_kernels_with_every_field() -> None:
    bad_tile = _gemm_fields(tile_m=100)
    no_pipeline = {k: v for k, v in bad_tile.items() if k != "pipeline"}
    none_pipeline = {**bad_tile, "pipeline": None}
    defaults_left_out = {k: v for k, v in bad_tile.items() if k not in ("pad_m", "persistent")}
    message = "the block tile is not a whole number of warp tiles"
    assert kernel_rule_reasons(GEMM, [bad_tile, _gemm_fields(), no_pipeline, none_pipeline, defaults_left_out]) == \
        [message, "", "", "", message]


def test_a_tuple_kernel_id_round_trips() -> None:
    op = load_op({"name": "tuple_names", "problem_fields": {"m": {"kind": "int"}},
                  "kernel_fields": {"w": {"kind": "int"}, "on": {"kind": "bool", "default": True},
                                    "kind": {"kind": "categorical", "values": ["a", "b"]}},
                  "kernel_id": {"fields": ["w", "on", "kind"]},
                  "metric": {"column": "t", "better": "lower", "unit": "ms"},
                  "keys": {"query": ["m"]}})
    assert op.parse_name("(007, 1, b)") == {"w": 7, "on": True, "kind": "b"}
    assert op.format_name({"w": 7.0, "kind": "b"}) == "(7,True,b)"
    resolver = KernelResolver(op, dtype="fp8", layout="rcr")
    assert resolver.resolve_all(["(7,True,b)", "(07, true, b)", "(1,2,b)"]) == [0, 0, "unparseable kernel name: "
                                                                                    "on='2' is not a bool"]


# -- two kernels of one name (F02) ------------------------------------------------------------------
_PIECES = st.text(alphabet="xyz_1", min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(literals=st.lists(st.text(alphabet="xyz_", max_size=2), min_size=4, max_size=4),
       values=st.lists(st.lists(_PIECES, min_size=1, max_size=3, unique=True), min_size=3, max_size=3))
def test_find_collision_agrees_with_enumerating_every_combination(literals: list[str],
                                                                  values: list[list[str]]) -> None:
    """The overhang search finds two choices printing alike exactly when some pair of the whole
    cartesian product does, and the pair it returns does."""
    from itertools import product

    from ckpred.kernels.template import find_collision

    names = ["a", "b", "c"]
    parts = [(literals[0], "a"), (literals[1], "b"), (literals[2], "c"), (literals[3], None)]
    texts = dict(zip(names, values))

    def show(choice: dict[str, str]) -> str:
        return "".join(lit + (choice[n] if n else "") for lit, n in parts)

    printed: dict[str, tuple[str, ...]] = {}
    collides = False
    for combo in product(*values):
        name = show(dict(zip(names, combo)))
        collides |= name in printed and printed[name] != combo
        printed.setdefault(name, combo)
    found = find_collision(parts, texts)
    assert (found is not None) == collides, (parts, texts)
    if found is not None:
        a, b = found
        assert a != b and show(a) == show(b)


def test_templates_printing_two_kernels_alike_are_refused_when_the_op_is_composed() -> None:
    from ckpred.errors import ConfigValueError
    from ckpred.kernels.template import check_round_trip

    kinds = {"m": ("int", ()), "v": ("categorical", ("x", "xy")), "t": ("categorical", ("yz", "z")),
             "p": ("categorical", ("a-b", "a")), "q": ("categorical", ("c", "b-c"))}
    for text, shown in (("bm{m}_{v}{t}", "v=x, t=yz and v=xy, t=z both print 'bm1_xyz'"),
                        ("{p}-{q}", "'a-b-c'"), ("bm{m}{m2}", "both print 'bm112'")):
        with pytest.raises(ConfigValueError, match=shown):
            check_round_trip(KernelTemplate(text, {**kinds, "m2": ("int", ())}, key="op.kernel_id.template"))
    for text in ("bm{m}_{v}_{t}", "{p}_{q}", "{v}{m}"):
        check_round_trip(KernelTemplate(text, kinds, key="op.kernel_id.template"))
