"""The expression language: values, refusals with named keys, cycles, numpy/ONNX parity."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ckpred.errors import ConfigValueError
from ckpred.expressions import Expression, dtype_bytes_table, evaluate_derived, parse, topological_order
from ckpred.export.converters import OnnxOps, Sym
from ckpred.export.factorise import HybridOps
from ckpred.export.onnx import IR_VERSION, GraphBuilder
from ckpred.features.base import NumpyOps

COLS = {"m": np.array([100.0, 256.0, 1000.0]), "n": np.array([64.0, 64.0, 7.0]),
        "dtype": np.array([0.0, 1.0, 2.0])}
CATS = {"dtype": ["fp8", "fp16", "fp32"]}
HW = {"cus": 256.0, "xcds": 8.0}


def ev(text: str, **kw):
    return parse(text, key="k").evaluate(COLS, HW, NumpyOps(3), categories=CATS, **kw)


@pytest.mark.parametrize("text, expected", [
    ("m * 2 + 1", [201, 513, 2001]),
    ("ceil_div(m, n)", [2, 4, 143]),
    ("m // n", [1, 4, 142]),
    ("m % n", [36, 0, 6]),
    ("n ** 2", [4096, 4096, 49]),
    ("-m + 3", [-97, -253, -997]),
    ("m > 200", [0, 1, 1]),
    ("(m >= 256) * 5", [0, 5, 5]),
    ("m if m > 200 else n", [64, 256, 1000]),
    ("where(m > 200 and n < 10, 1, 2)", [2, 2, 1]),
    ("m < 200 or n < 10", [1, 0, 1]),
    ("not m > 200", [1, 0, 0]),
    ("100 < m <= 256", [0, 1, 0]),
    ("m != 256", [1, 0, 1]),
    ("min(m, n, 50)", [50, 50, 7]),
    ("max(m, 200)", [200, 256, 1000]),
    ("floor(m / 3)", [33, 85, 333]),
    ("ceil(m / 3)", [34, 86, 334]),
    ("abs(n - m)", [36, 192, 993]),
    ("sqrt(m)", [10, 16, np.sqrt(1000.0)]),
    ("log2(m)", [np.float32(np.log(100.0) / np.log(2.0)), 8, np.float32(np.log(1000.0) / np.log(2.0))]),
    ("dtype_bytes(dtype)", [1, 2, 4]),
    ("dtype_bytes('fp16') * m", [200, 512, 2000]),
    ("dtype == 'fp16'", [0, 1, 0]),
    ("'fp16' == dtype", [0, 1, 0]),
    ("contains(dtype, 'fp')", [1, 1, 1]),
    ("contains(dtype, '16') + 2 * contains(dtype, 'p3')", [0, 1, 2]),
    ("contains(dtype, 'bf')", [0, 0, 0]),
    ("m / (hw.cus / hw.xcds)", [100 / 32, 8, 1000 / 32]),
    ("7 // 2 + 2 ** 10", [1027, 1027, 1027]),
    ("1 / 0", [np.inf] * 3),
])
def test_values_by_hand(text, expected):
    np.testing.assert_array_equal(ev(text), np.asarray(expected, dtype=np.float64))


def test_introspection_and_constants():
    e = parse("log2(m) * hw.cus + ceil_div(n, hw.xcds) + dtype_bytes(dtype)", key="k")
    assert e.names == {"m", "n", "dtype"}
    assert e.hw_names == {"cus", "xcds"}
    assert e.functions == {"log2", "ceil_div", "dtype_bytes"}
    assert parse("hw.cus * 2", key="k").evaluate(COLS, HW, broadcast=False) == 512.0
    assert parse(3, key="k").evaluate({}, {}, NumpyOps(2)).tolist() == [3.0, 3.0]
    # A categorical field fixed for the table (a string) works like a column of it.
    assert parse("dtype_bytes(dtype) * 8", key="k").evaluate({"dtype": "bf16"}, broadcast=False) == 16.0
    assert parse("m > 5", key="k").evaluate_bool(COLS).tolist() == [True, True, True]


def test_dtype_bytes_table_reads_the_dtype_configs():
    table = dtype_bytes_table()
    assert {k: table[k] for k in ("bf16", "bf8", "fp16", "fp32", "fp8")} == {"bf16": 2, "bf8": 1, "fp16": 2, "fp32": 4,
                                                                           "fp8": 1}
    # the names real tables use, as the dtype configs' aliases
    assert (table["float16"], table["bfloat16"], table["float32"], table["float8_e4m3fn"]) == (2, 2, 4, 1)


def test_dtype_bytes_reads_an_alias_in_a_categorical_field_and_a_literal():
    import numpy as np

    expr = parse("dtype_bytes(precision) * m + dtype_bytes('bfloat16')", key="k").validate(
        ["precision", "m"], (), categories={"precision": ["float16", "float32", "fp8"]})
    out = expr.evaluate({"precision": np.array([0.0, 1.0, 2.0]), "m": np.array([1.0, 1.0, 1.0])}, {}, np,
                        categories={"precision": ["float16", "float32", "fp8"]})
    assert list(out) == [4.0, 6.0, 3.0]


@pytest.mark.parametrize("text, fragment", [
    ("m +", "invalid syntax"),
    ("foo(m)", "the call 'foo(m)'"),
    ("m.x", "the attribute 'm.x'"),
    ("m[0]", "the construct 'm[0]'"),
    ("lambda: 1", "the construct"),
    ("hw * 2", "hw without a constant name"),
    ("log2(m, n)", "log2() takes 1 argument"),
    ("min(m)", "min() takes at least 2"),
    ("max(m, key=n)", "keyword"),
    ("m @ n", "the operator"),
    ("m in n", "the comparison"),
    ("", "a non-empty expression"),
    ("None", "the constant"),
    ("log2", "a function name without a call"),
    ("contains(m)", "contains() takes 2 argument"),
    ("contains('fp', dtype)", "contains() takes a categorical field first"),
    ("contains(dtype, 16)", "contains() takes a non-empty string literal second"),
    ("contains(dtype, '')", "contains() takes a non-empty string literal second"),
])
def test_parse_errors_name_the_key(text, fragment):
    with pytest.raises(ConfigValueError) as info:
        parse(text, key="features.groups[0].params.features.x")
    assert info.value.key == "features.groups[0].params.features.x"
    assert fragment in str(info.value)


def test_non_string_refused():
    with pytest.raises(ConfigValueError, match="an expression string"):
        parse(["m"], key="k")


def test_unknown_names_named():
    e = parse("m * zz + hw.foo", key="op.flops")
    with pytest.raises(ConfigValueError) as info:
        e.validate(["m", "n"], ["cus"])
    assert (info.value.key, info.value.value) == ("op.flops", "zz")
    assert "['m', 'n']" in info.value.allowed
    with pytest.raises(ConfigValueError) as info:
        parse("m * hw.foo", key="op.flops").validate(["m"], ["cus", "xcds"])
    assert info.value.value == "hw.foo" and "['cus', 'xcds']" in info.value.allowed
    with pytest.raises(ConfigValueError) as info:
        parse("dtype == 'fp64'", key="k").validate(["dtype"], categories=CATS)
    assert info.value.value == "fp64"
    assert parse("m * hw.cus", key="k").validate(["m"], ["cus"]).names == {"m"}
    # Unvalidated names still fail at evaluation, named.
    with pytest.raises(ConfigValueError, match="'zz'"):
        ev("zz + 1")
    with pytest.raises(ConfigValueError, match="hw.nope"):
        ev("hw.nope")


@pytest.mark.parametrize("text, fragment", [
    ("dtype == 'fp64'", "a value of field 'dtype'"),
    ("m == 'fp16'", "categorical field"),
    ("dtype < 'fp16'", "== or !="),
    ("dtype_bytes('int4')", "a dtype name"),
    ("dtype_bytes(m)", "categorical dtype field"),
    ("'fp8' + 1", "a number here"),
    ("contains(m, 'fp')", "a categorical field in contains"),
])
def test_evaluation_errors_named(text, fragment):
    with pytest.raises(ConfigValueError, match=fragment.replace("(", r"\(")):
        ev(text)


def test_dtype_bytes_of_a_non_dtype_field_refused():
    with pytest.raises(ConfigValueError, match="dtype names"):
        parse("dtype_bytes(layout)", key="k").evaluate({"layout": np.zeros(2)}, categories={"layout": ["rcr"]})


def test_topological_order_and_cycles():
    exprs = {name: parse(text, key=f"input.columns.{name}")
             for name, text in {"a": "b + 1", "b": "time * 2", "time": "time / 1000"}.items()}
    assert topological_order(exprs, key="input.columns", external=["time"]) == ["time", "b", "a"]
    out = evaluate_derived(exprs, {"time": np.array([2000.0])}, key="input.columns")
    assert out["a"].tolist() == [5.0] and out["time"].tolist() == [2.0]
    cyclic = {name: parse(text, key="c") for name, text in {"a": "b + 1", "b": "c", "c": "a * 2"}.items()}
    with pytest.raises(ConfigValueError) as info:
        topological_order(cyclic, key="input.columns")
    assert info.value.key == "input.columns.a" and info.value.value == "a -> b -> c -> a"
    with pytest.raises(ConfigValueError, match="x -> x"):
        topological_order({"x": parse("x + 1", key="c")}, key="input.columns")


# -- numpy vs ONNX parity ---------------------------------------------------------------------------
PARITY = [
    "m * n + k", "2 * m * n * k / ((m * k + k * n + m * n) * dtype_bytes(dtype))", "log2(m * n)",
    "ceil_div(m, tile) * ceil_div(n, tile)", "m // tile", "m % tile", "m ** 3", "sqrt(m) - abs(n - k)",
    "where(m % tile == 0, 1, (m % tile) / tile)", "ceil(ceil_div(m, tile) * ceil_div(n, tile) / hw.cus)",
    "min(m, n, k) / max(m, hw.xcds)", "m if m >= n and not k < 4 else n / 2", "m < n or n <= k",
    "m > n", "m != k", "dtype == 'fp16'", "dtype_bytes(dtype)", "floor(k / 3) + hw.cus / hw.xcds",
    "-m + 1 / (k - k)", "3.5", "contains(dtype, 'p1') * m + contains(dtype, 'fp')",
]


class _Scope:
    def __init__(self) -> None:
        self.count = 0

    def get_unique_variable_name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    get_unique_operator_name = get_unique_variable_name


class _Container:
    """The part of skl2onnx's ModelComponentContainer OnnxOps uses."""

    target_opset = 21

    def __init__(self) -> None:
        self.nodes, self.initializers = [], []

    def add_node(self, op_type, inputs, outputs, name=None, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))

    def add_initializer(self, name, dtype, dims, values):
        self.initializers.append(helper.make_tensor(name, dtype, dims, values))


