"""Writes `elementwise.onnx` and its inputs `elementwise.X.npy` and `elementwise.Z.npy` (the
venv's onnx and numpy, seeded) for tests/cuda.rs: binary ops, comparisons and Where (on a
device mask and on a host boolean tensor) in every operand layout the element-wise fast path takes (same shape, a scalar first or second, a
trailing row, a row with leading 1s) and in layouts it leaves to the general kernels (a
broadcast in the middle or at the end), at odd sizes (3 × 5 × 7, and 257 × 1001: many
blocks, the last one partly filled).

Usage: .venv/bin/python tests/fake_cuda/elementwise_models.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(6)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) + 0.5, name)

    initializers = [
        weight("same", 3, 5, 7), weight("scalar"), weight("row", 7), weight("plane", 5, 7),
        weight("leading_ones", 1, 5, 7), weight("column", 5, 1), weight("middle", 3, 1, 7),
        weight("wide_row", 1001), numpy_helper.from_array(np.ones(1, np.float32), "one"),
        numpy_helper.from_array(rng.standard_normal(7) > 0, "flags_row"),
        numpy_helper.from_array(rng.standard_normal([5, 1]) > 0, "flags_column"),
    ]
    n = helper.make_node
    nodes = [
        n("Add", ["X", "same"], ["add_same"]),
        n("Mul", ["X", "scalar"], ["mul_scalar"]),
        n("Sub", ["scalar", "X"], ["sub_scalar_first"]),
        n("Div", ["X", "row"], ["div_row"]),
        n("Abs", ["X"], ["abs"]),
        n("Add", ["abs", "one"], ["base"]),
        n("Pow", ["base", "plane"], ["pow_plane"]),
        n("Max", ["X", "leading_ones"], ["max_leading_ones"]),
        n("PRelu", ["X", "row"], ["prelu_row"]),
        n("Mod", ["X", "row"], ["mod_row"], fmod=1),
        n("Add", ["X", "column"], ["add_column"]),
        n("Min", ["middle", "plane"], ["min_middle"]),
        n("Less", ["X", "row"], ["less_row"]),
        n("Where", ["less_row", "X", "scalar"], ["where_flat"]),
        n("Greater", ["X", "column"], ["greater_column"]),
        n("Greater", ["column", "one"], ["column_mask"]),
        n("Where", ["column_mask", "X", "row"], ["where_column"]),
        n("Cast", ["greater_column"], ["greater_column_float"], to=F32),
        n("Where", ["flags_row", "X", "scalar"], ["where_flags_row"]),
        n("Where", ["flags_column", "X", "row"], ["where_flags_column"]),
        n("Add", ["Z", "wide_row"], ["z_add_row"]),
        n("Mul", ["Z", "scalar"], ["z_mul_scalar"]),
        n("Sub", ["Z", "z_add_row"], ["z_sub_same"]),
    ]
    outputs = ["add_same", "mul_scalar", "sub_scalar_first", "div_row", "pow_plane",
               "max_leading_ones", "prelu_row", "mod_row", "add_column", "min_middle",
               "where_flat", "where_column", "greater_column_float", "where_flags_row",
               "where_flags_column", "z_add_row",
               "z_mul_scalar", "z_sub_same"]
    graph = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info("X", F32, [3, 5, 7]),
         helper.make_tensor_value_info("Z", F32, [257, 1001])],
        [helper.make_tensor_value_info(o, F32, [257, 1001] if o.startswith("z_") else [3, 5, 7])
         for o in outputs],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out / "elementwise.onnx")
    np.save(out / "elementwise.X.npy", (rng.standard_normal([3, 5, 7]) * 2).astype(np.float32))
    np.save(out / "elementwise.Z.npy", rng.standard_normal([257, 1001]).astype(np.float32))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
