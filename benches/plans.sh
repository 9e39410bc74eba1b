#!/usr/bin/env bash
# Real execution of the optimiser's plan against every faithful baseline (issue 16): for each
# bundled fixture and each real model in fixtures/real/cache, profile the nodes on this machine
# (one thread, as each stage gets one core), plan K = 2 on the measured times, and run every
# plan on the CPU runtime, one pinned core per stage, in paired rounds.
#
#   bash benches/plans.sh [ROUNDS] > plans.md      (docs/benchmarks.md, "Plans on real execution")
#
# SELECT=N (default 10) gives the optimiser `--select-by-running N`: its optimum, nearest rivals and
# the peers' own plans predicted within 10% run first and a rival measured clearly faster (a sign
# test over the rounds, a runoff for a near tie) replaces it (docs/cost-model.md); SELECT=0
# benchmarks the cost model's optimum alone. mlp streams 256 micro-batches a run instead of 16:
# its 0.3 ms micro-batches made 5 ms runs, where a scheduler tick is a tenth of a round.
#
# "others" is how many cores other processes kept busy meanwhile ("busy" past a quarter of a
# core): publish only runs on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds="${1:-6}"
select="${SELECT:-10}"
bin="${PIPECUT_BIN:-target/release/pipecut}"
[[ -n "${PIPECUT_BIN:-}" ]] || cargo build --release -q
# PLANS_OUT=DIR keeps each model's profile and bench JSON (the selection's candidates among them).
if [[ -n "${PLANS_OUT:-}" ]]; then
  out="$PLANS_OUT"
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

# model path, then its dims (one micro-batch)
models=(
  "fixtures/models/mlp.onnx --dim batch=512 --microbatches 256"
  "fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=64"
  "fixtures/models/bert_tiny.onnx --dim batch=8 --dim seq=64"
  "fixtures/models/llama_tiny.onnx --dim batch=8 --dim seq=64"
  "fixtures/models/resnet_tiny.onnx --dim batch=8"
  "fixtures/real/cache/magika_standard_v3_3.onnx --dim unk__214=16"
  "fixtures/real/cache/paraphrase_minilm_l3_v2.onnx --dim batch_size=8 --dim sequence_length=64"
  "fixtures/real/cache/ppocr_mobile_v2_cls.onnx --dim x.0=8 --dim x.2=48 --dim x.3=192"
  "fixtures/real/cache/ppocr_v4_det.onnx --dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=256 --dim p2o.DynamicDimension.2=256"
  "fixtures/real/cache/ppocr_v4_rec.onnx --dim p2o.DynamicDimension.0=4 --dim p2o.DynamicDimension.1=320 --dim x.2=48"
)
echo "| model | plan | bottleneck ms | measured | rounds | wall | predicted | measured shares | predicted shares | Δ pts | others |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"
for entry in "${models[@]}"; do
  read -r -a args <<<"$entry"
  model="${args[0]}"
  if [[ ! -f "$model" ]]; then
    echo "skipped $model: absent (run fixtures/real/fetch.sh)" >&2
    continue
  fi
  name=$(basename "$model" .onnx)
  dims=()
  for ((i = 1; i < ${#args[@]}; i += 2)); do
    if [[ "${args[i]}" == --dim ]]; then dims+=("${args[i]}" "${args[i + 1]}"); fi
  done
  selecting=()
  if [[ "$select" != 0 ]]; then selecting=(--select-by-running "$select"); fi
  "$bin" profile "$model" "${dims[@]}" --threads 1 --out "$out/$name.json" >&2
  "$bin" bench-plans "${args[@]}" --profile "$out/$name.json" --rounds "$rounds" "${selecting[@]}" \
    --json >"$out/$name.bench.json"
  python3 - "$name" "$out/$name.bench.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))
for row in report["rows"]:
    pct = lambda v: "/".join(f"{s * 100:.1f}" for s in v)
    gap = max(abs(m - p) for m, p in zip(row["measured_shares"], row["predicted_shares"])) * 100
    lo, hi = row["measured_ratio_range"]
    others = report.get("other_cores")
    others = "?" if others is None else f"{others:.2f}" + (" busy" if report["busy"] else "")
    plan = row["plan"] + (" (= pipecut)" if row.get("same_stages_as_pipecut") else "")
    print(f"| {name} | {plan} | {row['bottleneck_secs'] * 1e3:.3f} | {row['measured_ratio']:.3f}× "
          f"| {lo:.3f}–{hi:.3f} | {row['wall_ratio']:.3f}× | {row['predicted_ratio']:.3f}× "
          f"| {pct(row['measured_shares'])} | {pct(row['predicted_shares'])} | {gap:.1f} | {others} |")
PY
done
