#!/usr/bin/env bash
# Issue 38 item 7: the K = 8 instances of issue 17's set (benches/exact.rs) through the command
# users type: the 5 committed fixtures and the 5 real models of fixtures/real/cache, each on
# `1x8xH100-SXM` and on four A100-80GB then four L4, in inference and training (40 instances),
# `pipecut partition ... --stages 8 --time-limit 10s`. Prints one line per instance (the
# machine's 1-minute load average, wall and user seconds, the status line) and how many were
# proven optimal. With CHECK=1 each plan is then given to `pipecut check`, which proves its
# claim again from the model, the cluster and the plan (docs/algorithms.md, the statuses), and
# the line ends with what it said and its wall time; the last line counts the claims it proved.
#
#   bash benches/exact_k8.sh                 # release build of the tree, 10 s per instance
#   LIMIT=60s MODELS='llama|ppocr' bash benches/exact_k8.sh
#   CHECK=1 STAGES=4 bash benches/exact_k8.sh
#
# Environment: PIPECUT_BIN (default target/release/pipecut, built if unset), LIMIT (10s),
# MODELS (a regular expression on the model's path), EXTRA (more partition arguments), STAGES
# (8), CHECK (unset: no check).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${PIPECUT_BIN:-target/release/pipecut}"
[[ -n "${PIPECUT_BIN:-}" ]] || cargo build --release -q
declare -A dims=(
  [fixtures/models/mlp.onnx]="--dim batch=2"
  [fixtures/models/gpt2_tiny.onnx]="--dim batch=2 --dim seq=16"
  [fixtures/models/bert_tiny.onnx]="--dim batch=2 --dim seq=16"
  [fixtures/models/resnet_tiny.onnx]="--dim batch=2"
  [fixtures/models/llama_tiny.onnx]="--dim batch=2 --dim seq=16"
  [fixtures/real/cache/magika_standard_v3_3.onnx]="--dim unk__214=2"
  [fixtures/real/cache/paraphrase_minilm_l3_v2.onnx]="--dim batch_size=2 --dim sequence_length=16"
  [fixtures/real/cache/ppocr_mobile_v2_cls.onnx]="--dim x.0=1 --dim x.2=48 --dim x.3=192"
  [fixtures/real/cache/ppocr_v4_det.onnx]="--dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=64 --dim p2o.DynamicDimension.2=256"
  [fixtures/real/cache/ppocr_v4_rec.onnx]="--dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=320 --dim x.2=48"
)
total=0 proven=0 reproven=0
plans=$(mktemp -d)
trap 'rm -rf "$plans"' EXIT
for model in $(printf '%s\n' "${!dims[@]}" | sort); do
  [[ "$model" =~ ${MODELS:-.} ]] || continue
  if [[ ! -f "$model" ]]; then
    echo "skipped: $model is absent (run fixtures/real/fetch.sh)" >&2
    continue
  fi
  for cluster in 1x8xH100-SXM A100-80GB,A100-80GB,A100-80GB,A100-80GB,L4,L4,L4,L4; do
    devices=(--cluster "$cluster")
    [[ $cluster == *,* ]] && devices=(--devices "$cluster")
    for mode in inference training; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      # shellcheck disable=SC2086 # the dims and EXTRA are lists of arguments
      out=$({ /usr/bin/time -f "%e s wall, %U s user" "$bin" partition "$model" ${dims[$model]} \
        "${devices[@]}" --stages "${STAGES:-8}" --mode "$mode" --time-limit "${LIMIT:-10s}" \
        --out "$plans/plan.json" ${EXTRA:-}; } 2>&1) || true
      status=$(sed -n 's/^bottleneck [^:]*: //p' <<<"$out" | head -1)
      [[ -n "$status" ]] || status=$(grep -m1 '^error' <<<"$out" || echo "no status")
      total=$((total + 1))
      [[ "$status" == "proven optimal" ]] && proven=$((proven + 1))
      checked=""
      if [[ -n "${CHECK:-}" && "$status" == "proven optimal" ]]; then
        said=$({ /usr/bin/time -f "%e s wall" "$bin" check "$plans/plan.json" "$model"; } 2>&1) &&
          ! grep -q '^note:' <<<"$said" && reproven=$((reproven + 1))
        verdict="proven again"
        grep -q '^note:' <<<"$said" && verdict="not proven again (note)"
        grep -q '^error' <<<"$said" && verdict=$(grep -m1 '^error' <<<"$said")
        checked=" | check: $verdict, $(grep -E ' s wall' <<<"$said" | tail -1)"
      fi
      echo "$(basename "$model" .onnx) | ${cluster:0:12} | $mode | load $load | $(grep -E ' s wall' <<<"$out" | tail -1) | $status$checked"
    done
  done
done
echo "proven optimal: $proven / $total"
[[ -z "${CHECK:-}" ]] || echo "claims proven again by check: $reproven / $proven"
