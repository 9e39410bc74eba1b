"""Runs a model on onnxruntime's CPU provider (graph optimisations off, one thread, as
fixtures/reference_outputs.py does) and writes each output as OUT_DIR/<output name>.npy in the
model's own type (float16 for a half-precision model). Each input is first cast to the type the
model declares for it and written as OUT_DIR/inputs/<input name>.npy, for pipecut to read the
same values.

Usage: .venv/bin/python tests/fake_cuda/ort_outputs.py MODEL OUT_DIR NAME=FILE.npy...
"""

import os
import sys

import numpy as np
import onnxruntime as ort


def main(model, out_dir, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}
    os.makedirs(os.path.join(out_dir, "inputs"), exist_ok=True)
    inputs = {}
    for feed in feeds:
        name, path = feed.split("=", 1)
        value = np.load(path)
        if types[name] == "tensor(float16)":
            value = value.astype(np.float16)
        inputs[name] = value
        np.save(os.path.join(out_dir, "inputs", f"{name}.npy"), value)
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names, session.run(names, inputs)):
        np.save(os.path.join(out_dir, f"{name}.npy"), value)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