def _random_columns(seed: int, n: int = 500) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"m": rng.integers(0, 70000, n).astype(np.float64), "n": rng.integers(1, 5000, n).astype(np.float64),
            "k": rng.choice([1.0, 3.0, 64.0, 97.0, 2.0**20, 12345.0], n),
            "tile": rng.choice([16.0, 32.0, 64.0, 128.0, 256.0], n), "dtype": rng.integers(0, 3, n).astype(np.float64)}


def _onnx_outputs(texts: list[str], cols: dict[str, np.ndarray]) -> np.ndarray:
    """Each expression through OnnxOps (the skl2onnx converters' namespace), run by onnxruntime."""
    names = list(cols)
    scope, container = _Scope(), _Container()
    ops = OnnxOps(scope, container, "X")
    symbols = {name: ops.column(j) for j, name in enumerate(names)}
    outs = [parse(t, key="k").evaluate(symbols, HW, ops, categories=CATS).name for t in texts]
    container.add_node("Concat", outs, ["Y"], name="concat", axis=1)
    graph = helper.make_graph(container.nodes, "expr",
                              [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [None, len(names)])],
                              [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [None, len(texts)])],
                              container.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": np.column_stack([cols[n] for n in names])})[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_onnx_parity(seed):
    cols = _random_columns(seed)
    with np.errstate(all="ignore"):
        expected = np.column_stack([ev_cols(t, cols) for t in PARITY])
    got = _onnx_outputs(PARITY, cols)
    np.testing.assert_array_equal(got, expected)


