# Compares two runs' outputs tensor by tensor, in the order all_outputs.py listed them.
import sys, json, numpy as np
order_path, a_json, b_json = sys.argv[1:4]
a_files = json.load(open(a_json))["outputs"]; b_files = json.load(open(b_json))["outputs"]
rows = []
for line in open(order_path):
    name, op, node = line.rstrip("\n").split("\t")
    if name not in a_files or name not in b_files:
        continue
    a = np.load(a_files[name]).astype(np.float64); b = np.load(b_files[name]).astype(np.float64)
    if a.shape != b.shape or a.size == 0:
        print(f"{op} {node}: shapes {a.shape} {b.shape}"); continue
    d = float(np.max(np.abs(a - b))); s = float(np.max(np.abs(a))) or 1.0
    rows.append((op, node, d, s))
print(f"{len(rows)} tensors compared; the first 12 with a relative difference over 1e-5:")
for op, node, d, s in [r for r in rows if r[2] / r[3] > 1e-5][:12]:
    print(f"  {op:<18} {node[:56]:<56} max|Δ| {d:.3g} scale {s:.3g} rel {d/s:.2g}")
