"""pipecut's CPU runtime against onnxruntime, one thread each, side by side (issue 15 item 4).

For each model: `pipecut profile --threads 1` (median whole-model time over the repeats) and an
onnxruntime session with one intra-op and one inter-op thread (median over the same number of
runs), interleaved model by model so that both see the same machine load. Inputs: floats
uniform in [0, 1), integers zero (a valid index for every table).

    .venv/bin/python benches/cpu_speed.py [--tract [TRACT_COMPARE]] \
        [PIPECUT_BINARY[,BEFORE_BINARY] [MODEL_NAME_PART ...]] > speed.md

With a second binary (comma-separated), each model also runs on it, in the same interleaving,
for a before/after table measured under the same load.

With `--tract`, each model also runs through tract-onnx (`benches/tract_compare`, its own cargo
project: `cd benches/tract_compare && cargo build --release`; the binary defaults to its
target/release/tract_compare): on the same inputs as onnxruntime, 3 warm-up runs and the median
of the same number of runs, one thread, interleaved between pipecut and onnxruntime. Its outputs
are compared with onnxruntime's; the table gives the largest absolute difference over every
output element (`tract max |Δ|`) and the largest onnxruntime output it compares with
(`ort max |y|`: some outputs are small, ppocr_v4_det's probability map is about 1e-5 on noise).

`CLOCK=cpu` times processor time instead of wall time, for a machine that other work keeps
busy (a run that waits for a core then costs nothing): onnxruntime's runs by the process's CPU
clock, pipecut's as the difference of two `profile` processes' CPU time, one with enough
measured runs for about a second of work and one with a single run, divided by the difference
in runs (loading and warm-up cancel).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACT_DEFAULT = os.path.join(ROOT, "benches/tract_compare/target/release/tract_compare")
REPEATS = 15
CPU_CLOCK = os.environ.get("CLOCK", "wall") == "cpu"
MODELS = [
    ("fixtures/models/mlp.onnx", {"batch": 64}),
    ("fixtures/models/gpt2_tiny.onnx", {"batch": 8, "seq": 64}),
    ("fixtures/models/bert_tiny.onnx", {"batch": 8, "seq": 64}),
    ("fixtures/models/llama_tiny.onnx", {"batch": 8, "seq": 64}),
    ("fixtures/models/resnet_tiny.onnx", {"batch": 8}),
    ("fixtures/real/cache/magika_standard_v3_3.onnx", {"unk__214": 16}),
    ("fixtures/real/cache/paraphrase_minilm_l3_v2.onnx", {"batch_size": 8, "sequence_length": 64}),
    ("fixtures/real/cache/ppocr_mobile_v2_cls.onnx", {"x.0": 8, "x.2": 48, "x.3": 192}),
    ("fixtures/real/cache/ppocr_v4_det.onnx",
     {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 256, "p2o.DynamicDimension.2": 256}),
    ("fixtures/real/cache/ppocr_v4_rec.onnx",
     {"p2o.DynamicDimension.0": 4, "p2o.DynamicDimension.1": 320, "x.2": 48}),
]
TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
         "tensor(bool)": np.bool_, "tensor(float16)": np.float16}


def signal_models(folder):
    """LSTM and GRU layers (sequence 50, batch 8, 64 features in, 128 hidden), an STFT of a
    16,000-sample signal in 512-point Hann frames every 160 samples, and a DFT of 100 frames of
    512 samples: the model files, each with no dim to bind."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def save(name, nodes, inputs, outputs, initializers, opset=17):
        graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=8)
        path = os.path.join(folder, f"{name}.onnx")
        onnx.save(model, path)
        return path

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    floats = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    paths = []
    for op, gates in (("LSTM", 4), ("GRU", 3)):
        paths.append(save(
            f"{op.lower()}_h128",
            [helper.make_node(op, ["x", "w", "r", "b"], ["y"], hidden_size=128)],
            [floats("x", [50, 8, 64])], [floats("y", [50, 1, 8, 128])],
            [weight("w", [1, gates * 128, 64]), weight("r", [1, gates * 128, 128]),
             weight("b", [1, 2 * gates * 128])]))
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(512) / 512)).astype(np.float32)
    paths.append(save(
        "stft_512",
        [helper.make_node("STFT", ["x", "step", "window"], ["y"], onesided=1)],
        [floats("x", [1, 16000, 1])], [floats("y", [1, 97, 257, 2])],
        [numpy_helper.from_array(np.array(160, np.int64), "step"),
         numpy_helper.from_array(window, "window")]))
    paths.append(save(
        "dft_512",
        [helper.make_node("DFT", ["x"], ["y"], axis=2, onesided=1)],
        [floats("x", [1, 100, 512, 1])], [floats("y", [1, 100, 257, 2])], []))
    return paths


def pipecut_secs(path, dims, binary):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        args = [binary, "profile", path, "--threads", "1", "--repeats", str(REPEATS), "--out", out]
        for name, value in dims.items():
            args += ["--dim", f"{name}={value}"]
        subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
        with open(out) as f:
            return json.load(f)["measured_with"]["total_secs"]


