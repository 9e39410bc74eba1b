# Step 4 of docs/cuda.md's checklist: one stage of pipecut's CUDA runtime against onnxruntime's
# CUDA execution provider on the same model and batch.
#
#   python3 vs_ort.py NAME MODEL.onnx PIPECUT DEVICE WORKDIR "--dim a=1 --dim b=2"
#
# Both sides are timed in their steady state, alternating ROUNDS times (3): pipecut as the
# slope of whole-run wall time between 16 and 64 micro-batches (a run's fixed start-up — module load, cuBLAS handles, uploads — is
# left out, as onnxruntime's session creation is), onnxruntime as the median time of
# `session.run` over 64 calls (inputs from the host, outputs back to it, as pipecut's
# micro-batches do). onnxruntime is timed with its default graph optimisations (its fusions) and
# with them off, and pipecut with its own folds and fusions (PIPECUT_CUDA_FOLD, PIPECUT_CUDA_FUSE)
# on and off. Numerics: pipecut's GPU outputs on onnxruntime's inputs against onnxruntime's GPU
# outputs.
import json, os, subprocess, sys, time
import numpy as np
import onnxruntime as ort

name, model, pipecut, device, work, dims = sys.argv[1:7]
os.makedirs(work, exist_ok=True)
dim_args = dims.split()
bind = dict(d.split("=", 1) for d in dim_args if d != "--dim")


def sh(*args, env=None):
    return subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})


def session(level, tf32=True):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    # onnxruntime multiplies and convolves in TF32 by default; pipecut in full fp32.
    cuda = ("CUDAExecutionProvider", {} if tf32 else {"use_tf32": "0"})
    s = ort.InferenceSession(model, opts, providers=[cuda])
    if s.get_providers()[0] != "CUDAExecutionProvider":
        sys.exit(f"{name}: onnxruntime fell back to {s.get_providers()}")
    return s


full = session(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
rng = np.random.default_rng(0)
feeds = {}
for i in full.get_inputs():
    # A dim onnxruntime shows unnamed ('?' or None) is bound as pipecut names it: input.axis.
    shape = [d if isinstance(d, int) else int(bind[d] if d in bind else bind[f"{i.name}.{axis}"])
             for axis, d in enumerate(i.shape)]
    t = types.get(i.type, np.float32)
    feeds[i.name] = (rng.standard_normal(shape) if t == np.float32 else rng.integers(0, 2, shape)).astype(t)
    np.save(f"{work}/{name}.in.{i.name}.npy", feeds[i.name])
reference = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds)))


def ort_ms(s):
    for _ in range(10):
        s.run(None, feeds)
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(64):
            s.run(None, feeds)
        reps.append((time.perf_counter() - t0) / 64)
    return sorted(reps)[2] * 1e3


plan = f"{work}/{name}.vs_ort.json"
r = sh(pipecut, "partition", model, "--devices", device, "--stages", "1", *dim_args,
       "--microbatches", "1", "--out", plan)
if r.returncode:
    sys.exit(f"{name}: partition failed: {r.stderr.strip()[-300:]}")
inputs = [a for i in feeds for a in ("--input", f"{i}={work}/{name}.in.{i}.npy")]
out_dir = f"{work}/{name}.vs_ort.out"
r = sh(pipecut, "run", plan, model, "--backend", "cuda", *inputs, "--output-dir", out_dir, "--json")
if r.returncode:
    sys.exit(f"{name}: pipecut run failed: {r.stderr.strip()[-300:]}")
written = json.loads(r.stdout)["outputs"]
worst = max(float(np.max(np.abs(np.load(written[k]).astype(np.float64) - v)))
            for k, v in reference.items() if np.issubdtype(v.dtype, np.floating) and v.size)


def wall(mb, env=None):
    runs = []
    for _ in range(2):
        r = sh(pipecut, "run", plan, model, "--backend", "cuda", "--microbatches", str(mb),
               "--output-dir", f"{work}/{name}.ss.out", "--json", env=env)
        if r.returncode:
            sys.exit(f"{name}: pipecut run at {mb} micro-batches failed: {r.stderr.strip()[-300:]}")
        runs.append(json.loads(r.stdout)["wall_secs"])
    return min(runs)


def slope(env=None):
    return (wall(64, env) - wall(16, env)) / 48 * 1e3


# The lent machines are noisy (the same run varies by a third between calls): pipecut and
# onnxruntime alternate ROUNDS times, and the median of each round's ratio is the figure.
rounds = [(slope(), ort_ms(full)) for _ in range(int(os.environ.get("ROUNDS", "3")))]
ratios = sorted(theirs / ours for ours, theirs in rounds)
ours = sorted(r[0] for r in rounds)[len(rounds) // 2]
fused = sorted(r[1] for r in rounds)[len(rounds) // 2]
unfused = slope({"PIPECUT_CUDA_FOLD": "off", "PIPECUT_CUDA_FUSE": "off"})
plain = ort_ms(session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
exact = ort_ms(session(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tf32=False))
# onnxruntime's own per-node times (its profiler) for reading beside `pipecut profile`'s.
opts = ort.SessionOptions()
opts.enable_profiling = True
opts.profile_file_prefix = f"{work}/{name}.ort_profile"
profiled = ort.InferenceSession(model, opts, providers=["CUDAExecutionProvider"])
for _ in range(20):
    profiled.run(None, feeds)
profiled.end_profiling()
print(f"{name}: pipecut {ours:.3f} ms per micro-batch; onnxruntime CUDA EP {fused:.3f} ms "
      f"(fusions off: {plain:.3f} ms); pipecut at {ratios[len(ratios) // 2]:.2f}x of "
      f"onnxruntime's speed (rounds: {' '.join(f'{r:.2f}' for r in ratios)}) "
      f"({plain / ours:.2f}x without its fusions; onnxruntime without TF32 {exact:.3f} ms, "
      f"{exact / ours:.2f}x); pipecut without its own folds and fusions "
      f"{unfused:.3f} ms; max |pipecut - onnxruntime| on the GPU {worst:.3g}")
