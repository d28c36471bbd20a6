#!/usr/bin/env bash
# Sets everything up, builds dsv4 and runs the main job. With no model directory it uses
# a small checkpoint in the official format.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build/release dsv4 >&2
model=${1:-../shared/fixtures/tiny-a}
exec build/release/dsv4 inspect "$model"