def children_cpu_secs():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pipecut_cpu_secs(path, dims, binary):
    """CPU seconds per run: (many runs − one run) / (runs − 1), each a whole `profile` process."""
    wall = pipecut_secs(path, dims, binary)
    runs = int(min(2000, max(REPEATS, 1.0 / max(wall, 1e-6))))
    spent = []
    for repeats in (runs, 1):
        with tempfile.TemporaryDirectory() as tmp:
            args = [binary, "profile", path, "--threads", "1", "--repeats", str(repeats),
                    "--out", os.path.join(tmp, "times.json")]
            for name, value in dims.items():
                args += ["--dim", f"{name}={value}"]
            before = children_cpu_secs()
            subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
            spent.append(children_cpu_secs() - before)
    return (spent[0] - spent[1]) / (runs - 1)


def onnxruntime_run(path, dims):
    """onnxruntime's median time, and the inputs it ran on and the outputs it gave."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(os.path.join(ROOT, path), options,
                                   providers=["CPUExecutionProvider"])
    feed = {}
    for i in session.get_inputs():
        # onnxruntime calls an unnamed dim None or '?'; pipecut names it `<input>.<axis>`.
        shape = [d if isinstance(d, int) else
                 dims.get(d if d not in (None, "?") else f"{i.name}.{axis}", 1)
                 for axis, d in enumerate(i.shape)]
        dtype = TYPES[i.type]
        feed[i.name] = (np.random.rand(*shape).astype(dtype) if dtype in (np.float32, np.float16)
                        else np.zeros(shape, dtype))
    for _ in range(3):
        session.run(None, feed)
    clock = time.process_time if CPU_CLOCK else time.perf_counter
    times = []
    for _ in range(REPEATS):
        start = clock()
        session.run(None, feed)
        times.append(clock() - start)
    secs = float(np.median(times))
    if CPU_CLOCK:
        # process_time ticks coarsely on some systems: time a batch of runs too.
        batch = max(1, int(0.5 / max(secs, 1e-6)))
        start = clock()
        for _ in range(batch):
            session.run(None, feed)
        secs = (clock() - start) / batch
    return secs, feed, session.run(None, feed)


def tract_run(path, feed, tract=TRACT_DEFAULT):
    """tract's median time on `feed`, and the outputs it gave (None where it fails, with the
    reason on stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [tract, "bench", os.path.join(ROOT, path), "--repeats", str(REPEATS), "--out", tmp]
        for name, value in feed.items():
            file = os.path.join(tmp, f"input_{len(args)}.npy")
            np.save(file, value)
            args.append(f"{name}={file}")
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"tract failed on {path}: {done.stderr.strip()}", file=sys.stderr)
            return None, None
        report = json.loads(done.stdout)
        outputs = [np.load(os.path.join(tmp, f"output_{i}.npy")) for i in range(report["outputs"])]
        return report["median_secs"], outputs


def largest_difference(got, want):
    """The largest |got − want| over every element of every output (NaN where tract failed,
    infinity where a shape differs), and the largest |want|."""
    if got is None or len(got) != len(want):
        return float("nan"), float("nan")
    worst = scale = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return float("inf"), float("nan")
        if w.size:
            w = w.astype(np.float64)
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))))
            scale = max(scale, float(np.max(np.abs(w))))
    return worst, scale


def main():
    args = sys.argv[1:]
    tract = None
    if args and args[0] == "--tract":
        args.pop(0)
        tract = TRACT_DEFAULT
        if args and os.path.basename(args[0]).startswith("tract_compare"):
            tract = os.path.abspath(args.pop(0))
    binaries = (args[0] if args else os.path.join(ROOT, "target/release/pipecut")).split(",")
    if tract is not None:
        print("| model | pipecut ms | tract ms | onnxruntime ms | pipecut / onnxruntime "
              "| tract / onnxruntime | tract max abs Δ | ort max abs y |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    elif len(binaries) == 1:
        print("| model | pipecut ms | onnxruntime ms | pipecut speed / onnxruntime |")
        print("| --- | ---: | ---: | ---: |")
    else:
        print("| model | before ms | pipecut ms | onnxruntime ms | before / onnxruntime "
              "| pipecut / onnxruntime |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
    only = args[1:]
    generated = tempfile.TemporaryDirectory()
    models = MODELS + [(path, {}) for path in signal_models(generated.name)]
    for path, dims in models:
        if only and not any(o in path for o in only):
            continue
        if not os.path.exists(os.path.join(ROOT, path)):
            print(f"skipped {path}: absent (run fixtures/real/fetch.sh)", file=sys.stderr)
            continue
        timer = pipecut_cpu_secs if CPU_CLOCK else pipecut_secs
        ours = [timer(path, dims, binary) for binary in binaries]
        theirs, feed, reference = onnxruntime_run(path, dims)
        name = os.path.basename(path)[:-5]
        if tract is not None:
            secs, outputs = tract_run(path, feed, tract)
            cells = ((f"{secs * 1e3:.2f}", f"{theirs / secs:.2f}×") if secs is not None
                     else ("fails", "–"))
            worst, scale = largest_difference(outputs, reference)
            print(f"| {name} | {ours[0] * 1e3:.2f} | {cells[0]} | {theirs * 1e3:.2f} "
                  f"| {theirs / ours[0]:.2f}× | {cells[1]} | {worst:.1e} | {scale:.1e} |", flush=True)
        elif len(binaries) == 1:
            print(f"| {name} | {ours[0] * 1e3:.2f} | {theirs * 1e3:.2f} | {theirs / ours[0]:.2f}× |",
                  flush=True)
        else:
            now, before = ours[0], ours[1]
            print(f"| {name} | {before * 1e3:.2f} | {now * 1e3:.2f} | {theirs * 1e3:.2f} "
                  f"| {theirs / before:.2f}× | {theirs / now:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
