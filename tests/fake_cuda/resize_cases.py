"""Rewrites the ONNX backend node cases of Resize and Upsample (written by fixtures/conformance.py)
with their scales, sizes and roi as initializers, so that a plan can be made for them (the
originals pass them as graph inputs, unknown at plan time), for tests/cuda.rs.

Usage: .venv/bin/python tests/fake_cuda/resize_cases.py CASES_DIR OUT_DIR
Writes OUT_DIR/NAME/{model.onnx, x.npy, expected.npy} and OUT_DIR/cases.json.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def main(cases_dir, out):
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((cases_dir / "cases.json").read_text())
    written = []
    for case in manifest["cases"]:
        name = case["name"]
        if not name.startswith(("test_resize_", "test_upsample_")):
            continue
        files = [i.get("file") for i in case["inputs"]]
        outputs = [o.get("file") for o in case["outputs"]]
        if None in files or len(outputs) != 1 or outputs[0] is None:
            continue
        source = cases_dir / "cases" / name
        x = np.load(source / files[0])
        if x.dtype != np.float32:
            continue
        model = onnx.load(source / "model.onnx")
        graph = model.graph
        for spec, file in zip(list(graph.input)[1:], files[1:]):
            value = np.load(source / file)
            graph.initializer.append(numpy_helper.from_array(value, spec.name))
            graph.input.remove(spec)
        target = out / name
        target.mkdir(exist_ok=True)
        onnx.save(model, target / "model.onnx")
        shutil.copy(source / files[0], target / "x.npy")
        shutil.copy(source / outputs[0], target / "expected.npy")
        written.append(
            {
                "name": name,
                "input": graph.input[0].name,
                "output": graph.output[0].name,
                "atol": case.get("atol"),
                "rtol": case.get("rtol"),
            }
        )
    (out / "cases.json").write_text(json.dumps({"cases": written}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
