#!/bin/bash
# The real-GPU checklist of docs/cuda.md in one command (docs/benchmarks.md, "CUDA runtime on a
# real GPU"): every fixture and real model in 1 and 2 stages on the GPU against the CPU runtime,
# stage times against the plan, one stage against onnxruntime's CUDA execution provider where
# it is installed, and a plan made on `profile --backend cuda` times.
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
libs=/tmp/cudalibs; mkdir -p $libs
for name in nvrtc cublas cublasLt nvrtc-builtins; do
  f=$(ls /usr/local/cuda/lib64/lib$name.so* /usr/local/cuda/targets/x86_64-linux/lib/lib$name.so* \
        /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/lib$name.so* 2>/dev/null | grep -v alt | head -1)
  echo "lib$name: $f"
  [ -n "$f" ] && ln -sf "$f" $libs/lib$name.so
done
export LD_LIBRARY_PATH=$libs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
echo "== devices"; timeout 120 $P devices
F=fixtures/models; R=fixtures/real/cache
declare -A DIMS=(
 [mlp]="--dim batch=64" [gpt2_tiny]="--dim batch=8 --dim seq=64" [bert_tiny]="--dim batch=8 --dim seq=64"
 [llama_tiny]="--dim batch=8 --dim seq=64" [resnet_tiny]="--dim batch=8"
 [magika_standard_v3_3]="--dim unk__214=16" [ppocr_mobile_v2_cls]="--dim x.0=8 --dim x.2=48 --dim x.3=192"
 [ppocr_v4_det]="--dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=256 --dim p2o.DynamicDimension.2=256"
 [ppocr_v4_rec]="--dim p2o.DynamicDimension.0=4 --dim p2o.DynamicDimension.1=320 --dim x.2=48")
W=/tmp/w; mkdir -p $W
echo "== numerics: cuda vs cpu, 1 and 2 stages"
for m in mlp gpt2_tiny bert_tiny llama_tiny resnet_tiny magika_standard_v3_3 ppocr_mobile_v2_cls ppocr_v4_det ppocr_v4_rec; do
  f=$F/$m.onnx; [ -f $f ] || f=$R/$m.onnx
  for k in 1 2; do
    devs=$(printf 'H200-SXM,%.0s' $(seq $k)); devs=${devs%,}
    timeout 60 $P partition $f --devices $devs --stages $k ${DIMS[$m]} --microbatches 4 --out $W/$m.$k.json >/dev/null 2>$W/err || { echo "$m K=$k partition failed: $(tail -1 $W/err)"; continue; }
    timeout 120 $P run $W/$m.$k.json $f --backend cuda --json --output-dir $W/$m.$k.cuda > $W/$m.$k.cuda.json 2>$W/err || echo "$m K=$k cuda run failed: $(tail -2 $W/err)"
    timeout 120 $P run $W/$m.$k.json $f --backend cpu --json --output-dir $W/$m.$k.cpu > $W/$m.$k.cpu.json 2>$W/err || echo "$m K=$k cpu run failed: $(tail -1 $W/err)"
    python3 $G/compare.py $m $k $W/$m.$k
  done
done
echo "== stage times vs plan, gpt2_tiny, bert_tiny and resnet_tiny, 2 stages, m = 1, 4, 16"
for m in gpt2_tiny bert_tiny resnet_tiny; do for mb in 1 4 16; do
  timeout 60 $P partition $F/$m.onnx --devices H200-SXM,H200-SXM --stages 2 ${DIMS[$m]} --microbatches $mb --out $W/t.json >/dev/null 2>&1
  timeout 120 $P run $W/t.json $F/$m.onnx --backend cuda --json --output-dir $W/t.out > $W/t.run.json 2>/dev/null
  python3 $G/stages.py $m $mb $W/t.run.json
done; done
echo "== one stage vs onnxruntime CUDA EP (same batch, 16 micro-batches)"
for m in gpt2_tiny bert_tiny resnet_tiny ppocr_v4_det; do
  f=$F/$m.onnx; [ -f $f ] || f=$R/$m.onnx
  timeout 60 $P partition $f --devices H200-SXM --stages 1 ${DIMS[$m]} --microbatches 16 --out $W/o.json >/dev/null 2>&1
  timeout 120 $P run $W/o.json $f --backend cuda --json --output-dir $W/o.out > $W/o.run1.json 2>/dev/null
  timeout 120 $P run $W/o.json $f --backend cuda --json --output-dir $W/o.out > $W/o.run.json 2>/dev/null
  timeout 180 python3 $G/ort.py $m $f $W/o.run.json $W/o.out "${DIMS[$m]}"
done
echo "== profile --backend cuda, then plan on it"
timeout 120 $P profile $F/gpt2_tiny.onnx ${DIMS[gpt2_tiny]} --backend cuda --device H200-SXM --out $W/prof.json 2>&1 | tail -2
timeout 60 $P partition $F/gpt2_tiny.onnx --devices H200-SXM,H200-SXM --stages 2 ${DIMS[gpt2_tiny]} --microbatches 8 --profile $W/prof.json --out $W/pp.json 2>&1 | tail -3
timeout 120 $P run $W/pp.json $F/gpt2_tiny.onnx --backend cuda --json --profile $W/prof.json --output-dir $W/pp.out > $W/pp.run.json 2>$W/err || tail -2 $W/err
python3 $G/stages.py gpt2_tiny-profiled 8 $W/pp.run.json
cp $W/*.json "$OUT"/ 2>/dev/null; true
