"""silero-vad's model (a held-out model of issue 36, item 7) through `pipecut profile` against
onnxruntime, one thread each, in processor time (the VM is shared and loaded).

    .venv/bin/python benches/silero_vad_speed.py target/release/pipecut

It downloads silero-vad 6.2.3's wheel from PyPI (pip download, no dependencies) into a temporary
folder and takes `silero_vad.onnx` from it: one If over the sample rate, whose branch holds a
Conv front end, one LSTM step and a Conv head. Input: one 512-sample chunk, batch 1, a zero
state, sample rate 16,000 (given to pipecut as `--value sr`). pipecut's time per run is the
processor time of a `profile` with 2,000 repeats less one with a single repeat, over 1,999:
loading and warm-up cancel. Each trial also checks pipecut's outputs against onnxruntime's.
"""
import glob
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np
import onnxruntime as ort

RUNS = 2000
DIMS = ["--dim", "input.0=1", "--dim", "input.1=512", "--dim", "state.1=1"]


def child_cpu_secs(command):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main():
    pipecut = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="silero-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "silero-vad==6.2.3", "--no-deps",
                        "-q", "-d", tmp], check=True)
        with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as wheel:
            model = wheel.extract("silero_vad/data/silero_vad.onnx", tmp)
        rng = np.random.default_rng(0)
        feed = {"input": (rng.standard_normal((1, 512)) * 0.1).astype(np.float32),
                "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
        for name, value in feed.items():
            np.save(os.path.join(tmp, f"{name}.npy"), value)
        inputs = [f"--input={n}={os.path.join(tmp, n)}.npy" for n in feed]
        profile = [pipecut, "profile", model, "--threads", "1", "--warmup", "3",
                   f"--value=sr={os.path.join(tmp, 'sr.npy')}", *DIMS, *inputs,
                   "--out", os.path.join(tmp, "times.json")]
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options)
        expected = session.run(None, feed)
        check(pipecut, model, tmp, inputs, expected)
        print("| trial | onnxruntime ms | pipecut ms | pipecut / onnxruntime time |")
        print("| --- | ---: | ---: | ---: |")
        for trial in range(3):
            start = time.process_time()
            for _ in range(RUNS):
                session.run(None, feed)
            theirs = (time.process_time() - start) / RUNS * 1e3
            ours = (child_cpu_secs(profile + ["--repeats", str(RUNS)])
                    - child_cpu_secs(profile + ["--repeats", "1"])) / (RUNS - 1) * 1e3
            print(f"| {trial} | {theirs:.3f} | {ours:.3f} | {ours / theirs:.2f}× |")


def check(pipecut, model, tmp, inputs, expected):
    """pipecut's own outputs (partition, then run) against onnxruntime's."""
    plan = os.path.join(tmp, "plan.json")
    subprocess.run([pipecut, "partition", model, "--devices", "CPU-x86-64-AVX2-2C",
                    f"--value=sr={os.path.join(tmp, 'sr.npy')}", *DIMS, "--out", plan],
                   check=True, capture_output=True)
    out = os.path.join(tmp, "out")
    subprocess.run([pipecut, "run", plan, model, *inputs, "--microbatches", "1",
                    "--output-dir", out], check=True, capture_output=True)
    for name, value in zip(["output", "stateN"], expected):
        got = np.load(os.path.join(out, f"{name}.npy"))
        print(f"{name}: largest difference from onnxruntime {np.abs(got - value).max():.2e}")


if __name__ == "__main__":
    main()
