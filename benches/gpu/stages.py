# A CUDA run's per-stage busy time per micro-batch against the plan's prediction, and its
# pipeline efficiency against the predicted one.
import json, sys
m, mb, path = sys.argv[1], sys.argv[2], sys.argv[3]
try: r = json.load(open(path))
except Exception as e: print(f"{m} m={mb}: no report ({e})"); sys.exit()
n = r["microbatches"]
parts = [f"stage {s['stage']}: busy {s['busy_secs']/n*1e3:.3f} ms/mb vs plan {s['predicted_secs']*1e3:.3f}" for s in r["stages"]]
print(f"{m} m={n}: wall {r['wall_secs']*1e3:.2f} ms; efficiency measured {r['measured_efficiency']:.3f} predicted {r['predicted_efficiency']:.3f}; " + "; ".join(parts))
