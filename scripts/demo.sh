#!/usr/bin/env bash
# Sets everything up, builds dsv4 and runs the main job: one streamed answer from
#   scripts/demo.sh [MODEL_DIR] [PROMPT]
# With no model directory it uses the built-in demo model (models/demo: a tiny DeepSeek V4
# trained on the King James Bible), so it works on a fresh machine without the 160 GB download.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build/release dsv4 >&2
model=()
if [[ $# -ge 1 && -n "$1" ]]; then model=(-m "$1"); fi
prompt=${2:-"Tell me about the lighthouse keeper and his cat."}
exec build/release/dsv4 run "${model[@]}" --max-tokens 64 "$prompt"