def ev_cols(text: str, cols: dict[str, np.ndarray]) -> np.ndarray:
    return parse(text, key="k").evaluate(cols, HW, NumpyOps(len(cols["m"])), categories=CATS)


def test_hybrid_parity_static_and_symbolic():
    """The selector's namespace: kernel columns static, problem columns symbolic, same values."""
    cols = _random_columns(2, n=64)
    g = GraphBuilder()
    ops = HybridOps(g)
    problem = {name: ops.symbol(g.column("P", j)) for j, name in enumerate(("m", "n", "k", "dtype"))}
    texts = ["ceil_div(m, tile) * ceil_div(n, tile)", "log2(tile) * 2", "where(m % tile == 0, 1, (m % tile) / tile)",
             "tile > 64 and m > n", "dtype_bytes(dtype) * tile", "contains(dtype, 'fp1') * tile"]
    outs = []
    for t in texts:
        value = parse(t, key="k").evaluate({**problem, "tile": cols["tile"][:, None]}, HW, ops, categories=CATS)
        if isinstance(value, Sym):
            outs.append(value.name)
        else:  # static: every row the same problem-independent value
            outs.append(g.op("Add", g.op("Mul", g.column("P", 0), g.const([0.0])), g.const(np.asarray(value))))
    g.op("Concat", *outs, axis=1, out="Y")
    graph = helper.make_graph(g.nodes, "hybrid", [helper.make_tensor_value_info("P", TensorProto.DOUBLE, [None, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [None, len(texts)])],
                              g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"P": np.column_stack([cols[n] for n in ("m", "n", "k", "dtype")])})[0]
    with np.errstate(all="ignore"):
        expected = np.column_stack([ev_cols(t, cols) for t in texts])
    np.testing.assert_array_equal(got, expected)


def test_expression_is_not_evaluated_by_python():
    """Names that Python would resolve (builtins, dunders) are plain unknown fields here."""
    with pytest.raises(ConfigValueError, match="'__import__'"):
        ev("__import__")
    with pytest.raises(ConfigValueError, match="the call"):
        parse("__import__('os').system('true')", key="k")
    assert isinstance(Expression.parse("m", key="k"), Expression)
