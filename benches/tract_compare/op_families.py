"""One op at a time: pipecut, tract and onnxruntime on single-node models of the op families
the whole-model table (docs/benchmarks.md, "Own kernels or tract") is made of, to see which
family each runtime is fast at. Same method as benches/cpu_speed.py --tract (its functions):
one thread, 3 warm-up runs, the median of 15, onnxruntime's inputs for tract, interleaved.

    .venv/bin/python benches/tract_compare/op_families.py [PIPECUT_BINARY] > families.md
"""
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cpu_speed  # noqa: E402

RNG = np.random.default_rng(0)


def weight(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.1).astype(np.float32), name)


def conv(cin, cout, size, hw, group=1):
    """A same-padded, stride-1 convolution on a 1 × cin × hw × hw image."""
    pad = size // 2
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[size, size],
                            pads=[pad] * 4, group=group)
    return ([node], [("x", [1, cin, hw, hw])],
            [weight("w", cout, cin // group, size, size), weight("b", cout)])


def conv_hardswish(cin, cout, size, hw):
    """The convolution followed by the element-wise chain PaddleOCR exports for HardSwish,
    y · clip(y + 3, 0, 6) / 6, as five nodes: what a runtime that fuses saves over one that
    does not."""
    nodes, inputs, initializers = conv(cin, cout, size, hw)
    nodes[0].output[0] = "c"
    nodes += [
        helper.make_node("Add", ["c", "three"], ["c3"]),
        helper.make_node("Clip", ["c3", "zero", "six"], ["clipped"]),
        helper.make_node("Div", ["clipped", "six"], ["scaled"]),
        helper.make_node("Mul", ["c", "scaled"], ["y"]),
    ]
    initializers += [numpy_helper.from_array(np.array(v, np.float32), n)
                     for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
    return nodes, inputs, initializers


def resize_nearest(channels, hw, **attributes):
    """Nearest-neighbour 2× upsampling, as ppocr_v4_det's FPN does."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", **attributes)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    return [node], [("x", [1, channels, hw, hw])], [scales]


def unary(op, shape, **attributes):
    return [helper.make_node(op, ["x"], ["y"], **attributes)], [("x", shape)], []


# name, (nodes, inputs, initializers); shapes as in gpt2_tiny/bert_tiny (8 × 64 tokens) and
# the OCR and ResNet models' convolutions.
FAMILIES = [
    ("Conv 3×3, 32→32 ch, 64×64", conv(32, 32, 3, 64)),
    ("Conv 3×3, 64→64 ch, 16×16 (resnet_tiny)", conv(64, 64, 3, 16)),
    ("Conv 1×1, 64→128 ch, 32×32", conv(64, 128, 1, 32)),
    ("Conv 3×3, 32→32 ch, 64×64 + HardSwish as 4 nodes", conv_hardswish(32, 32, 3, 64)),
    ("Conv 3×3 depthwise, 96 ch, 64×64", conv(96, 96, 3, 64, group=96)),
    ("MatMul 512×256 · 256×1024", ([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                   [("x", [8, 64, 256])], [weight("w", 256, 1024)])),
    ("MatMul batched 32×(64×32 · 32×64)", ([helper.make_node("MatMul", ["x", "k"], ["y"])],
                                           [("x", [8, 4, 64, 32]), ("k", [8, 4, 32, 64])], [])),
    ("Add broadcast 8×64×256 + 256", ([helper.make_node("Add", ["x", "b"], ["y"])],
                                      [("x", [8, 64, 256])], [weight("b", 256)])),
    ("Softmax 8×4×64×64", unary("Softmax", [8, 4, 64, 64], axis=-1)),
    ("LayerNormalization 8×64×256", ([helper.make_node(
        "LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
        [("x", [8, 64, 256])], [weight("g", 256), weight("b", 256)])),
    ("Erf 8×64×1024", unary("Erf", [8, 64, 1024])),
    ("Resize nearest 2×, 96 ch, 64×64, asymmetric + floor (ppocr_v4_det's)", resize_nearest(
        96, 64, coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    ("Resize nearest 2×, 96 ch, 64×64, default attributes", resize_nearest(96, 64)),
    ("MaxPool 3×3 stride 2, 64 ch, 64×64", unary(
        "MaxPool", [1, 64, 64, 64], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
]


def save(directory, index, family):
    nodes, inputs, initializers = family
    graph = helper.make_graph(
        nodes, f"family{index}",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model)
    path = os.path.join(directory, f"family{index}.onnx")
    onnx.save(model, path)
    return path


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(cpu_speed.ROOT,
                                                                "target/release/pipecut")
    print("| op | pipecut ms | tract ms | onnxruntime ms | pipecut / ort | tract / ort "
          "| tract / pipecut |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, family) in enumerate(FAMILIES):
            path = save(tmp, index, family)
            ours = cpu_speed.pipecut_secs(path, {}, binary)
            theirs, feed, reference = cpu_speed.onnxruntime_run(path, {})
            tract, outputs = cpu_speed.tract_run(path, feed)
            worst, scale = cpu_speed.largest_difference(outputs, reference)
            if tract is None or not worst <= 1e-4 * max(scale, 1.0):
                print(f"{name}: tract's output differs from onnxruntime's by {worst}",
                      file=sys.stderr)
            print(f"| {name} | {ours * 1e3:.3f} | {tract * 1e3:.3f} | {theirs * 1e3:.3f} "
                  f"| {theirs / ours:.2f}× | {theirs / tract:.2f}× | {ours / tract:.2f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
