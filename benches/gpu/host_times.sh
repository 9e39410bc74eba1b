#!/bin/bash
# On a real GPU: where a CUDA run's time per micro-batch goes on the host
# (`PIPECUT_CUDA_HOST_TIMES=1`, src/runtime/cuda/host_times.rs): one stage, 256 micro-batches (the first one's start-up spread over them),
# each node's host time without waiting for the device and the final downloads' waits.
#
#   PIPECUT_BIN=target/release/pipecut bash benches/gpu/host_times.sh [MODEL ...]
set +e
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
P=$(realpath "${PIPECUT_BIN:-target/release/pipecut}")
libs=/tmp/cudalibs; mkdir -p $libs
for name in nvrtc cublas cublasLt; do
  f=$(ls /usr/local/cuda/lib64/lib$name.so* /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/lib$name.so* 2>/dev/null | grep -v alt | head -1)
  [ -n "$f" ] && ln -sf "$f" $libs/lib$name.so
done
export LD_LIBRARY_PATH=$libs:$LD_LIBRARY_PATH
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) DEV=H200-SXM ;; *A100*) DEV=A100-80GB ;; *) DEV=H100-SXM ;;
esac
declare -A DIMS=(
 [mlp]="--dim batch=64" [gpt2_tiny]="--dim batch=8 --dim seq=64" [bert_tiny]="--dim batch=8 --dim seq=64"
 [llama_tiny]="--dim batch=8 --dim seq=64" [resnet_tiny]="--dim batch=8"
 [magika_standard_v3_3]="--dim unk__214=16" [ppocr_mobile_v2_cls]="--dim x.0=8 --dim x.2=48 --dim x.3=192"
 [ppocr_v4_det]="--dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=256 --dim p2o.DynamicDimension.2=256"
 [ppocr_v4_rec]="--dim p2o.DynamicDimension.0=4 --dim p2o.DynamicDimension.1=320 --dim x.2=48")
W=$(mktemp -d)
for m in ${@:-gpt2_tiny bert_tiny magika_standard_v3_3 resnet_tiny ppocr_v4_det}; do
  f=fixtures/models/$m.onnx; [ -f $f ] || f=fixtures/real/cache/$m.onnx
  $P partition $f --devices $DEV --stages 1 ${DIMS[$m]} --microbatches 1 --out $W/p.json >/dev/null 2>&1
  $P run $W/p.json $f --backend cuda --microbatches 8 --output-dir $W/o >/dev/null 2>&1
  # Each of the run-time switches off, then everything on.
  for switches in ${SWITCHES:-PIPECUT_CUBLAS_WORKSPACE=0 PIPECUT_CUDA_PINNED=off PIPECUT_CUDA_FLAT=off ALL_ON=1}; do
    echo "== $m ($switches)"
    env $switches PIPECUT_CUDA_HOST_TIMES=${HOST_TIMES:-1} $P run $W/p.json $f --backend cuda --microbatches 256 --output-dir $W/o 2>&1 >/dev/null | head -${LINES_PER_RUN:-16}
  done
done
