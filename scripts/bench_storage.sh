#!/bin/bash
# The storage benchmarks of issue 19 for docs/benchmarks.md, in one quiet window (~11 min on the
# 2-vCPU VM with a V4-Flash-geometry 4-layer checkpoint):
#   1. two source folders, each limited to RATE MB/s by the fault layer's rate rule (each rule is
#      its own modelled device), against one: streamed decode, runs interleaved; the store's
#      achieved read rate and decode speed per run. RATE must stay well below the real disk's
#      speed (printed as `ssd` in every run), or the disk, not the folders, is the limit;
#   2. the hash-layer early reads, off / on, interleaved, on the real disk;
#   3. a short soak (decode speed, read rate and RSS per cycle).
# A trace replay (--trace-in) would give the read rate without compute, but its 19 replays take
# longer than the window at these rates.
# Usage: /work/bin/quiet scripts/bench_storage.sh CHECKPOINT MIRROR OUTDIR
# MIRROR: a folder of symlinks to CHECKPOINT's files (the rate rules tell the paths apart).
# PARTS: which of drives, early, soak to run (default all three). BEFORE: another dsv4 binary
# whose two-folder runs are interleaved with the others (two-before-N.txt), for a before/after.
set -u
M=$1 MIR=$2 O=$3
B=${DSV4:-build/release/dsv4}
RATE=${RATE:-100}
RAM=${RAM:-4.8G}
RUNS=${RUNS:-3}
SOAK=${SOAK:-2}
PARTS=${PARTS:-drives early soak}
BEFORE=${BEFORE:-}
mkdir -p "$O"
F1="rate:path=$M/:mbps=$RATE"
F2="rate:path=$MIR/:mbps=$RATE"
P="--ssd-probe-bytes 256M"
part() { [[ " $PARTS " == *" $1 "* ]]; }
date -u; uptime
part drives && for r in $(seq "$RUNS"); do
  DSV4_TEST_IO_FAULTS="$F1" $B bench -m "$M" --ram $RAM $P --prompt-tokens 1 --gen-tokens 8 > "$O/one-$r.txt" 2>&1
  DSV4_TEST_IO_FAULTS="$F1;$F2" $B bench -m "$M" --mirror "$MIR" --ram $RAM $P --prompt-tokens 1 --gen-tokens 8 > "$O/two-$r.txt" 2>&1
  if [[ -n "$BEFORE" ]]; then
    DSV4_TEST_IO_FAULTS="$F1;$F2" $BEFORE bench -m "$M" --mirror "$MIR" --ram $RAM $P --prompt-tokens 1 --gen-tokens 8 \
      > "$O/two-before-$r.txt" 2>&1
  fi
done
date -u; uptime
part early && for r in $(seq "$RUNS"); do
  $B bench -m "$M" --ram $RAM $P --prompt-tokens 8 --gen-tokens 12 --no-early-hash-reads > "$O/late-$r.txt" 2>&1
  $B bench -m "$M" --ram $RAM $P --prompt-tokens 8 --gen-tokens 12 > "$O/early-$r.txt" 2>&1
done
date -u; uptime
part soak && $B bench -m "$M" --ram $RAM $P --prompt-tokens 8 --gen-tokens 8 --soak "$SOAK" > "$O/soak.txt" 2>&1
date -u; uptime
