"""Writes the models tests/cuda.rs runs on both backends to compare (the venv's onnx and
numpy, seeded), one `NAME.onnx` and `NAME.X.npy` each, their names in `models.txt`: what the
ONNX node cases leave out of the device ops —

- RNN, GRU and LSTM: both directions and reverse, layout 1, sequence_lens, initial states,
  LSTM's peepholes, clip and input_forget, GRU with and without linear_before_reset, and
  activations with alphas and betas;
- Pad in every mode, with negative pads (crops), axes and a constant value (the node cases give
  pads as inputs, which a plan cannot be made for);
- MeanVarianceNormalization over trailing and inner axes (the node case has the default only);
- 3-D Conv (groups, strides, pads, dilations, SAME padding) and ConvTranspose (groups,
  strides, output padding), with biases. The CPU runtime has no 3-D Conv, so these are
  compared with onnxruntime's outputs, written to `NAME.reference/`.

Usage: .venv/bin/python tests/fake_cuda/differential_models.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 3
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def write(out, name, op, directions, layout, attrs, extras):
    """One `op` node with random weights; `extras` names the optional inputs it gets."""
    rng = np.random.default_rng(len(name))
    gates = GATES[op]

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    initializers = {
        "W": weights(directions, gates * HIDDEN, INPUT),
        "R": weights(directions, gates * HIDDEN, HIDDEN),
    }
    state = [BATCH, directions, HIDDEN] if layout else [directions, BATCH, HIDDEN]
    optional = {
        "B": lambda: weights(directions, 2 * gates * HIDDEN),
        "sequence_lens": lambda: np.array([5, 2, 4][:BATCH], np.int32),
        "initial_h": lambda: weights(*state),
        "initial_c": lambda: weights(*state),
        "P": lambda: weights(directions, 3 * HIDDEN),
    }
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    order = order[: {"RNN": 6, "GRU": 6, "LSTM": 8}[op]]
    for extra in extras:
        initializers[extra] = optional[extra]()
    inputs = [n if n in initializers or n == "X" else "" for n in order]
    while inputs[-1] == "":
        inputs.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, inputs, outputs, hidden_size=HIDDEN, layout=layout, **attrs)
    x_shape = [BATCH, SEQ, INPUT] if layout else [SEQ, BATCH, INPUT]
    y_shape = (
        [BATCH, SEQ, directions, HIDDEN] if layout else [SEQ, directions, BATCH, HIDDEN]
    )
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("X", f32, x_shape)],
        [helper.make_tensor_value_info("Y", f32, y_shape)]
        + [helper.make_tensor_value_info(o, f32, state) for o in outputs[1:]],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", rng.standard_normal(x_shape).astype(np.float32))


def write_pad(out, name, mode, pads, axes=None, value=None):
    """A Pad of a [2, 3, 4, 5] input by constant pads (and axes, value) in `mode`."""
    f32 = TensorProto.FLOAT
    constants = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    inputs = ["X", "pads"]
    if value is not None or axes is not None:
        constants.append(numpy_helper.from_array(np.array(value or 0.0, np.float32), "value"))
        inputs.append("value")
    if axes is not None:
        constants.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    shape = [2, 3, 4, 5]
    padded = list(shape)
    axes_list = axes if axes is not None else list(range(4))
    for k, axis in enumerate(axes_list):
        padded[axis] += pads[k] + pads[k + len(axes_list)]
    graph = helper.make_graph(
        [helper.make_node("Pad", inputs, ["Y"], mode=mode)],
        name,
        [helper.make_tensor_value_info("X", f32, shape)],
        [helper.make_tensor_value_info("Y", f32, padded)],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    rng = np.random.default_rng(len(name))
    np.save(out / f"{name}.X.npy", rng.standard_normal(shape).astype(np.float32))


def write_mvn(out, name, axes):
    """MeanVarianceNormalization of a [2, 3, 4, 5] input over `axes`."""
    f32 = TensorProto.FLOAT
    shape = [2, 3, 4, 5]
    graph = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["X"], ["Y"], axes=axes)],
        name,
        [helper.make_tensor_value_info("X", f32, shape)],
        [helper.make_tensor_value_info("Y", f32, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    rng = np.random.default_rng(len(name))
    np.save(out / f"{name}.X.npy", rng.standard_normal(shape).astype(np.float32) * 3 + 1)


def write_conv3d(out, name, op, weight_shape, attrs):
    """A 3-D `op` of a [2, 4, 5, 6, 7] input with seeded weights and a bias."""
    rng = np.random.default_rng(len(name))
    f32 = TensorProto.FLOAT
    shape = [2, 4, 5, 6, 7]
    weights = rng.standard_normal(weight_shape).astype(np.float32) * 0.3
    groups = attrs.get("group", 1)
    m = weight_shape[0] if op == "Conv" else weight_shape[1] * groups
    bias = rng.standard_normal([m]).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node(op, ["X", "W", "B"], ["Y"], **attrs)],
        name,
        [helper.make_tensor_value_info("X", f32, shape)],
        [helper.make_tensor_value_info("Y", f32, None)],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )
    # IR version 10: the venv's onnxruntime reads up to 11, its onnx writes 12.
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10
    )
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    x = rng.standard_normal(shape).astype(np.float32)
    np.save(out / f"{name}.X.npy", x)
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(out / f"{name}.onnx"), providers=["CPUExecutionProvider"]
    )
    (out / f"{name}.reference").mkdir(exist_ok=True)
    np.save(out / f"{name}.reference" / "Y.npy", session.run(None, {"X": x})[0])


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    write_conv3d(out, "conv3d_groups_strides", "Conv", [6, 2, 3, 2, 3],
                 {"group": 2, "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1],
                  "dilations": [1, 2, 1]})
    write_conv3d(out, "conv3d_same_upper", "Conv", [3, 4, 3, 3, 2],
                 {"auto_pad": "SAME_UPPER", "strides": [2, 2, 1]})
    write_conv3d(out, "conv_transpose3d_groups", "ConvTranspose", [4, 3, 2, 3, 2],
                 {"group": 2, "strides": [2, 1, 3], "output_padding": [1, 0, 2],
                  "pads": [0, 1, 0, 1, 0, 1]})
    write_mvn(out, "mvn_trailing_axes", [2, 3])
    write_mvn(out, "mvn_inner_axis", [1])
    write_pad(out, "pad_constant_crop", "constant", [0, 1, -1, 2, 1, 0, 2, -2], value=1.5)
    write_pad(out, "pad_edge", "edge", [0, 0, 2, 3, 0, 1, 1, 2])
    write_pad(out, "pad_reflect_axes", "reflect", [3, 2, 1, 4], axes=[2, -1])
    write_pad(out, "pad_wrap", "wrap", [1, 0, 5, 7, 0, 2, 3, 6])
    everything = ["B", "sequence_lens", "initial_h", "initial_c", "P"]
    write(out, "lstm_bidirectional", "LSTM", 2, 0,
          {"direction": "bidirectional", "clip": 1.5}, everything)
    write(out, "lstm_reverse_layout1", "LSTM", 1, 1,
          {"direction": "reverse", "input_forget": 1,
           "activations": ["HardSigmoid", "Tanh", "Softsign"],
           "activation_alpha": [0.3], "activation_beta": [0.4]},
          ["B", "sequence_lens", "initial_h"])
    write(out, "gru_bidirectional", "GRU", 2, 0,
          {"direction": "bidirectional"}, ["B", "sequence_lens", "initial_h"])
    write(out, "gru_reverse_linear_before_reset_layout1", "GRU", 1, 1,
          {"direction": "reverse", "linear_before_reset": 1}, ["B", "initial_h"])
    write(out, "rnn_bidirectional_layout1", "RNN", 2, 1,
          {"direction": "bidirectional", "activations": ["Relu", "LeakyRelu"],
           "activation_alpha": [0.1]},
          ["B", "sequence_lens", "initial_h"])
    names = sorted(p.stem for p in out.glob("*.onnx"))
    (out / "models.txt").write_text("\n".join(names) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
