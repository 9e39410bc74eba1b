#!/bin/bash
# On a real GPU: magika on one input of real bytes (pipecut CPU, pipecut CUDA, onnxruntime CPU),
# then every float tensor of the model compared between the CPU and the GPU run, node by node;
# and the steady-state time per micro-batch (the slope between 16 and 64 micro-batches, which
# leaves out the fixed cost of a run: module load, cuBLAS handles, uploads).
#
#   PIPECUT_BIN=target/release/pipecut OUT=/tmp/gpu bash benches/gpu/steady_state.sh
set +e
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/pipecut-gpu}; mkdir -p "$OUT"
exec > >(tee "$OUT/log2.txt") 2>&1
P=$(realpath "${PIPECUT_BIN:-target/release/pipecut}")
source benches/gpu/env.sh
W=/tmp/w; mkdir -p $W
M=fixtures/real/cache/magika_standard_v3_3.onnx
echo "== magika: pipecut cpu, pipecut cuda, onnxruntime cpu on one input; then node by node"
python3 -c "import numpy as np; np.save('$W/in.npy', np.random.default_rng(0).integers(0,257,(16,2048)).astype(np.int32))"
$P partition $M --devices $DEV --stages 1 --dim unk__214=16 --microbatches 1 --out $W/m.json >/dev/null 2>&1
for b in cpu cuda; do $P run $W/m.json $M --backend $b --input bytes=$W/in.npy --json --output-dir $W/m_$b > $W/m_$b.json 2>$W/err || tail -2 $W/err; done
NVIDIA_TF32_OVERRIDE=0 $P run $W/m.json $M --backend cuda --input bytes=$W/in.npy --json --output-dir $W/m_notf32 > $W/m_notf32.json 2>/dev/null
python3 - <<PY
import numpy as np, onnxruntime as o
x=np.load('$W/in.npy'); r=o.InferenceSession('$M').run(None,{'bytes':x})[0]
for b in ['cpu','cuda','notf32']:
    p=np.load('$W/m_'+b+'/target_label.npy'); print(f'magika pipecut {b} vs onnxruntime cpu: max|Δ| {abs(p-r).max():.3g}')
PY
python3 benches/gpu/all_outputs.py $M $W/all.onnx
$P partition $W/all.onnx --devices $DEV --stages 1 --dim unk__214=16 --microbatches 1 --out $W/a.json >/dev/null 2>$W/err || tail -2 $W/err
for b in cpu cuda; do $P run $W/a.json $W/all.onnx --backend $b --input bytes=$W/in.npy --json --output-dir $W/a_$b > $W/a_$b.json 2>$W/err || tail -2 $W/err; done
python3 benches/gpu/bisect.py $W/all.onnx.order $W/a_cpu.json $W/a_cuda.json
echo "== the same on pipecut's seeded inputs (values 0..rows of the smallest table: near-constant rows)"
for b in cpu cuda; do $P run $W/a.json $W/all.onnx --backend $b --microbatches 4 --json --output-dir $W/s_$b > $W/s_$b.json 2>$W/err || tail -2 $W/err; done
python3 benches/gpu/bisect.py $W/all.onnx.order $W/s_cpu.json $W/s_cuda.json
echo "== steady state: wall at 16 and 64 micro-batches, slope per micro-batch; host ops"
for m in gpt2_tiny bert_tiny resnet_tiny ppocr_v4_det ppocr_v4_rec; do
  f=fixtures/models/$m.onnx; [ -f $f ] || f=fixtures/real/cache/$m.onnx
  for k in 1 2; do
    devs=$(printf "$DEV,%.0s" $(seq $k)); devs=${devs%,}
    $P partition $f --devices $devs --stages $k ${DIMS[$m]} --microbatches 16 --out $W/s.json >/dev/null 2>&1
    for mb in 16 64; do timeout 120 $P run $W/s.json $f --backend cuda --microbatches $mb --json --output-dir $W/s.out > $W/s.$mb.json 2>/dev/null; done
    python3 - $m $k $W/s.16.json $W/s.64.json <<'PY'
import json, sys
m, k, a, b = sys.argv[1:5]
ra, rb = json.load(open(a)), json.load(open(b))
slope = (rb["wall_secs"] - ra["wall_secs"]) / 48
hosts = {}
for s in rb["stages"]:
    for op, n in (s.get("host_ops") or {}).items(): hosts[op] = hosts.get(op, 0) + n
busy = [s["busy_secs"] for s in rb["stages"]]; pred = [s["predicted_secs"] for s in rb["stages"]]
print(f"{m} K={k}: wall 16 mb {ra['wall_secs']*1e3:.1f} ms, 64 mb {rb['wall_secs']*1e3:.1f} ms -> {slope*1e3:.3f} ms per micro-batch (fixed {(ra['wall_secs']-16*slope)*1e3:.1f} ms); plan {max(pred)*1e3:.3f} ms per micro-batch; host ops {hosts}")
PY
  done
done
cp $W/*.json "$OUT"/ 2>/dev/null; true
