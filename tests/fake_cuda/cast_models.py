"""Writes the model of tests/cuda.rs's cast test (the venv's onnx) and its input: a float32
tensor cast to float16, bfloat16, float8 E4M3FN (saturating), float8 E5M2 (not saturating) and
float4 E2M1 and back, with a mask made, negated and chosen by on the way. The input holds the
values where rounding to a narrow format is delicate: halfway points (ties to even), subnormals,
the edge of each range, infinities, NaN and negative zero.

Usage: .venv/bin/python tests/fake_cuda/cast_models.py OUT_DIR
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper


def cast(x, to, name, saturate=None):
    attrs = {"to": to}
    if saturate is not None:
        attrs["saturate"] = saturate
    return [
        helper.make_node("Cast", [x], [name + "_narrow"], **attrs),
        helper.make_node("Cast", [name + "_narrow"], [name], to=TensorProto.FLOAT),
    ]


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    f32 = TensorProto.FLOAT
    nodes = []
    outputs = []
    for name, to, saturate in [
        ("f16", TensorProto.FLOAT16, None),
        ("bf16", TensorProto.BFLOAT16, None),
        ("e4m3", TensorProto.FLOAT8E4M3FN, 1),
        ("e5m2", TensorProto.FLOAT8E5M2, 0),
        ("e2m1", TensorProto.FLOAT4E2M1, None),
    ]:
        nodes += cast("x", to, name, saturate)
        outputs.append(name)
    # A mask made on the device (IsNaN, Less, Not, Or), chosen by (Where) and cast to float.
    nodes += [
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("Less", ["x", "zero"], ["negative"]),
        helper.make_node("Not", ["negative"], ["not_negative"]),
        helper.make_node("Or", ["nan", "not_negative"], ["keep"]),
        helper.make_node("Where", ["keep", "x", "f16"], ["chosen"]),
        helper.make_node("Cast", ["keep"], ["keep_float"], to=f32),
    ]
    outputs += ["chosen", "keep_float"]
    zero = helper.make_tensor("zero", f32, [], [0.0])
    graph = helper.make_graph(
        nodes,
        "casts",
        [helper.make_tensor_value_info("x", f32, ["n"])],
        [helper.make_tensor_value_info(o, f32, ["n"]) for o in outputs],
        [zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model)
    onnx.save(model, out / "casts.onnx")

    f16 = np.finfo(np.float16)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, 1e5, 3.4e38,
               f16.tiny, f16.tiny / 2, f16.tiny / 1024, f16.tiny / 2048, f16.tiny / 4096,
               448.0, 464.0, 480.0, 57344.0, 61440.0, 6.0, 7.0, 0.25, 0.75, 1.0 + 2.0**-11,
               1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 2.0**-130, 2.0**-149]
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(200) * np.exp(rng.uniform(-20, 20, 200))
    values = np.array(special + [-v for v in special] + list(spread), dtype=np.float32)
    np.save(out / "x.npy", values)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
