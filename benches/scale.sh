#!/usr/bin/env bash
# Limits at any size (issue 17, item 4): `pipecut partition` on GPT-3-shaped transformer stacks
# of about 20k, 100k and 1M nodes (fixtures/generate_stack.py; d_model 2048 and seq 128 by
# default, so that a million nodes still fit 64 H100s), 8x8xH100-SXM, K = 64, with
# --time-limit 1s, 2s and 10s. Reports the wall time of the whole command and its overshoot of
# the limit (which covers the whole command), the part spent loading and typing the model
# (printed by pipecut), the peak resident memory (/usr/bin/time -v) and the machine's 1-minute
# load average when the run began (/proc/loadavg: other work on a shared machine).
#
#   bash benches/scale.sh [NODES...] > scale.md      (docs/benchmarks.md, "Limits at any size")
#
# NODES defaults to "20000 100000 1000000"; LIMITS (env) to "1s 2s 10s"; STAGES to 64; WIDTH
# (d_model, 128 per head) to 2048; SEQ to 128. WIDTH=12288 SEQ=2048 is GPT-3's own shape.
# Models are generated once into ${PIPECUT_SCALE_DIR:-target/scale-models}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${PIPECUT_BIN:-target/release/pipecut}"
[[ -n "${PIPECUT_BIN:-}" ]] || cargo build --release -q
python="${PYTHON:-$(bash fixtures/pyenv.sh)}"
models="${PIPECUT_SCALE_DIR:-target/scale-models}"
sizes=("${@:-20000 100000 1000000}")
read -r -a sizes <<<"${sizes[*]}"
read -r -a limits <<<"${LIMITS:-1s 2s 10s}"
stages="${STAGES:-64}"
width="${WIDTH:-2048}"
seq="${SEQ:-128}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

secs() { # 10s, 500ms, 2m -> seconds
  case "$1" in
    *ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *m) awk -v v="${1%m}" 'BEGIN { print v * 60 }' ;;
  esac
}

echo "| nodes | limit | wall s | load + types s | solve s | overshoot | peak RSS MiB | load avg | status |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for nodes in "${sizes[@]}"; do
  model="$models/stack_${nodes}_d$width/model.onnx"
  [[ -f "$model" ]] || "$python" fixtures/generate_stack.py --nodes "$nodes" --width "$width" \
    --heads $((width / 128)) --out "$model" >&2
  count=$("$python" -c "import onnx,sys; print(len(onnx.load('$model', load_external_data=False).graph.node))")
  for limit in "${limits[@]}"; do
    busy=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -v -o "$out/time" "$bin" partition "$model" --dim batch=1 --dim seq="$seq" \
      --cluster 8x8xH100-SXM --stages "$stages" --time-limit "$limit" --out "$out/plan.json" \
      >"$out/stdout" 2>"$out/stderr" || { cat "$out/stderr" >&2; echo "| $count | $limit | failed |"; continue; }
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, t, ":"); s = 0;
      for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s }' "$out/time")
    rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$out/time")
    load=$(sed -n 's/.*loaded and typed in \([0-9.]*\) s.*/\1/p' "$out/stdout")
    solve=$(sed -n 's/.*solved in \([0-9.]*\) s.*/\1/p' "$out/stdout")
    status=$(sed -n 's/^bottleneck [^:]*: //p' "$out/stdout" | head -1)
    over=$(awk -v w="$wall" -v lim="$(secs "$limit")" 'BEGIN { printf "%+.1f%%", (w / lim - 1) * 100 }')
    echo "| $count | $limit | $wall | ${load:-?} | ${solve:-?} | $over | $rss | $busy | ${status:-?} |"
  done
done
