"""Writes two models for the fused-step test of tests/cuda.rs (the venv's onnx and numpy,
seeded), each with its input `X.npy`:

- `fusion_chain.onnx`: a written-out layer norm, an RMS norm and a Gelu in a row on X
  [3, 11, 7] (X's last reader placed among the layer norm's nodes), and `fusion_chain.json`
  naming each pattern's nodes (those it needs) and the kernel it fuses into, so a test can
  tell from a plan which patterns a stage boundary splits;
- `fusion_leaks.onnx`: the same patterns where an intermediate tensor is also read elsewhere
  (a graph output, or another node), which no fusion may swallow, and a Gelu whose bias does
  not fit the fused kernel at run time.

Usage: .venv/bin/python tests/fake_cuda/fusion_models.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
SHAPE = [3, 11, 7]
# Outputs of another shape than X's.
OUTPUT_SHAPES = {"product": [3, 11, 5], "biased": [3, 11, 5]}


def constants(rng):
    def value(name, v):
        return numpy_helper.from_array(np.array(v, np.float32), name)

    return [
        value("two", 2.0), value("eps", 1e-5), value("sqrt2", 1.4142135), value("one", 1.0),
        value("half", 0.5),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "gamma2"),
        numpy_helper.from_array(rng.standard_normal([7, 5]).astype(np.float32), "weight"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(1).astype(np.float32), "bias1"),
    ]


def layer_norm(n, x, p):
    return [
        n("ReduceMean", [x, "last"], [f"{p}_mean"], name=f"{p}_mean"),
        n("Sub", [x, f"{p}_mean"], [f"{p}_centred"], name=f"{p}_sub"),
        n("Pow", [f"{p}_centred", "two"], [f"{p}_sq"], name=f"{p}_pow"),
        n("ReduceMean", [f"{p}_sq", "last"], [f"{p}_var"], name=f"{p}_var"),
        n("Add", [f"{p}_var", "eps"], [f"{p}_vareps"], name=f"{p}_add"),
        n("Sqrt", [f"{p}_vareps"], [f"{p}_root"], name=f"{p}_sqrt"),
        n("Div", [f"{p}_centred", f"{p}_root"], [f"{p}_norm"], name=f"{p}_div"),
        n("Mul", [f"{p}_norm", "gamma"], [f"{p}_scaled"], name=f"{p}_mul"),
        n("Add", [f"{p}_scaled", "beta"], [f"{p}_out"], name=f"{p}_shift"),
    ]


def rms_norm(n, x, p):
    return [
        n("Pow", [x, "two"], [f"{p}_sq"], name=f"{p}_pow"),
        n("ReduceMean", [f"{p}_sq", "last"], [f"{p}_ms"], name=f"{p}_mean"),
        n("Add", [f"{p}_ms", "eps"], [f"{p}_mseps"], name=f"{p}_add"),
        n("Sqrt", [f"{p}_mseps"], [f"{p}_root"], name=f"{p}_sqrt"),
        n("Reciprocal", [f"{p}_root"], [f"{p}_inv"], name=f"{p}_reciprocal"),
        n("Mul", [x, f"{p}_inv"], [f"{p}_norm"], name=f"{p}_mul"),
        n("Mul", ["gamma2", f"{p}_norm"], [f"{p}_out"], name=f"{p}_scale"),
    ]


def gelu(n, x, p):
    return [
        n("Div", [x, "sqrt2"], [f"{p}_div"], name=f"{p}_div"),
        n("Erf", [f"{p}_div"], [f"{p}_erf"], name=f"{p}_erf"),
        n("Add", [f"{p}_erf", "one"], [f"{p}_add"], name=f"{p}_add"),
        n("Mul", [x, f"{p}_add"], [f"{p}_mul"], name=f"{p}_mul"),
        n("Mul", [f"{p}_mul", "half"], [f"{p}_out"], name=f"{p}_half"),
    ]


def save(out, name, nodes, outputs, initializers):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("X", F32, SHAPE)],
        [helper.make_tensor_value_info(o, F32, OUTPUT_SHAPES.get(o, SHAPE)) for o in outputs],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(19)
    initializers = constants(rng)
    n = helper.make_node
    ln, rms, ge = layer_norm(n, "X", "ln"), rms_norm(n, "ln_out", "rms"), gelu(n, "rms_out", "ge")
    # X's last reader sits among the layer norm's nodes, after the last one that reads X: the
    # fused step, at the norm's end, still needs X then.
    last_reader = n("Mul", ["X", "half"], ["x_half"], name="x_half")
    chain = ln[:3] + [last_reader] + ln[3:] + rms + ge
    save(out, "fusion_chain", chain, ["ge_out", "x_half"], initializers)
    # The nodes a fusion needs (a layer norm's Add β is folded in only when it is there).
    patterns = {
        "norm_rows_f32": [[x.name for x in ln[:-1]], [x.name for x in rms]],
        "fused_gelu_f32": [[x.name for x in ge]],
    }
    (out / "fusion_chain.json").write_text(json.dumps(patterns))
    # The layer norm's root, the RMS norm's normalised rows, the Gelu's Erf and a MatMul's
    # product before its bias Add are read besides: as outputs, and by an extra node.
    ln, rms, ge = layer_norm(n, "X", "ln"), rms_norm(n, "ln_out", "rms"), gelu(n, "rms_out", "ge")
    extra = n("Mul", ["ge_erf", "half"], ["erf_half"], name="erf_half")
    matmul = [n("MatMul", ["X", "weight"], ["product"]), n("Add", ["product", "bias"], ["biased"])]
    # A Gelu whose bias Add is fused at plan time but whose one-element bias is no row of X at
    # run time: the fused step runs its nodes one by one.
    broadcast = [n("Add", ["X", "bias1"], ["g2_in"])] + gelu(n, "g2_in", "g2")
    save(out, "fusion_leaks", ln + rms + ge + [extra] + matmul + broadcast,
         ["ge_out", "ln_root", "rms_norm", "erf_half", "product", "biased", "g2_out"],
         initializers)
    x = (rng.standard_normal(SHAPE) * 2 + 0.5).astype(np.float32)
    np.save(out / "X.npy", x)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
