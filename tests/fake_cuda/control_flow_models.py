"""Writes the control-flow model tests/cuda.rs runs on the CUDA backend (the venv's onnx and
numpy, seeded): `decoder.onnx`, its input `decoder.X.npy`, and onnxruntime's outputs on it in
`decoder.reference/`. The model is what an exported `torch.jit.script` decoder carries, built by
hand (torch is not in the venv):

- an `If` on a condition computed from the input (`ReduceSum(X) > 0`), whose branches read the
  enclosing graph's tensors (a device activation and a weight) and a weight of their own;
- a `Loop` with a trip count and a condition the body recomputes, a float state and an int64
  counter carried, a scan output, the iteration number used as a float, its own weight and
  an outer weight and activation read from the body, and an `If` on the iteration number
  nested in the body, whose branches read the body's tensors and weight and the graph's;
- a `Scan` over the sequence axis (axis 1) of an activation, one input forwards and one
  backwards, the Loop's final state as its initial state, a scan output on axis 1.

Every output keeps the batch on axis 0, so micro-batches concatenate. The input's two halves
have sums of opposite signs: two micro-batches take the two branches of the If.

And `truncating_loop.onnx` (input `truncating_loop.X.npy`): a Loop of `TRIPS` steps whose body
truncates its state through int32 and back (`Cast`), which the device does not do: a host
fallback inside a body, for the test to count.

Usage: .venv/bin/python tests/fake_cuda/control_flow_models.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BATCH, SEQ, DIM, TRIPS = 6, 5, 7, 4
F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def value(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def if_node(rng):
    """`If(ReduceSum(X) > 0)`: then `Relu(H) · w_then`, else `Tanh(H) + bias` (outer reads)."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["H"], ["relu"]),
         helper.make_node("Mul", ["relu", "w_then"], ["then_out"])],
        "then_branch", [], [value("then_out", F32)],
        [const("w_then", rng.standard_normal(DIM).astype(np.float32))],
    )
    otherwise = helper.make_graph(
        [helper.make_node("Tanh", ["H"], ["tanh"]),
         helper.make_node("Add", ["tanh", "bias"], ["else_out"])],
        "else_branch", [], [value("else_out", F32)],
    )
    return [
        helper.make_node("ReduceSum", ["X"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["Y_if"],
                         then_branch=then, else_branch=otherwise),
    ]


def late_step():
    """`If(i > 1)` inside the Loop body: then `s_next + context` (a tensor of the body and one of
    the graph around the Loop), else `2 · s_next` (the body's own weight). The condition is an
    integer one, computed on the host, as `if i > 1:` in a scripted loop."""
    then = helper.make_graph(
        [helper.make_node("Add", ["s_next", "context"], ["late_out"])],
        "late_branch", [], [value("late_out", F32)],
    )
    otherwise = helper.make_graph(
        [helper.make_node("Mul", ["s_next", "two"], ["early_out"])],
        "early_branch", [], [value("early_out", F32)],
    )
    return [
        helper.make_node("Greater", ["i", "one"], ["late"]),
        helper.make_node("If", ["late"], ["stepped"], then_branch=then, else_branch=otherwise),
    ]


def loop_node(rng):
    """`TRIPS` steps of `s ← tanh(s · W_loop + bias + 0.1 · i + context)` while `max |s| < 100`,
    counting steps in an int64 carried beside it, stacking `2 · s` (the first two steps) or
    `s + context` (the others) per step."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_float"], to=F32),
            helper.make_node("Mul", ["i_float", "tenth"], ["drift"]),
            helper.make_node("MatMul", ["s", "W_loop"], ["sw"]),
            helper.make_node("Add", ["sw", "bias"], ["u"]),
            helper.make_node("Add", ["u", "drift"], ["v"]),
            helper.make_node("Add", ["v", "context"], ["w"]),
            helper.make_node("Tanh", ["w"], ["s_next"]),
            helper.make_node("Abs", ["s_next"], ["magnitude"]),
            helper.make_node("ReduceMax", ["magnitude"], ["largest"], keepdims=0),
            helper.make_node("Less", ["largest", "hundred"], ["cond_next"]),
            helper.make_node("Add", ["count", "one"], ["count_next"]),
        ] + late_step(),
        "loop_body",
        [value("i", I64, []), value("cond", BOOL, []), value("s", F32),
         value("count", I64, [1])],
        [value("cond_next", BOOL, []), value("s_next", F32),
         value("count_next", I64, [1]), value("stepped", F32)],
        [
            const("W_loop", (rng.standard_normal([DIM, DIM]) * 0.4).astype(np.float32)),
            const("tenth", np.float32(0.1)),
            const("hundred", np.float32(100.0)),
            const("two", np.float32(2.0)),
            const("one", np.array([1], np.int64)),
        ],
    )
    return [
        helper.make_node("ReduceMean", ["H"], ["context"], axes=[1], keepdims=0),
        helper.make_node("Loop", ["trips", "go", "context", "count0"],
                         ["S_loop", "count_final", "steps"], body=body),
        helper.make_node("Transpose", ["steps"], ["Y_steps"], perm=[1, 0, 2]),
    ]


def scan_node(rng):
    """An RNN over the sequence axis of H, reading it forwards and backwards."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_t", "W_x"], ["a"]),
            helper.make_node("MatMul", ["h", "W_h"], ["b"]),
            helper.make_node("MatMul", ["r_t", "W_r"], ["c"]),
            helper.make_node("Sum", ["a", "b", "c"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_next"]),
            helper.make_node("Sigmoid", ["h_next"], ["y_t"]),
        ],
        "scan_body",
        [value("h", F32), value("x_t", F32), value("r_t", F32)],
        [value("h_next", F32), value("y_t", F32)],
        [const(n, (rng.standard_normal([DIM, DIM]) * 0.4).astype(np.float32))
         for n in ["W_x", "W_h", "W_r"]],
    )
    return [
        helper.make_node("Scan", ["S_loop", "H", "H"], ["H_final", "Y_scan"], body=body,
                         num_scan_inputs=2, scan_input_axes=[1, 1],
                         scan_input_directions=[0, 1], scan_output_axes=[1]),
    ]


