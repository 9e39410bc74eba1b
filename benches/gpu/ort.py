import json, sys, time, numpy as np, onnxruntime as ort
m, f, run_path, out_dir, dims = sys.argv[1:6]
r = json.load(open(run_path))
n = r["microbatches"]
bind = dict(d.split("=") for d in dims.replace("--dim ", "").split())
# Times pipecut's one-stage CUDA run (its report) against onnxruntime's CUDA execution provider
# on the same batch and number of micro-batches; says so and stops where that provider is missing.
if "CUDAExecutionProvider" not in ort.get_available_providers():
    print(f"{m}: onnxruntime {ort.__version__} has no CUDA execution provider here "
          f"({', '.join(ort.get_available_providers())}): no comparison")
    sys.exit()
s = ort.InferenceSession(f, ort.SessionOptions(), providers=["CUDAExecutionProvider"])
feeds = {}
rng = np.random.default_rng(0)
types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
for i in s.get_inputs():
    shape = [int(bind.get(d, 1)) if isinstance(d, str) else d for d in i.shape]
    t = types.get(i.type, np.float32)
    feeds[i.name] = rng.integers(0, 2, shape).astype(t) if t != np.float32 else rng.standard_normal(shape).astype(np.float32)
for _ in range(3): s.run(None, feeds)
times = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(n): s.run(None, feeds)
    times.append(time.perf_counter() - t0)
ort_secs = sorted(times)[2]
ours = r["wall_secs"]
print(f"{m}: {n} micro-batches: pipecut cuda {ours*1e3:.2f} ms, onnxruntime CUDA EP {ort_secs*1e3:.2f} ms -> pipecut at {ort_secs/ours:.2f}x of onnxruntime's speed")
