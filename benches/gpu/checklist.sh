#!/bin/bash
# The real-GPU checklist of docs/cuda.md in one command (docs/benchmarks.md, "CUDA runtime on a
# real GPU"): every fixture and real model in 1 and 2 stages on the GPU against the CPU runtime,
# stage times against the plan, one stage against onnxruntime's CUDA execution provider where
# it is installed (benches/gpu/vs_ort.py), a tensor-parallel plan's ranks sharing the GPU, the
# CUDA test binary where CUDA_TEST_BIN names it, and a plan made on `profile --backend cuda` times.
#
#   PIPECUT_BIN=target/release/pipecut OUT=/tmp/gpu bash benches/gpu/checklist.sh
#
# The binary must be built with `--features cuda`. NVRTC and cuBLAS are found in the CUDA
# toolkit or in a Python venv's nvidia wheels (linked as lib*.so under /tmp/cudalibs, the names
# cudarc looks for). Every report lands in $OUT.
set +e
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/pipecut-gpu}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
P=$(realpath "${PIPECUT_BIN:-target/release/pipecut}")
G=benches/gpu
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
source $G/env.sh
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
echo "== devices"; timeout 120 $P devices
F=fixtures/models; R=fixtures/real/cache
W=/tmp/w; mkdir -p $W
echo "== one stage vs onnxruntime's CUDA EP, steady state (benches/gpu/vs_ort.py)"
for m in gpt2_tiny bert_tiny llama_tiny mlp resnet_tiny magika_standard_v3_3 ppocr_mobile_v2_cls ppocr_v4_det ppocr_v4_rec; do
  f=$F/$m.onnx; [ -f $f ] || f=$R/$m.onnx
  timeout 240 python3 $G/vs_ort.py $m $f $P $DEV $W "${DIMS[$m]}"
done
if [ -n "$CUDA_TEST_BIN" ]; then
  echo "== the CUDA test binary on the real GPU"
  timeout 300 $CUDA_TEST_BIN --test-threads 1 2>&1 | grep -E "^test |test result|skip|panicked|Need" | head -60
fi
echo "== a tensor-parallel plan (t = 2, K = 2) on the GPU against the CPU runtime"
timeout 60 $P plan-cluster $F/gpt2_tiny.onnx --cluster 1x4x$DEV --dim seq=16 --global-batch 8 --microbatch-sizes 4 --tp 2 --pp 2 --dp 1 --out $W/tp.json >/dev/null 2>$W/err || tail -2 $W/err
for b in cuda cpu; do timeout 120 $P run $W/tp.json $F/gpt2_tiny.onnx --backend $b --microbatches 2 --json --output-dir $W/tp.$b > $W/tp.$b.json 2>$W/err || tail -2 $W/err; done
python3 $G/compare.py gpt2_tiny-tp2 2 $W/tp
echo "== numerics: cuda vs cpu, 1 and 2 stages"
for m in mlp gpt2_tiny bert_tiny llama_tiny resnet_tiny magika_standard_v3_3 ppocr_mobile_v2_cls ppocr_v4_det ppocr_v4_rec; do
  f=$F/$m.onnx; [ -f $f ] || f=$R/$m.onnx
  for k in 1 2; do
    devs=$(printf "$DEV,%.0s" $(seq $k)); devs=${devs%,}
    timeout 60 $P partition $f --devices $devs --stages $k ${DIMS[$m]} --microbatches 4 --out $W/$m.$k.json >/dev/null 2>$W/err || { echo "$m K=$k partition failed: $(tail -1 $W/err)"; continue; }
    timeout 120 $P run $W/$m.$k.json $f --backend cuda --json --output-dir $W/$m.$k.cuda > $W/$m.$k.cuda.json 2>$W/err || echo "$m K=$k cuda run failed: $(tail -2 $W/err)"
    timeout 120 $P run $W/$m.$k.json $f --backend cpu --json --output-dir $W/$m.$k.cpu > $W/$m.$k.cpu.json 2>$W/err || echo "$m K=$k cpu run failed: $(tail -1 $W/err)"
    python3 $G/compare.py $m $k $W/$m.$k
  done
done
echo "== stage times vs plan, gpt2_tiny, bert_tiny and resnet_tiny, 2 stages, m = 1, 4, 16"
for m in gpt2_tiny bert_tiny resnet_tiny; do for mb in 1 4 16; do
  timeout 60 $P partition $F/$m.onnx --devices $DEV,$DEV --stages 2 ${DIMS[$m]} --microbatches $mb --out $W/t.json >/dev/null 2>&1
  timeout 120 $P run $W/t.json $F/$m.onnx --backend cuda --json --output-dir $W/t.out > $W/t.run.json 2>/dev/null
  python3 $G/stages.py $m $mb $W/t.run.json
done; done
echo "== profile --backend cuda, then plan on it"
for m in bert_tiny resnet_tiny ppocr_v4_det; do
  f=$F/$m.onnx; [ -f $f ] || f=$R/$m.onnx
  timeout 120 $P profile $f ${DIMS[$m]} --backend cuda --device $DEV --out $W/prof.$m.json 2>&1 | tail -1
done
timeout 120 $P profile $F/gpt2_tiny.onnx ${DIMS[gpt2_tiny]} --backend cuda --device $DEV --out $W/prof.json 2>&1 | tail -2
timeout 60 $P partition $F/gpt2_tiny.onnx --devices $DEV,$DEV --stages 2 ${DIMS[gpt2_tiny]} --microbatches 8 --profile $W/prof.json --out $W/pp.json 2>&1 | tail -3
timeout 120 $P run $W/pp.json $F/gpt2_tiny.onnx --backend cuda --json --profile $W/prof.json --output-dir $W/pp.out > $W/pp.run.json 2>$W/err || tail -2 $W/err
python3 $G/stages.py gpt2_tiny-profiled 8 $W/pp.run.json
cp $W/*.json "$OUT"/ 2>/dev/null; true
