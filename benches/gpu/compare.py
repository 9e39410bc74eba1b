# One model, one stage count: the CUDA run's outputs against the CPU runtime's on the same seeded
# inputs (largest difference and the output's scale), both wall times, and the host fallbacks.
import json, sys, os, numpy as np
m, k, base = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    cuda = json.load(open(base + ".cuda.json")); cpu = json.load(open(base + ".cpu.json"))
except Exception as e:
    print(f"{m} K={k}: no report ({e})"); sys.exit()
worst = 0.0; scale = 0.0
for name, path in cpu["outputs"].items():
    a = np.load(path).astype(np.float64); b = np.load(cuda["outputs"][name]).astype(np.float64)
    if a.shape != b.shape: print(f"{m} K={k}: {name} shape {b.shape} vs cpu {a.shape}"); continue
    if a.size:
        worst = max(worst, float(np.max(np.abs(a - b)))); scale = max(scale, float(np.max(np.abs(a))))
hosts = {}
for s in cuda["stages"]:
    for op, n in (s.get("host_ops") or {}).items(): hosts[op] = hosts.get(op, 0) + n
print(f"{m} K={k}: max |cuda-cpu| {worst:.3g} (output scale {scale:.3g}); cuda wall {cuda['wall_secs']*1e3:.1f} ms, cpu wall {cpu['wall_secs']*1e3:.1f} ms; host ops {hosts}")
