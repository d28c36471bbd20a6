#!/usr/bin/env bash
# Measures a trained demo model for docs/demo-model.md: held-out bits per byte (quantized and
# float) against xz -9, the MTP head's next-next-token agreement, the routing through the
# engine's own expert trace, and sample outputs.
#   tools/demo_model/measure.sh MODEL_DIR DATA_DIR [STATE_PT] OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$1 data=$2 state=${3:-} out=${4:-scratch/demo_measure}
dsv4=build/release/dsv4
py=/usr/bin/python3
export OMP_WAIT_POLICY=PASSIVE  # a shared machine: spinning OpenMP threads stall each other
mkdir -p "$out"

$py tools/demo_model/evaluate.py --model "$model" --data "$data" ${state:+--state "$state"} --json "$out/eval.json" \
  ${DEMO_EVAL_CHAPTERS:+--chapters $DEMO_EVAL_CHAPTERS}

# Routing on held-out text: every token its own forward pass (--chunk 1), requests recorded.
$py -c "import json,sys; print(''.join(json.load(open(sys.argv[1]))['text'][:8]))" "$data/heldout.json" |
  $dsv4 tokenize -t "$model/tokenizer.json" > "$out/heldout_ids.txt"
$dsv4 bench -m "$model" --ram 4G --prompt-file "$out/heldout_ids.txt" --chunk 1 --gen-tokens 1 \
  --ssd-probe-bytes 4194304 --trace-out "$out/trace.txt" --json > "$out/bench.json"
$py tools/demo_model/routing_stats.py --trace "$out/trace.txt" --config "$model/config.json" \
  --json "$out/routing.json" | tee "$out/routing.txt"

# Samples: chat and raw continuation, the model's default sampling, fixed seeds; and greedy.
{
  for prompt in "Tell me about the lighthouse keeper and his cat." "Who was Moses?" "What is love?"; do
    for seed in 1 2; do
      echo "### dsv4 run --seed $seed \"$prompt\""
      DSV4_MODEL="$model" $dsv4 run --max-tokens 64 --seed $seed "$prompt" 2>/dev/null
      echo
    done
  done
  echo "### dsv4 run --temperature 0 \"Tell me about the lighthouse keeper and his cat.\""
  DSV4_MODEL="$model" $dsv4 run --max-tokens 64 --temperature 0 "Tell me about the lighthouse keeper and his cat." 2>/dev/null
  echo
  for prompt in "And it came to pass" "In the beginning" "Once"; do
    echo "### dsv4 run --raw --seed 1 \"$prompt\""
    DSV4_MODEL="$model" $dsv4 run --raw --max-tokens 64 --seed 1 "$prompt" 2>/dev/null
    echo
  done
} > "$out/samples.md"
cat "$out/samples.md"