def truncating_loop(out):
    """`TRIPS` steps of `s ← float(int32(3 · s)) + 0.5`, stacking `s`."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["s", "three"], ["scaled"]),
            helper.make_node("Cast", ["scaled"], ["truncated"], to=TensorProto.INT32),
            helper.make_node("Cast", ["truncated"], ["back"], to=F32),
            helper.make_node("Add", ["back", "half"], ["s_next"]),
            helper.make_node("Identity", ["cond"], ["cond_next"]),
            helper.make_node("Identity", ["s_next"], ["s_scan"]),
        ],
        "truncating_body",
        [value("i", I64, []), value("cond", BOOL, []), value("s", F32)],
        [value("cond_next", BOOL, []), value("s_next", F32), value("s_scan", F32)],
        [const("three", np.float32(3.0)), const("half", np.float32(0.5))],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "X"], ["S", "steps"], body=body),
         helper.make_node("Transpose", ["steps"], ["Y"], perm=[1, 0, 2])],
        "truncating_loop", [value("X", F32, ["batch", DIM])],
        [value("S", F32, ["batch", DIM]), value("Y", F32, ["batch", TRIPS, DIM])],
        [const("trips", np.int64(TRIPS))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out / "truncating_loop.onnx")
    x = np.random.default_rng(7).standard_normal([BATCH, DIM]).astype(np.float32)
    np.save(out / "truncating_loop.X.npy", x)


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    truncating_loop(out)
    rng = np.random.default_rng(19)
    nodes = [
        helper.make_node("MatMul", ["X", "W_in"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["H"]),
    ]
    nodes += if_node(rng) + loop_node(rng) + scan_node(rng)
    initializers = [
        const("W_in", (rng.standard_normal([DIM, DIM]) * 0.5).astype(np.float32)),
        const("bias", (rng.standard_normal(DIM) * 0.1).astype(np.float32)),
        const("zero", np.float32(0.0)),
        const("trips", np.int64(TRIPS)),
        const("go", np.bool_(True)),
        const("count0", np.array([0], np.int64)),
    ]
    graph = helper.make_graph(
        nodes, "decoder", [value("X", F32, ["batch", SEQ, DIM])],
        [value("Y_if", F32, ["batch", SEQ, DIM]), value("S_loop", F32, ["batch", DIM]),
         value("Y_steps", F32, ["batch", TRIPS, DIM]), value("H_final", F32, ["batch", DIM]),
         value("Y_scan", F32, ["batch", SEQ, DIM])],
        initializers,
        # The Loop's trip count is a constant: an exporter's shape inference states the
        # stacked steps' length.
        value_info=[value("steps", F32, [TRIPS, "batch", DIM])],
    )
    # IR version 10: the venv's onnxruntime reads up to 11, its onnx writes 12.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out / "decoder.onnx")
    x = rng.standard_normal([BATCH, SEQ, DIM]).astype(np.float32)
    x[: BATCH // 2] += 1.0
    x[BATCH // 2:] -= 1.0
    np.save(out / "decoder.X.npy", x)
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(out / "decoder.onnx"), providers=["CPUExecutionProvider"]
    )
    reference = out / "decoder.reference"
    reference.mkdir(exist_ok=True)
    names = [o.name for o in session.get_outputs()]
    for name, result in zip(names, session.run(None, {"X": x})):
        np.save(reference / f"{name}.npy", result)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
