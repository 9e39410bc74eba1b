#!/bin/bash
# On a real GPU: where a CUDA run's time per micro-batch goes on the host
# (`PIPECUT_CUDA_HOST_TIMES=1`, crates/runtime/src/cuda/host_times.rs): one stage, 256 micro-batches (the first one's start-up spread over them),
# each node's host time without waiting for the device and the final downloads' waits.
#
#   PIPECUT_BIN=target/release/pipecut bash benches/gpu/host_times.sh [MODEL ...]
set +e
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
P=$(realpath "${PIPECUT_BIN:-target/release/pipecut}")
source benches/gpu/env.sh > /dev/null
W=$(mktemp -d)
for m in ${@:-gpt2_tiny bert_tiny magika_standard_v3_3 resnet_tiny ppocr_v4_det}; do
  f=fixtures/models/$m.onnx; [ -f $f ] || f=fixtures/real/cache/$m.onnx
  $P partition $f --devices $DEV --stages 1 ${DIMS[$m]} --microbatches 1 --out $W/p.json >/dev/null 2>&1
  $P run $W/p.json $f --backend cuda --microbatches 8 --output-dir $W/o >/dev/null 2>&1
  # Each of the run-time switches off, then everything on (SWITCHES: runs separated by spaces,
  # the variables of one run by commas).
  for switches in ${SWITCHES:-PIPECUT_CUBLAS_WORKSPACE=0 PIPECUT_CUDA_PINNED=off PIPECUT_CUDA_FLAT=off ALL_ON=1}; do
    echo "== $m ($switches)"
    env ${switches//,/ } PIPECUT_CUDA_HOST_TIMES=${HOST_TIMES:-1} $P run $W/p.json $f --backend cuda --microbatches 256 --output-dir $W/o 2>&1 >/dev/null | head -${LINES_PER_RUN:-16}
  done
done
