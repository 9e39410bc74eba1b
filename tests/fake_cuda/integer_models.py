"""Writes the models tests/cuda.rs runs on both backends to check integer tensors on the device
(crates/runtime/src/cuda/integers.rs: a large broadcast of host integers made on the device, compared
there, cast to float), one `NAME.onnx` and `NAME.X.npy` each (X an integer input), their names
in `models.txt`, and `NAME.launches.json` with the kernel launches that show which path ran:

- onehot_i32: an Expand of int32 to 65,536 elements (the device's threshold) compared with a
  scalar and with a vector, and magika's pattern, an Equal of host int32 [64, 1] and a
  [1, 1024] table broadcast to a large output, each cast to float;
- onehot_i64: the same for int64 at rank 3, with Less and Greater too;
- beyond_f32: int64 values past 2^24 (not exact in f32) broadcast and compared stay on the
  host (no device launch for them), and an integer device tensor compared with such a constant
  comes back to the host for it: the results must still be right (in f32, 2^40 and 2^40 + 1
  are one value);
- device_pair: Equal, Less and GreaterOrEqual between two integer device tensors;
- host_readers: an integer device tensor read by ops that need host integers (Shape, ReduceSum
  over integers, Gather's indices, an integer Add), cast to int32 and to bool, and sent out as
  a graph output: the exact integers in their dtypes.

Usage: .venv/bin/python tests/fake_cuda/integer_models.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
F32 = TensorProto.FLOAT


def save(out, name, nodes, x, outputs, constants, launches=None):
    """`name`.onnx of `nodes` on the integer input X (`x`), its outputs `(name, type, shape)`."""
    x_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("X", x_type, list(x.shape))],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", x)
    if launches is not None:
        (out / f"{name}.launches.json").write_text(json.dumps(launches))
    with open(out / "models.txt", "a") as names:
        names.write(name + "\n")


def cast_float(source, target):
    return helper.make_node("Cast", [source], [target], to=F32)


def onehot_i32(out):
    x = ((np.arange(64) * 37) % 300).astype(np.int32).reshape(64, 1)
    save(
        out,
        "onehot_i32",
        [
            helper.make_node("Expand", ["X", "wide"], ["A"]),
            helper.make_node("Equal", ["A", "seven"], ["eq_scalar"]),
            cast_float("eq_scalar", "y_scalar"),
            helper.make_node("Equal", ["A", "row"], ["eq_row"]),
            cast_float("eq_row", "y_row"),
            # magika: host integers whose comparison broadcasts to a large output.
            helper.make_node("Equal", ["X", "table"], ["eq_table"]),
            cast_float("eq_table", "y_table"),
        ],
        x,
        [(n, F32, [64, 1024]) for n in ["y_scalar", "y_row", "y_table"]],
        {
            "wide": np.array([64, 1024], np.int64),
            "seven": np.array(37, np.int32),
            "row": (np.arange(1024) % 300).astype(np.int32),
            "table": (np.arange(1024) % 300).astype(np.int32).reshape(1, 1024),
        },
        # One Expand; the scalar and the row take the fast path, the [64, 1] × [1, 1024]
        # broadcast the general kernel.
        {"gather_strided_f32": 1, "mask_binary_flat_f32": 2, "mask_binary_f32": 1},
    )


def onehot_i64(out):
    x = ((np.arange(32) * 5) % 70).astype(np.int64).reshape(32, 1, 1)
    save(
        out,
        "onehot_i64",
        [
            helper.make_node("Expand", ["X", "wide"], ["A"]),
            helper.make_node("Equal", ["A", "iota"], ["eq"]),
            cast_float("eq", "y_equal"),
            helper.make_node("Less", ["A", "twenty"], ["less"]),
            cast_float("less", "y_less"),
            helper.make_node("Greater", ["iota", "A"], ["greater"]),
            cast_float("greater", "y_greater"),
        ],
        x,
        [(n, F32, [32, 64, 64]) for n in ["y_equal", "y_less", "y_greater"]],
        {
            "wide": np.array([32, 64, 64], np.int64),
            "iota": np.arange(64, dtype=np.int64),
            "twenty": np.array(20, np.int64),
        },
        {"gather_strided_f32": 1, "mask_binary_flat_f32": 3},
    )


def beyond_f32(out):
    big = 1 << 40
    x = (big + np.arange(64) % 3).astype(np.int64).reshape(64, 1)
    save(
        out,
        "beyond_f32",
        [
            helper.make_node("Expand", ["X", "wide"], ["A"]),
            helper.make_node("Equal", ["A", "big_plus_one"], ["eq"]),
            cast_float("eq", "y_expanded"),
            helper.make_node("Equal", ["X", "table"], ["eq_table"]),
            cast_float("eq_table", "y_table"),
            # Exact integers on the device (up to 2^24), compared with 2^24 + 1, which f32
            # rounds to 2^24: on the host.
            helper.make_node("Expand", ["small", "wide"], ["S"]),
            helper.make_node("Equal", ["S", "past_exact"], ["eq_small"]),
            cast_float("eq_small", "y_small"),
        ],
        x,
        [(n, F32, [64, 2048]) for n in ["y_expanded", "y_table", "y_small"]],
        {
            "wide": np.array([64, 2048], np.int64),
            "big_plus_one": np.array(big + 1, np.int64),
            "past_exact": np.array((1 << 24) + 1, np.int64),
            "table": (big + np.arange(2048) % 3).astype(np.int64).reshape(1, 2048),
            "small": ((1 << 24) - 63 + np.arange(64)).astype(np.int64).reshape(64, 1),
        },
        # Only the exact `small` is expanded on the device; no comparison runs there.
        {"gather_strided_f32": 1, "mask_binary_flat_f32": 0, "mask_binary_f32": 0},
    )


def device_pair(out):
    x = ((np.arange(256) * 7) % 256).astype(np.int32).reshape(256, 1)
    save(
        out,
        "device_pair",
        [
            helper.make_node("Expand", ["X", "square"], ["A"]),
            helper.make_node("Reshape", ["X", "row_shape"], ["R"]),
            helper.make_node("Expand", ["R", "square"], ["B"]),
            helper.make_node("Equal", ["A", "B"], ["eq"]),
            cast_float("eq", "y_equal"),
            helper.make_node("Less", ["A", "B"], ["less"]),
            cast_float("less", "y_less"),
            helper.make_node("GreaterOrEqual", ["B", "A"], ["ge"]),
            cast_float("ge", "y_greater_or_equal"),
        ],
        x,
        [(n, F32, [256, 256]) for n in ["y_equal", "y_less", "y_greater_or_equal"]],
        {
            "square": np.array([256, 256], np.int64),
            "row_shape": np.array([1, 256], np.int64),
        },
        {"gather_strided_f32": 2, "mask_binary_flat_f32": 3},
    )


def host_readers(out):
    x = (np.arange(128) % 50).astype(np.int64).reshape(128, 1)
    i64 = TensorProto.INT64
    save(
        out,
        "host_readers",
        [
            helper.make_node("Expand", ["X", "wide"], ["A"]),
            helper.make_node("Shape", ["A"], ["y_shape"]),
            helper.make_node("ReduceSum", ["A", "axis1"], ["y_sum"], keepdims=1),
            helper.make_node("Gather", ["table", "A"], ["rows"]),
            helper.make_node("ReduceSum", ["rows", "axis1"], ["y_gathered"], keepdims=0),
            helper.make_node("Add", ["A", "one"], ["y_plus_one"]),
            helper.make_node("Cast", ["A"], ["y_int32"], to=TensorProto.INT32),
            helper.make_node("Cast", ["A"], ["nonzero"], to=TensorProto.BOOL),
            cast_float("nonzero", "y_nonzero"),
            helper.make_node("Identity", ["A"], ["y_ints"]),
        ],
        x,
        [
            ("y_shape", i64, [2]),
            ("y_sum", i64, [128, 1]),
            ("y_gathered", F32, [128, 3]),
            ("y_plus_one", i64, [128, 1024]),
            ("y_int32", TensorProto.INT32, [128, 1024]),
            ("y_nonzero", F32, [128, 1024]),
            ("y_ints", i64, [128, 1024]),
        ],
        {
            "wide": np.array([128, 1024], np.int64),
            "axis1": np.array([1], np.int64),
            "table": np.random.default_rng(19).standard_normal((50, 3)).astype(np.float32),
            "one": np.array(1, np.int64),
        },
        # The Expand and the Cast to bool (`mask_unary_f32`) run on the device.
        {"gather_strided_f32": 1, "mask_unary_f32": 1},
    )


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.txt").write_text("")
    onehot_i32(out)
    onehot_i64(out)
    beyond_f32(out)
    device_pair(out)
    host_readers(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
