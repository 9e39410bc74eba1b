"""Writes the small models of tests/cuda.rs's edge cases (the venv's onnx): ops at the edges of
what the CUDA backend's device code takes, each with the dims it is run at.

Usage: .venv/bin/python tests/fake_cuda/edge_models.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def save(out, name, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=OPSET)
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    f32 = TensorProto.FLOAT
    # Concat along axis 0 of a [2, 3] input and a [2, 4] one whose shape comes from data (a
    # Reshape by an input), so only the run sees that the trailing dims differ: the device must
    # refuse it rather than write the longer rows past the output.
    save(
        out,
        "concat_trailing",
        [
            helper.make_node("Relu", ["a"], ["ra"]),
            helper.make_node("Reshape", ["flat", "shape"], ["b"]),
            helper.make_node("Relu", ["b"], ["rb"]),
            helper.make_node("Concat", ["ra", "rb"], ["y"], axis=0),
        ],
        [
            helper.make_tensor_value_info("a", f32, [2, 3]),
            helper.make_tensor_value_info("flat", f32, [8]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", f32, ["rows", "cols"])],
    )
    np.save(out / "concat_trailing.a.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(out / "concat_trailing.flat.npy", np.arange(8, dtype=np.float32))
    np.save(out / "concat_trailing.shape.npy", np.array([2, 4], np.int64))
    # Expand to rank 9, one more than the device kernels carry: the CPU kernel takes it.
    target = numpy_helper.from_array(np.array([2, 1, 1, 1, 1, 1, 1, 2, 3], np.int64), "target")
    save(
        out,
        "expand_rank9",
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Expand", ["r", "target"], ["e"]),
            helper.make_node("Relu", ["e"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", f32, ["batch", 3])],
        [helper.make_tensor_value_info("y", f32, [f"d{i}" for i in range(9)])],
        [target],
    )
    # Expand to a shape read at run time, which may hold a negative entry.
    save(
        out,
        "expand_runtime_shape",
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Expand", ["r", "shape"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("x", f32, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", f32, ["rows", "cols"])],
    )
    np.save(out / "expand_runtime_shape.x.npy", np.ones((2, 3), np.float32))
    np.save(out / "expand_runtime_shape.shape.npy", np.array([-2, 3], np.int64))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
