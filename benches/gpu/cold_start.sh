#!/bin/bash
# On a real GPU: where a run's fixed start-up cost goes. `devices` with a cold and a warm kernel
# cache (NVRTC compiling the kernels vs loading the cached CUBIN), then one cold run's per-node
# times (`profile --warmup 0 --repeats 1`: the first use of each library path lands on a node)
# against the warm medians.
#
#   PIPECUT_BIN=target/release/pipecut OUT=/tmp/gpu bash benches/gpu/cold_start.sh
set +e
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/pipecut-gpu}; mkdir -p "$OUT"
exec > >(tee "$OUT/log4.txt") 2>&1
P=$(realpath "${PIPECUT_BIN:-target/release/pipecut}")
source benches/gpu/env.sh
export PIPECUT_KERNEL_CACHE=$(mktemp -d)
echo "== devices, cold kernel cache then warm"; for i in 1 2; do /usr/bin/time -f "%e s wall" $P devices > /dev/null; done
W=/tmp/w; mkdir -p $W
for m in gpt2_tiny resnet_tiny; do
  d="--dim batch=8"; [ $m = gpt2_tiny ] && d="--dim batch=8 --dim seq=64"
  echo "== $m: one cold run's nodes (warmup 0, repeats 1), the 5 slowest, then warm medians"
  $P profile fixtures/models/$m.onnx $d --backend cuda --device $DEV --warmup 0 --repeats 1 --out $W/cold.json 2>&1 | tail -1
  $P profile fixtures/models/$m.onnx $d --backend cuda --device $DEV --out $W/warm.json 2>&1 | tail -1
  python3 - $W/cold.json $W/warm.json <<'PY'
import json, sys
cold = json.load(open(sys.argv[1])); warm = {n["name"]: n for n in json.load(open(sys.argv[2]))["nodes"]}
tot = sum(n["secs"] for n in cold["nodes"]); wtot = sum(n["secs"] for n in warm.values())
print(f"cold run: nodes sum {tot*1e3:.1f} ms; warm median nodes sum {wtot*1e3:.2f} ms")
for n in sorted(cold["nodes"], key=lambda n: -n["secs"])[:5]:
    print(f"  {n['op']:<12} {n['name'][-40:]:<40} cold {n['secs']*1e3:8.2f} ms  warm {warm[n['name']]['secs']*1e3:.3f} ms")
PY
done
