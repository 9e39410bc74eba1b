#!/usr/bin/env bash
# Multi-process runs against the plan's prediction (issue 22): for each model, profile its nodes
# on this machine (one thread: each rank gets one core), plan K = 2 on the measured times, run
# the plan as 2 ranks (TCP, or MPI with `--mpi` and a `--features mpi` build), and print each
# rank's busy and transfer time per micro-batch beside the plan's prediction for its stage.
#
#   bash benches/distributed.sh [--mpi] [MICROBATCHES] > distributed.md   (docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
transport=tcp
if [[ "${1:-}" == "--mpi" ]]; then
  transport=mpi
  shift
fi
microbatches="${1:-32}"
bin="${PIPECUT_BIN:-target/release/pipecut}"
if [[ -z "${PIPECUT_BIN:-}" ]]; then
  if [[ "$transport" == mpi ]]; then cargo build --release -q --features mpi; else cargo build --release -q; fi
fi
# One core per rank, as the plan assumes: matrix products on the rank's own thread.
export MATMUL_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

models=(
  "fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=64"
  "fixtures/models/bert_tiny.onnx --dim batch=8 --dim seq=64"
  "fixtures/models/resnet_tiny.onnx --dim batch=8"
  "fixtures/real/cache/paraphrase_minilm_l3_v2.onnx --dim batch_size=8 --dim sequence_length=64"
  "fixtures/real/cache/ppocr_v4_rec.onnx --dim p2o.DynamicDimension.0=4 --dim p2o.DynamicDimension.1=320 --dim x.2=48"
)
echo "| model | transport | rank (stage) | busy ms / micro-batch | CPU ms / micro-batch | predicted | CPU / predicted | transfer ms / micro-batch | predicted | bubble |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for entry in "${models[@]}"; do
  read -r -a args <<<"$entry"
  model="${args[0]}"
  if [[ ! -f "$model" ]]; then
    echo "skipped $model: absent (run fixtures/real/fetch.sh)" >&2
    continue
  fi
  name=$(basename "$model" .onnx)
  "$bin" profile "${args[@]}" --threads 1 --out "$out/$name.times.json" >&2
  "$bin" partition "${args[@]}" --devices cpu,cpu --profile "$out/$name.times.json" \
    --out "$out/$name.plan.json" >&2
  run=(run "$out/$name.plan.json" "$model" --profile "$out/$name.times.json"
       --microbatches "$microbatches" --distributed --json --output-dir "$out/$name.out")
  if [[ "$transport" == mpi ]]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun --oversubscribe -np 2 "$bin" "${run[@]}" --transport mpi >"$out/$name.ranks"
  else
    port=$((29000 + RANDOM % 1000))
    for rank in 0 1; do
      RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$bin" "${run[@]}" --transport tcp >"$out/$name.rank$rank" &
    done
    wait
    cat "$out/$name".rank? >"$out/$name.ranks"
  fi
  python3 - "$name" "$out/$name.ranks" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for line in sorted(open(path), key=lambda l: json.loads(l)["rank"]):
    r = json.loads(line)
    n = max(r["microbatches_done"], 1)
    busy, cpu, transfer = (r[k] / n * 1e3 for k in ("busy_secs", "cpu_secs", "transfer_secs"))
    pb, pt = r["predicted_busy_secs_per_microbatch"] * 1e3, r["predicted_transfer_secs_per_microbatch"] * 1e3
    bubble = 1 - r["busy_secs"] / r["wall_secs"] if r["wall_secs"] else 0
    print(f"| {name} | {r['transport']} | {r['rank']} ({r['stage']}) | {busy:.3f} | {cpu:.3f} | {pb:.3f} | "
          f"{cpu / pb:.2f}× | {transfer:.3f} | {pt:.3f} | {bubble * 100:.0f}% |")
PY
done
