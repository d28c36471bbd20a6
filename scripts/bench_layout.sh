#!/bin/bash
# Streaming on the official byte layout against the contiguous one (issue 50), in the same
# window: the same synthetic checkpoint written both ways (`dsv4 synth --layout`), runs
# interleaved official / contiguous, medians and official/contiguous ratios of TTFT, decode
# s/token, bytes read per token, and ranges and read requests per expert.
# Usage: scripts/bench_layout.sh OFFICIAL_DIR CONTIGUOUS_DIR [bench flags...]
#   e.g. scripts/bench_layout.sh scratch/f2-off scratch/f2-con --ram 2.98G --prompt-tokens 32 --gen-tokens 16
# The checkpoints are made if missing (LAYERS, default 2, V4 Flash geometry). RUNS pairs (default 3),
# after one uncounted pair: the first read of a checkpoint after a while runs several times
# slower on these hosts (their own cache), whichever layout it is. The order flips every pair.
set -eu
OFF=$1 CON=$2
shift 2
B=${DSV4:-build/release/dsv4}
RUNS=${RUNS:-3}
LAYERS=${LAYERS:-2}
[[ -d "$OFF" ]] || "$B" synth --out "$OFF" --layers "$LAYERS" --quiet
[[ -d "$CON" ]] || "$B" synth --out "$CON" --layers "$LAYERS" --layout contiguous --quiet
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for r in $(seq 0 "$RUNS"); do
  if (( r % 2 )); then
    "$B" bench -m "$CON" "$@" --json > "$T/contiguous-$r.json" 2>/dev/null
    "$B" bench -m "$OFF" "$@" --json > "$T/official-$r.json" 2>/dev/null
  else
    "$B" bench -m "$OFF" "$@" --json > "$T/official-$r.json" 2>/dev/null
    "$B" bench -m "$CON" "$@" --json > "$T/contiguous-$r.json" 2>/dev/null
  fi
done
/usr/bin/python3 - "$T" "$RUNS" <<'PY'
import json, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def load(layout):
    return [json.load(open(f"{d}/{layout}-{r}.json")) for r in range(1, runs + 1)]
fields = [("TTFT s", lambda j: j["ttft_s"]),
          ("decode s/token", lambda j: j["details"]["decode_s_per_token_median"]),
          ("MB read/token", lambda j: j["bytes_read_per_token"] / 1e6),
          ("prefill GB read", lambda j: j["details"]["prefill_stats"]["bytes_read"] / 1e9),
          ("ranges/expert", lambda j: j["details"]["ranges_per_expert"]),
          ("requests/expert", lambda j: j["details"]["read_requests_per_expert"]),
          ("prefill req/expert", lambda j: j["details"]["prefill_requests_per_expert"]),
          ("merged/expert", lambda j: j["details"]["merged_windows_per_expert"]),
          ("prefill merged/exp", lambda j: j["details"]["prefill_merged_windows_per_expert"]),
          ("SSD GB/s", lambda j: j["ssd_gbps_measured"])]
off, con = load("official"), load("contiguous")
print("plan:", off[0]["details"]["plan"])
print("layouts:", off[0]["details"]["tensor_order"], "/", con[0]["details"]["tensor_order"])
print(f"{'':18} {'official (runs)':>34} {'contiguous (runs)':>34} {'median ratio':>12}")
for name, get in fields:
    a, b = [get(j) for j in off], [get(j) for j in con]
    ma, mb = statistics.median(a), statistics.median(b)
    runs_a = ", ".join(f"{v:.3g}" for v in a)
    runs_b = ", ".join(f"{v:.3g}" for v in b)
    ratio = f"{ma / mb:.3f}" if mb else "-"
    print(f"{name:18} {ma:9.4g} ({runs_a:>22}) {mb:9.4g} ({runs_b:>22}) {ratio:>12}")
PY
